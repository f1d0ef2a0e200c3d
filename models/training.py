"""Train a small decoder on our multi-head attention and record how its heads form.

Two tasks:

- ``"induction"``: sequences of random tokens, written ``t0`` ... ``t{V-1}``, in which a segment
  appears twice, each copy at a random offset. Predicting the second copy needs an induction
  head (attend to the token after the earlier occurrence of the current token), which forms
  with a previous-token head in the layer below (Olsson et al. 2022). A fixed offset would let a
  head solve the task by position alone, so the offsets are drawn for every sequence.
- ``"text"``: a word-level language model on the built-in corpus or a given text, where
  previous-token and positional heads form.

Every ``log_every`` steps each head is scored on held-out sequences: ``prev_token`` (mean
weight on the previous token) and ``induction`` (on repeated sequences: mean weight from a token
of the second copy on the token after its earlier occurrence, the prefix-matching score).
"""
from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from .decoder import Decoder, DecoderConfig
from .errors import HeadLensError
from .vocab import PAD, UNK, token_tokenizer, word_tokenizer

TASKS = ("induction", "text")
LIMITS = {"n_layers": 4, "n_heads": 8, "d_model": 256, "steps": 20_000, "seq_len": 128, "vocab_size": 4096,
          "batch_size": 256}
CORPUS_FILE = Path(__file__).resolve().parents[1] / "assets" / "corpus.txt"


@dataclass(frozen=True)
class TrainConfig:
    task: str = "induction"
    n_layers: int = 2
    n_heads: int = 2
    d_model: int = 64
    seq_len: int = 32
    vocab_size: int = 64
    attention_only: bool = True
    steps: int = 3000
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    log_every: int = 50

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


@dataclass
class TrainRun:
    """A training's result: the model, one history row per logged step and head, and attention snapshots."""

    config: TrainConfig
    model: "object"                                  # a DecoderModel: attend, embed, pruned, save
    history: pd.DataFrame
    snapshots: list = field(default_factory=list)    # (step, (layers, heads, L, L) weights on the probe)
    probe: list[str] = field(default_factory=list)   # the probe sequence's tokens
    seconds: float = 0.0
    stopped: bool = False                            # stopped before the last step

    def step_reaching(self, score: float = 0.4) -> int | None:
        """The first logged step at which some head's induction score reaches ``score``."""
        best = self.history.groupby("step")["induction"].max()
        reached = best[best >= score]
        return None if reached.empty else int(reached.index[0])


# --- data ---------------------------------------------------------------------------------------------

def induction_batch(gen: torch.Generator, batch: int, seq_len: int, vocab: int):
    """Random tokens with a segment repeated at random offsets: ``(tokens, first, second, length)``,
    ``tokens`` ``(batch, seq_len)`` and per sequence the start of each copy and the segment length."""
    n = max(2, seq_len // 3)
    tokens = torch.randint(vocab, (batch, seq_len), generator=gen)
    first = (torch.rand(batch, generator=gen) * (seq_len - 2 * n + 1)).long()                 # [0, L - 2n]
    room = seq_len - n - (first + n) + 1                                                      # starts after the first copy
    second = first + n + (torch.rand(batch, generator=gen) * room).long()
    index = torch.arange(n)
    rows = torch.arange(batch).view(-1, 1)
    tokens[rows, second.view(-1, 1) + index] = tokens[rows, first.view(-1, 1) + index]
    return tokens, first, second, n


def repeated_batch(gen: torch.Generator, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Held-out sequences for the induction score: a random half, then the same half again."""
    half = seq_len // 2
    x = torch.randint(vocab, (batch, half), generator=gen)
    return torch.cat([x, x], dim=1)


def text_stream(text: str, tokenizer) -> torch.Tensor:
    ids = tokenizer(text.replace("\n", " "), add_special_tokens=False)["input_ids"]
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
    from collections import Counter

    from tokenizers import pre_tokenizers

    split = pre_tokenizers.Whitespace()
    counts = Counter(w for w, _ in split.pre_tokenize_str(text.lower()))
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: max(1, vocab_size - 2)]]
    return word_tokenizer(words, lowercase=True, max_len=max_len)


# --- scores -------------------------------------------------------------------------------------------

def head_scores(attentions: torch.Tensor, half: int | None) -> dict[str, np.ndarray]:
    """``prev_token`` and ``induction`` per ``(layer, head)`` from weights ``(B, layers, heads, L, L)``.

    ``half``: the length of the repeated half for the induction score (its sequences are a half
    and the same half again); None scores only ``prev_token``.
    """
    L = attentions.shape[-1]
    q = torch.arange(1, L)
    prev = attentions[..., q, q - 1].mean(dim=(0, -1))
    out = {"prev_token": prev.cpu().numpy()}
    if half is not None:
        q = torch.arange(half, 2 * half)
        out["induction"] = attentions[..., q, q - half + 1].mean(dim=(0, -1)).cpu().numpy()
    return out


# --- training -----------------------------------------------------------------------------------------

def train(config: TrainConfig, *, device: str = "auto", text: str | None = None,
          on_step: Callable[[int, pd.DataFrame, "TrainRun"], None] | None = None,
          should_stop: Callable[[], bool] | None = None, max_seconds: float | None = None,
          snapshot_every: int | None = None) -> TrainRun:
    """Train a decoder on ``config.task`` and return the run.

    Args:
        device: "auto" (CUDA when there is one), "cpu", "cuda".
        text: the text for the "text" task (default: the built-in corpus).
        on_step: called after each logged step with the step, the history so far and the run
            (whose ``model`` holds the weights of that moment; read it, do not change it).
        should_stop: asked after every step; True ends the training there.
        max_seconds: a time budget; the run stops when it is spent.
        snapshot_every: keep the attention on the probe sequence every this many steps
            (default: every logged step).
    """
    from .loading import DecoderModel, pick_device

    config = config.check()
    dev = pick_device(device)
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    held_out = torch.Generator().manual_seed(config.seed + 10_000)
    if config.task == "induction":
        tokenizer = induction_tokenizer(config.vocab_size, config.seq_len)
        eval_ids = repeated_batch(held_out, 64, config.seq_len, config.vocab_size).to(dev)
        half = config.seq_len // 2
        stream = None
    else:
        source = text if text is not None else CORPUS_FILE.read_text(encoding="utf-8")
        tokenizer = text_tokenizer(source, config.vocab_size, config.seq_len)
        stream = text_stream(source, tokenizer)
        eval_ids = text_batch(held_out, stream, 64, config.seq_len).to(dev)
        half = None
    vocab = len(tokenizer)
    dconf = DecoderConfig(vocab_size=vocab, n_layers=config.n_layers, n_heads=config.n_heads,
                          d_model=config.d_model, max_len=config.seq_len, attention_only=config.attention_only,
                          d_mlp=4 * config.d_model)
    net = Decoder.untrained(dconf, config.seed).to(dev).train()
    model = DecoderModel(net, tokenizer, f"Trained decoder ({config.task}, seed {config.seed})", dev)
    probe_ids = eval_ids[:1]
    probe = tokenizer.convert_ids_to_tokens(probe_ids[0].tolist())
    optimiser = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=0.0)
    rows: list[dict] = []
    run = TrainRun(config, model, pd.DataFrame(rows), probe=probe)
    snapshot_every = snapshot_every or config.log_every
    start = time.perf_counter()
    losses = []

    def log(step: int) -> None:
        net.eval()
        with torch.inference_mode():
            att = net(eval_ids, need_weights=True).attentions
        net.train()
        weights = torch.stack(att, dim=1)                                         # (B, layers, heads, L, L)
        scores = head_scores(weights, half)
        loss = float(np.mean(losses[-config.log_every:])) if losses else float("nan")
        for l in range(config.n_layers):
            for h in range(config.n_heads):
                rows.append({"step": step, "layer": l, "head": h, "loss": loss,
                             "prev_token": float(scores["prev_token"][l, h]),
                             "induction": float(scores["induction"][l, h]) if half else float("nan")})
        if step % snapshot_every == 0 or step == config.steps:
            run.snapshots.append((step, weights[0].float().cpu().numpy()))
        run.history = pd.DataFrame(rows)
        run.seconds = time.perf_counter() - start
        if on_step is not None:
            on_step(step, run.history, run)

    log(0)
    step = 0
    for step in range(1, config.steps + 1):
        if config.task == "induction":
            ids = induction_batch(gen, config.batch_size, config.seq_len, config.vocab_size)[0].to(dev)
        else:
            ids = text_batch(gen, stream, config.batch_size, config.seq_len).to(dev)
        logits = net(ids[:, :-1], need_weights=False).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        stop = (should_stop is not None and should_stop()) or (
            max_seconds is not None and time.perf_counter() - start > max_seconds)
        if step % config.log_every == 0 or step == config.steps or stop:
            log(step)
        if stop:
            run.stopped = step < config.steps
            break
    net.eval()
    run.seconds = time.perf_counter() - start
    return run


__all__ = ["TASKS", "LIMITS", "TrainConfig", "TrainRun", "train", "head_scores", "induction_batch"]
