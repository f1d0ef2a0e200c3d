"""One head on one card: what HeadLens measures of it anywhere, read from the functions that measure it.

A card (``HeadCard``) is assembled from ``CardParts``: the results the pages compute for every head at once
(the corpus's attention and its Head roles frame, the decoder head detector, the OV copying scores, each
built-in pair's attribution and patching, a task's table, the heads' importance, the queries-and-keys
picture). ``card_parts`` computes them in plain Python; the app hands the card the same values its pages
share, so a card's number is the number on the page that goes deeper.

Two measures are the card's own, read from what the parts hold:

- **peaks** (``corpus_peaks``): in each corpus sentence, the query where a head's attention is most
  concentrated on one key other than the set-aside ones (special tokens, a decoder's sink), and that weight:
  the head's strongest examples, as Neuronpedia shows a feature's most activating contexts;
- **writes** (``corpus_writes``, a decoder): the largest norm of what the head writes into the residual stream
  at any query of each sentence (its ``z`` through its slice of the output projection).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from models import DETECTOR, AttentionModel, head_label
from models.run import language_stack, trace_batch
from models.limits import batches
from models.result import Attention

from ..effects import parts as P
from ..explanations import held_out_of, misses
from ..roles.rules import rule_named
from ..attention.views import set_aside, token_label

TOP = 10  # examples a card shows
SNIPPET = 6  # tokens of context shown on each side of the query and the key


@dataclass(frozen=True)
class Peaks:
    """Per sentence and head ``(sentences, layers, heads)``: the largest weight a query puts on one key other than
    the set-aside tokens (``weight``), at which query and key. NaN where a sentence has no such query."""

    weight: np.ndarray
    query: np.ndarray
    key: np.ndarray


def corpus_peaks(attentions: Sequence[Attention]) -> Peaks:
    """Every head's most concentrated query in each sentence, read from the sentences' attention."""
    L, H = attentions[0].weights.shape[:2]
    weight = np.full((len(attentions), L, H), np.nan)
    query = np.zeros((len(attentions), L, H), dtype=np.int64)
    key = np.zeros_like(query)
    for s, att in enumerate(attentions):
        aside = set_aside(att)
        seen = np.cumsum(~aside) if att.causal else np.full(len(aside), int((~aside).sum()))
        trivial = aside | (seen < 2)                                        # a query with one key to choose from
        w = np.where(aside[None, None, None, :], -1.0, att.weights)       # the sink and special tokens as keys
        w = np.where(trivial[None, None, :, None], -1.0, w)                 # and as queries
        best_key = w.argmax(-1)                                             # (L, H, n)
        best = np.take_along_axis(w, best_key[..., None], -1)[..., 0]
        q = best.argmax(-1)                                                 # (L, H)
        top = np.take_along_axis(best, q[..., None], -1)[..., 0]
        weight[s] = np.where(top >= 0, top, np.nan)
        query[s], key[s] = q, np.take_along_axis(best_key, q[..., None], -1)[..., 0]
    return Peaks(weight, query, key)


def snippet(att: Attention, query: int, key: int | None, width: int = SNIPPET) -> str:
    """The sentence around ``query`` and ``key`` as it is written (each token's own characters, a space where the
    text has one), the query in «guillemets» and the key in [brackets] (both on a query that attends to itself);
    special tokens by their names."""
    marked = [query] if key is None else [query, key]
    lo, hi = max(0, min(marked) - width), min(len(att.tokens), max(marked) + width + 1)
    out, end = [], None  # end: where the last token's characters stopped in the text
    for i in range(lo, hi):
        start, stop = att.offsets[i]
        if att.special[i] or stop <= start:
            piece, gap, end = token_label(att.tokens[i]), True, None
        else:
            own = att.text[start:stop].strip()
            start = start if end is None else max(start, end)  # a character split over two tokens is shown once
            piece = att.text[start:stop]
            gap = end is None or start > end or piece[:1].isspace()
            piece, end = piece.strip() or (own if i in marked else ""), stop
        if not piece and i not in marked:
            continue
        piece = piece or token_label(att.tokens[i])
        piece = f"[{piece}]" if i == key else piece
        piece = f"«{piece}»" if i == query else piece
        out.append((" " if out and gap else "") + piece)
    return ("… " if lo else "") + "".join(out) + (" …" if hi < len(att.tokens) else "")


def top_examples(peaks: Peaks, attentions: Sequence[Attention], layer: int, head: int, k: int = TOP) -> pd.DataFrame:
    """The ``k`` sentences where ``(layer, head)`` is most concentrated: ``sentence`` (its index), ``text``,
    ``query`` and ``key`` (token positions), their tokens, ``weight``, and a ``snippet`` with both marked."""
    values = peaks.weight[:, layer, head]
    order = [int(i) for i in np.argsort(-np.nan_to_num(values, nan=-1.0), kind="stable")[:k] if not np.isnan(values[i])]
    rows = []
    for s in order:
        att, q, key = attentions[s], int(peaks.query[s, layer, head]), int(peaks.key[s, layer, head])
        rows.append({"sentence": s, "text": att.text, "query": q, "key": key, "query_token": token_label(att.tokens[q]),
                     "key_token": token_label(att.tokens[key]), "distance": q - key, "weight": float(values[s]),
                     "snippet": snippet(att, q, key)})
    return pd.DataFrame(rows, columns=["sentence", "text", "query", "key", "query_token", "key_token", "distance",
                                       "weight", "snippet"])


@dataclass(frozen=True)
class Writes:
    """Per sentence and head ``(sentences, layers, heads)``: the largest norm a head writes at any query
    (``norm``) and where (``query``)."""

    norm: np.ndarray
    query: np.ndarray


@torch.inference_mode()
def corpus_writes(model: AttentionModel, sentences: Sequence[str], *, batch_size: int = 32, progress=None) -> Writes:
    """How strongly each head writes into the residual stream in each sentence: its result's norm at every
    query (``effects.parts.result_norms``), the largest kept. A decoder's prompts share a batch of similar
    lengths (``models.limits.batches``), right-padded: a query never sees the padding after it."""
    stack = language_stack(model)
    L, H = model.n_layers, model.n_heads
    norm, query = np.zeros((len(sentences), L, H)), np.zeros((len(sentences), L, H), dtype=np.int64)
    pad = model.tokenizer.pad_token_id or 0
    rows = [model.tokenizer(t)["input_ids"][:model.max_tokens] for t in sentences]
    done = 0
    for group in batches([len(r) for r in rows], batch_size, model.bytes_per_token_pair):
        n = max(len(rows[i]) for i in group)
        ids = torch.tensor([rows[i] + [pad] * (n - len(rows[i])) for i in group])
        norms = P.result_norms(stack, trace_batch(model, ids)).float().cpu().numpy()   # (B, L, H, n)
        for b, i in enumerate(group):
            mine = norms[b, ..., :len(rows[i])]
            query[i] = mine.argmax(-1)
            norm[i] = mine.max(-1)
        done += len(group)
        if progress is not None:
            progress(done, len(sentences))
    return Writes(norm, query)


def top_writes(writes: Writes, attentions: Sequence[Attention], layer: int, head: int, k: int = TOP) -> pd.DataFrame:
    """The ``k`` sentences where ``(layer, head)`` writes most: ``sentence``, ``text``, ``query``, its ``token``,
    ``norm`` and a ``snippet`` with the query marked."""
    values = writes.norm[:, layer, head]
    rows = []
    for s in np.argsort(-values, kind="stable")[:k]:
        att, q = attentions[s], int(writes.query[s, layer, head])
        rows.append({"sentence": int(s), "text": att.text, "query": q, "token": token_label(att.tokens[q]),
                     "norm": float(values[s]), "snippet": snippet(att, q, None)})
    return pd.DataFrame(rows, columns=["sentence", "text", "query", "token", "norm", "snippet"])


@dataclass
class CardParts:
    """What a card reads, each computed for every head by the function its own page uses; None where the model
    has no such measure (an encoder has no detector, copying, pairs or task) or it was not asked for."""

    profile: pd.DataFrame                      # measure_heads(...).frame(): Head roles over the corpus
    attentions: list                           # the corpus's attention, the profile's and the peaks' source
    peaks: Peaks
    writes: Writes | None = None               # a decoder's
    detector: pd.DataFrame | None = None       # head_detector, labelled (Head roles, decoder section)
    detector_why: str = ""                     # why a model with a causal mask has no detector (its tokenizer)
    copying: pd.DataFrame | None = None        # copying_scores (Effects)
    pairs: dict = field(default_factory=dict)  # a built-in pair's name -> (logit_attribution, patch_heads) frames
    left_out: dict = field(default_factory=dict)  # a built-in pair the model cannot patch -> the sentence saying why
    task: pd.DataFrame | None = None           # task_effects.table of a task's heads (Effects over a task)
    task_name: str = ""
    importance: pd.DataFrame | None = None     # head_importance (Pruning)
    qk: dict | None = None                     # (layer, head) -> qk_embedding frame (Queries & keys)
    windows: tuple | None = None               # each layer's sliding window, None for a global layer
    offers: frozenset = frozenset()            # ``models.offers``: which parts apply (some may be missing while
                                               # prepared)
    explanations: pd.DataFrame | None = None   # explain_heads (each head's program, held out)


def _row(frame: pd.DataFrame | None, layer: int, head: int) -> pd.Series | None:
    if frame is None:
        return None
    found = frame[(frame["layer"] == layer) & (frame["head"] == head)]
    return None if found.empty else found.iloc[0]


def rank_of(frame: pd.DataFrame, column: str, layer: int, head: int, by_size: bool = False) -> int:
    """1 for the head with the largest ``column`` (by absolute value with ``by_size``) among the frame's heads."""
    values = frame[column].abs() if by_size else frame[column]
    mine = float(values[(frame["layer"] == layer) & (frame["head"] == head)].iloc[0])
    return int((values > mine).sum()) + 1


# the detector's roles a repeat shows: each token of the second copy attends to what followed it in the first
# (induction), or to itself there (duplicate token)
REPEATED = {"induction": ("An induction head", "the token that followed it in the first"),
            "duplicate token": ("A duplicate-token head", "itself in the first")}


def detector_label(detector: pd.DataFrame | None, layer: int, head: int) -> str | None:
    """The head detector's label of ``(layer, head)`` in its frame (a decoder's), or None."""
    row = _row(detector, layer, head)
    return None if row is None else str(row["label"])


def repeat_showcase(role: str | None, sentence: str) -> tuple[str, str] | None:
    """``sentence`` twice, and why, for a head whose detector label (``role``) says its habit needs a repeat (an
    induction or duplicate-token head); None for any other."""
    if role not in REPEATED:
        return None
    who, where = REPEATED[role]
    return f"{sentence} {sentence}", (f"Your sentence twice. {who} shows its habit on a repeat: each token of the "
                                      f"second copy attends to {where}; the sentence once repeats nothing.")


@dataclass
class HeadCard:
    """Everything HeadLens measures of one head (``head_card``); frames and series, for a page or a notebook."""

    model: str
    layer: int
    head: int
    offers: frozenset                  # what the model offers (``models.offers``): which sections apply
    role: str                          # the Head roles label (a decoder's detector label in ``detector_role``)
    measures: pd.Series                # the head's row of the Head roles frame
    detector: pd.Series | None
    detector_role: str | None
    window: int | None
    top: pd.DataFrame                  # top_examples
    writes: pd.DataFrame | None        # top_writes
    copying: pd.Series | None          # copying and suppression scores, with their ranks
    pairs: pd.DataFrame | None         # per built-in pair: attribution, its rank; recovered, its rank
    task: pd.Series | None             # the task's mean effect with its interval, p and q
    task_name: str
    importance: pd.Series | None       # importance and rank
    qk: pd.DataFrame | None
    like: pd.DataFrame | None = None   # heads like it (``analysis.cards.atlas.heads_like``)
    explanation: pd.Series | None = None  # its rule and the rule's held-out score (``analysis.explanations``)
    left_out: dict = field(default_factory=dict)  # built-in pairs left out, each with why (``CardParts.left_out``)
    misses: pd.DataFrame | None = None    # the held-out queries where that rule fails most
    detector_why: str = ""                # why it has no detector where its model's causal mask offers one

    @property
    def name(self) -> str:
        return head_label(self.layer, self.head)

    def showcase(self, sentence: str) -> tuple[str, str] | None:
        """A text that shows what a decoder's head does, and a sentence saying why it was chosen: ``sentence`` twice
        for an induction or duplicate-token head (its habit needs a repeat: the founding sentence repeats nothing),
        else the built-in sentence where it is most concentrated (``top``'s first); None for an encoder's head, whose
        seed foci show on any sentence, or a head with no example."""
        if DETECTOR not in self.offers:
            return None
        if self.detector_role in REPEATED:
            return repeat_showcase(self.detector_role, sentence)
        if self.top.empty:
            return None
        t = self.top.iloc[0]
        return str(t["text"]), (f"The built-in sentence where it is most concentrated: “{t['query_token']}” → "
                                f"“{t['key_token']}”, {t['weight']:.0%} of that query's weight.")

    def summary(self) -> str:
        """The card in two or three sentences."""
        m = self.measures
        role = self.detector_role if self.detector_role not in (None, "other") else self.role
        said = [f"{self.name} of {self.model}: {role}; entropy {m['entropy']:.2f} nats, mean distance "
                f"{m['distance']:.1f} tokens, {m['cls']:.0%} of its weight on the first token"]
        if self.explanation is not None:
            e = self.explanation
            said.append(f"{e['sentence']} ({e['score']:.2f} [{e['lo']:.2f}, {e['hi']:.2f}] of its attention on "
                        "held-out text)")
        if not self.top.empty:
            t = self.top.iloc[0]
            said.append(f"strongest on “{t['query_token']}” → “{t['key_token']}” ({t['weight']:.2f})")
        if self.pairs is not None and not self.pairs.empty:
            best = self.pairs.loc[self.pairs["recovered"].abs().idxmax()]
            said.append(f"patching it recovers {best['recovered']:+.2f} of {best['pair']}")
        if self.task is not None:
            t = self.task
            said.append(f"{self.task_name}: {t['mean']:+.2f} [{t['low']:.2f}, {t['high']:.2f}] over {t['pairs']} pairs")
        if self.importance is not None:
            said.append(f"importance rank {int(self.importance['rank'])} of {int(self.importance['of'])}")
        return "; ".join(said) + "."


def card_from(parts: CardParts, model: str, layer: int, head: int, k: int = TOP) -> HeadCard:
    """``(layer, head)``'s card, every figure read from ``parts``."""
    measures = _row(parts.profile, layer, head)
    detector = _row(parts.detector, layer, head)
    copying = _row(parts.copying, layer, head)
    if copying is not None:
        copying = copying.copy()
        for column in ("copying", "suppression"):
            copying[f"{column}_rank"] = rank_of(parts.copying, column, layer, head)
        copying["of"] = len(parts.copying)
    pairs = None
    if parts.pairs:
        rows = []
        for name, (attribution, patched) in parts.pairs.items():
            a, p = _row(attribution, layer, head), _row(patched, layer, head)  # no attribution: not linear
            rows.append({"pair": name, "attribution": np.nan if a is None else float(a["attribution"]),
                         "attribution_rank": None if a is None else rank_of(attribution, "attribution", layer, head,
                                                                            by_size=True),
                         "recovered": float(p["recovered"]),
                         "recovered_rank": rank_of(patched, "recovered", layer, head, by_size=True)})
        pairs = pd.DataFrame(rows)
    task = _row(parts.task, layer, head)
    if task is not None:
        task = task.copy()
        task["rank"], task["pairs"] = rank_of(parts.task, "mean", layer, head, by_size=True), parts.task.attrs.get("pairs")
    importance = _row(parts.importance, layer, head)
    if importance is not None:
        importance = importance.copy()
        importance["rank"], importance["of"] = rank_of(parts.importance, "importance", layer, head), len(parts.importance)
    window = parts.windows[layer] if parts.windows else None
    return HeadCard(
        model=model, layer=layer, head=head, offers=parts.offers, role=str(measures["label"]),
        measures=measures, detector=detector, detector_role=None if detector is None else str(detector["label"]),
        detector_why=parts.detector_why,
        window=window, top=top_examples(parts.peaks, parts.attentions, layer, head, k),
        writes=None if parts.writes is None else top_writes(parts.writes, parts.attentions, layer, head, k),
        copying=copying, pairs=pairs, left_out=parts.left_out, task=task, task_name=parts.task_name, importance=importance,
        qk=None if parts.qk is None else parts.qk.get((layer, head)), **_explained(parts, layer, head))


def _explained(parts: CardParts, layer: int, head: int) -> dict:
    """The head's explanation and the held-out queries its rule misses, when ``parts`` has explanations."""
    row = _row(parts.explanations, layer, head)
    if row is None:
        return {}
    held = held_out_of(parts.attentions)
    missed = misses(held, rule_named(row["rule"]), layer, head)
    missed["snippet"] = [snippet(held[r.sentence], r.query, r.key) for r in missed.itertuples()]
    row = row.copy()
    row["held_out_texts"] = parts.explanations.attrs.get("held_out_texts", "text")  # what it was read on
    return {"explanation": row, "misses": missed}
