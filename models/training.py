"""Train a small decoder on our multi-head attention and record how its heads form.

Two tasks:

- ``"induction"``: sequences of random tokens, written ``t0`` ... ``t{V-1}``, in which a segment
  of 2 to ``seq_len // 2`` tokens is repeated back to back (two or more copies) at a random
  offset. Predicting the copies needs an induction head (attend to the token after the earlier
  occurrence of the current token), which forms with a previous-token head in the layer below
  (Olsson et al. 2022). The segment's length, and so the distance between the copies, is drawn for
  every sequence: at a fixed distance a head solves the task by position alone. Short segments
  matter too: with only long ones, two heads in the first layer can carry a pair of tokens a
  long way forward, and the second layer's heads match that pair instead of forming induction heads.
- ``"text"``: a word-level language model on the built-in corpus or a given text, where
  previous-token and positional heads form.

Every ``log_every`` steps each head is scored on held-out sequences made of a half and the same
half again (random tokens for "induction", a slice of the text for "text"): ``prev_token``
(mean weight on the previous token) and ``induction`` (the mean weight from a token of the second
half on the token after its earlier occurrence, the prefix-matching score).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from .corpus import corpus_text
from .errors import HeadLensError
from .files import pick_device
from .language import DecoderModel
from .stacks.decoder import Decoder, DecoderConfig
from .vocab import token_tokenizer, word_tokenizer

TASKS = ("induction", "text")
LIMITS = {"n_layers": 4, "n_heads": 8, "d_model": 256, "steps": 20_000, "seq_len": 128, "vocab_size": 4096,
          "batch_size": 256}


@dataclass(frozen=True)
class TrainConfig:
    task: str = "induction"
    n_layers: int = 2
    n_heads: int = 2
    d_model: int = 64
    seq_len: int = 32
    vocab_size: int = 64
    attention_only: bool = True
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    log_every: int = 20

    def check(self) -> "TrainConfig":
        if self.task not in TASKS:
            raise HeadLensError(f"Unknown task '{self.task}': choose {' or '.join(TASKS)}.")
        for name, top in LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise HeadLensError(f"{name} must be a whole number from 1 to {top:,}; it is {value!r}.")
        if self.d_model % self.n_heads:
            raise HeadLensError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads}).")
        if self.task == "induction" and (self.seq_len < 8 or self.vocab_size < 4):
            raise HeadLensError("The induction task needs sequences of at least 8 tokens and 4 token kinds.")
        if not 0 < self.lr < 1 or self.log_every < 1:
            raise HeadLensError("The learning rate must lie between 0 and 1, and log_every be at least 1.")
        return self


MAX_SNAPSHOTS = 200
SNAPSHOT_BYTES = 64 * 2**20  # all snapshots of a run together; the largest model keeps 32


@dataclass
class TrainRun:
    """A training's result: the model, one history row per logged step and head, and attention snapshots.

    While the training runs another thread may read it: ``history`` and ``snapshots`` are replaced
    or appended to whole, never changed in place.
    """

    config: TrainConfig
    model: "object"                                   # a DecoderModel: attend, embed, pruned, save
    probe: list[str] = field(default_factory=list)    # the probe sequence's tokens
    held_out: list[str] = field(default_factory=list)  # the scored sequences, as texts for ``model.attend``
    snapshots: list = field(default_factory=list)     # (step, (layers, heads, L, L) weights on the probe)
    device: str = "cpu"
    seconds: float = 0.0
    steps_done: int = 0
    stopped: bool = False                             # stopped before the last step
    rows: list = field(default_factory=list, repr=False)
    snapshot_every: int = 0                           # logged steps between snapshots; doubles as they thin
    _frame: tuple = field(default=(0, None), repr=False)

    @property
    def history(self) -> pd.DataFrame:
        """``step, layer, head, loss, prev_token, induction``, one row per logged step and head."""
        n, frame = self._frame
        rows = self.rows
        if frame is None or n != len(rows):
            frame = pd.DataFrame(rows[:len(rows)], columns=list(HISTORY_COLUMNS))
            self._frame = (len(frame), frame)
        return frame

    def step_reaching(self, score: float = 0.4) -> int | None:
        """The first logged step at which some head's induction score reaches ``score``."""
        best = self.history.groupby("step")["induction"].max()
        reached = best[best >= score]
        return None if reached.empty else int(reached.index[0])

    def initial_model(self) -> DecoderModel:
        """The model as it was at step 0: the same initialisation, drawn again from the seed."""
        net = self.model.decoder
        start = Decoder.untrained(net.config, self.config.seed).to(self.model.device).eval()
        return DecoderModel(start, self.model.tokenizer, f"{self.model.name} at step 0", self.model.device)

    def steps_per_second(self) -> float:
        return self.steps_done / self.seconds if self.seconds else float("nan")

    def record(self, step: int, weights: torch.Tensor, half: int, loss: float, seconds: float, last: bool) -> None:
        """A logged step: each head's scores from its weights on the held-out sequences
        ``(B, layers, heads, L, L)``, and the probe's weights as a snapshot when one is due.

        At most ``MAX_SNAPSHOTS`` snapshots are kept within ``SNAPSHOT_BYTES``: when there would be
        more, every other one is dropped and snapshots are kept half as often.
        """
        scores = head_scores(weights, half)
        layers, heads = scores["induction"].shape
        self.rows.extend({"step": step, "layer": l, "head": h, "loss": loss,
                          "prev_token": float(scores["prev_token"][l, h]), "induction": float(scores["induction"][l, h])}
                         for l in range(layers) for h in range(heads))
        self.snapshot_every = self.snapshot_every or self.config.log_every
        if step % self.snapshot_every == 0 or last:
            probe = weights[0].float().cpu().numpy()
            kept = self.snapshots + [(step, probe)]
            if len(kept) > max(2, min(MAX_SNAPSHOTS, SNAPSHOT_BYTES // probe.nbytes)):
                self.snapshot_every *= 2
                kept = [s for s in kept if s[0] % self.snapshot_every == 0 or s is kept[-1]]
            self.snapshots = kept
        self.steps_done, self.seconds = step, seconds


HISTORY_COLUMNS = ("step", "layer", "head", "loss", "prev_token", "induction")


# --- data ---------------------------------------------------------------------------------------------

def induction_batch(gen: torch.Generator, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """``(batch, seq_len)`` random tokens; in each row a segment of ``n`` tokens (2 to ``seq_len // 2``)
    is repeated back to back over ``m`` tokens (``2n`` to ``seq_len``, the last copy cut short), from a
    random offset."""
    tokens = torch.randint(vocab, (batch, seq_len), generator=gen)
    n = torch.randint(2, max(2, seq_len // 2) + 1, (batch,), generator=gen)
    m = 2 * n + (torch.rand(batch, generator=gen) * (seq_len - 2 * n + 1)).long()       # [2n, seq_len]
    start = (torch.rand(batch, generator=gen) * (seq_len - m + 1)).long()               # [0, seq_len - m]
    i = torch.arange(seq_len).view(1, -1)
    j = i - start.view(-1, 1)                                                            # index in the run
    inside = (j >= n.view(-1, 1)) & (j < m.view(-1, 1))                                  # a copy, not the first
    source = (start.view(-1, 1) + j % n.view(-1, 1)).clamp(max=seq_len - 1)
    return torch.where(inside, tokens.gather(1, source), tokens)


def repeated_batch(gen: torch.Generator, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Held-out sequences for the induction score: a random half, then the same half again."""
    half = seq_len // 2
    x = torch.randint(vocab, (batch, half), generator=gen)
    return torch.cat([x, x], dim=1)


def text_stream(text: str, tokenizer) -> torch.Tensor:
    ids = tokenizer(text.replace("\n", " "), add_special_tokens=False, verbose=False)["input_ids"]
    if len(ids) < 4:
        raise HeadLensError("The text is too short to train on: give a few sentences.")
    return torch.tensor(ids, dtype=torch.long)


def text_batch(gen: torch.Generator, stream: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    L = min(seq_len, len(stream))
    starts = torch.randint(len(stream) - L + 1, (batch,), generator=gen)
    return stream[starts.view(-1, 1) + torch.arange(L)]


# --- tokenizers ---------------------------------------------------------------------------------------

def induction_tokenizer(vocab_size: int, max_len: int):
    return token_tokenizer(vocab_size, max_len)


def text_tokenizer(text: str, vocab_size: int, max_len: int):
    """The ``vocab_size - 2`` most frequent words and punctuation marks of ``text`` (lowercased)."""
    from tokenizers import pre_tokenizers

    split = pre_tokenizers.Whitespace()
    counts = Counter(w for w, _ in split.pre_tokenize_str(text.lower()))
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: max(1, vocab_size - 2)]]
    return word_tokenizer(words, lowercase=True, max_len=max_len)


# --- scores -------------------------------------------------------------------------------------------

def head_scores(attentions: torch.Tensor, half: int) -> dict[str, np.ndarray]:
    """``prev_token`` and ``induction`` per ``(layer, head)`` from weights ``(..., layers, heads, L, L)``
    on sequences made of a half of ``half`` tokens and the same half again (averaged over the batch)."""
    L = attentions.shape[-1]
    q = torch.arange(1, L)
    prev = attentions[..., q, q - 1].mean(dim=-1)
    q = torch.arange(half, 2 * half)
    induction = attentions[..., q, q - half + 1].mean(dim=-1)
    batch = tuple(range(attentions.dim() - 4))
    return {"prev_token": prev.mean(dim=batch).cpu().numpy() if batch else prev.cpu().numpy(),
            "induction": induction.mean(dim=batch).cpu().numpy() if batch else induction.cpu().numpy()}


# --- tasks -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    """What a run trains and scores on: the tokenizer, a batch drawer, and held-out sequences made of
    a half of ``half`` tokens and the same half again."""

    tokenizer: object
    batch: Callable[[], torch.Tensor]                  # (batch_size, seq_len + 1) token ids
    held_out: torch.Tensor                             # (64, 2 * half)
    half: int


def make_task(config: TrainConfig, text: str | None) -> Task:
    """``config.task``'s data, drawn reproducibly from ``config.seed`` (held-out sequences from another stream)."""
    gen = torch.Generator().manual_seed(config.seed)
    held_out = torch.Generator().manual_seed(config.seed + 10_000)
    if config.task == "induction":
        eval_ids = repeated_batch(held_out, 64, config.seq_len, config.vocab_size)
        return Task(induction_tokenizer(config.vocab_size, config.seq_len),
                    lambda: induction_batch(gen, config.batch_size, config.seq_len + 1, config.vocab_size),
                    eval_ids, config.seq_len // 2)
    source = text if text is not None else corpus_text()
    tokenizer = text_tokenizer(source, config.vocab_size, config.seq_len)
    stream = text_stream(source, tokenizer)
    eval_ids = text_batch(held_out, stream, 64, config.seq_len // 2).repeat(1, 2)
    return Task(tokenizer, lambda: text_batch(gen, stream, config.batch_size, config.seq_len + 1),
                eval_ids, eval_ids.shape[1] // 2)


# --- training -----------------------------------------------------------------------------------------

def train(config: TrainConfig, *, device: str = "auto", text: str | None = None,
          on_step: Callable[[int, "TrainRun"], None] | None = None,
          should_stop: Callable[[], bool] | None = None, max_seconds: float | None = None) -> TrainRun:
    """Train a decoder on ``config.task`` and return the run.

    Args:
        device: "auto" (CUDA when there is one), "cpu", "cuda".
        text: the text for the "text" task (default: the built-in corpus).
        on_step: called after each logged step with the step and the run (whose ``model`` holds
            the weights of that moment; read it, do not change it).
        should_stop: asked after every step; True ends the training there.
        max_seconds: a time budget; the run stops when it is spent.
    """
    config = config.check()
    dev = pick_device(device)
    torch.manual_seed(config.seed)
    task = make_task(config, text)
    vocab = len(task.tokenizer)
    net = Decoder.untrained(DecoderConfig(vocab_size=vocab, n_layers=config.n_layers, n_heads=config.n_heads,
                                          d_model=config.d_model, max_len=config.seq_len,
                                          attention_only=config.attention_only, d_mlp=4 * config.d_model),
                            config.seed).to(dev).train()
    name = f"Trained decoder ({config.task}, {config.n_layers}x{config.n_heads}, seed {config.seed})"
    texts = [" ".join(task.tokenizer.convert_ids_to_tokens(row)) for row in task.held_out.tolist()]
    run = TrainRun(config, DecoderModel(net, task.tokenizer, name, dev), probe=texts[0].split(" "), held_out=texts,
                   device=dev.type)
    held_out = task.held_out.to(dev)
    optimiser = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=0.0)
    losses: list[float] = []
    start = time.perf_counter()
    run.record(0, attention_on(net, held_out), task.half, float("nan"), 0.0, last=False)
    if on_step is not None:
        on_step(0, run)
    for step in range(1, config.steps + 1):
        ids = task.batch().to(dev)
        logits = net(ids[:, :-1], need_weights=False).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())

        stop = (should_stop is not None and should_stop()) or (
            max_seconds is not None and time.perf_counter() - start > max_seconds)
        last = stop or step == config.steps
        if step % config.log_every == 0 or last:
            run.record(step, attention_on(net, held_out), task.half, float(np.mean(losses[-config.log_every:])),
                       time.perf_counter() - start, last)
            if on_step is not None:
                on_step(step, run)
        if stop:
            run.stopped = step < config.steps
            break
    net.eval()
    run.seconds = time.perf_counter() - start
    return run


def attention_on(net: Decoder, ids: torch.Tensor) -> torch.Tensor:
    """Every head's weights on ``ids``, ``(B, layers, heads, L, L)``, the network left in training mode."""
    net.eval()
    with torch.inference_mode():
        weights = torch.stack(net(ids, need_weights=True).attentions, dim=1)
    net.train()
    return weights


__all__ = ["TASKS", "LIMITS", "TrainConfig", "TrainRun", "train", "head_scores", "induction_batch", "repeated_batch"]
