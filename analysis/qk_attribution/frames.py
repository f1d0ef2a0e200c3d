"""Why a head attends where it does: its score from a query to a key split exactly over (query-side writer,
key-side writer) pairs (``split``), on one prompt or averaged over a task's pairs.

    split = qk_attribution(model, "When Mary and John went to the store, John gave a drink to", 23, 3)
    split.pairs().head()        # the writer pairs of the strongest key's score, largest first
    split.query_writers()       # each query-side writer's part, and the weight without it (split and run)
    task = qk_attribution_task(model, make_task(model, "ioi", 50), 23, 3, "END", "S2")
    task.frame("clean")         # each writer pair's mean part and share with 95% intervals, and its rank

A part is in the score's units (what the softmax reads); a share is the part over the whole score, so that the
shares of one score sum to 1. Norm scales are frozen at their values in the run, as attribution graphs freeze them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from models import AttentionModel, HeadLensError, head_label
from models.run import device_of, patching_stack

from ..circuits import graph as C
from ..stats import interval
from ..tasks.effects import batches
from ..tasks.focus import ENCODER_TASKS
from ..tasks.pairs import Task
from . import split as Q

MAX_TOKENS = 512   # a prompt's writers are held at every position: 301 x 512 x 576 floats for SmolLM2 (355 MB)
GRID = 8           # writers a side that a grid names; the others are summed as "the rest"
REMOVED = 10       # writers a side whose removal is also run (the score's largest parts)
TASK_PAIRS = 20    # writer pairs a task's frame gives intervals for
BATCH_PAIRS = 16
REST = "the rest"
ROLE_PAIRS = {"ioi": ("END", "S2"), "induction": ("END", "FIRST"),  # a task's query and key roles by default
              **{name: ("OBJECT", "FOCUS") for name in ENCODER_TASKS}}  # an encoder's: the named object to the focus

Progress = Callable[[int, int], None]


WHAT = "Why a head attends where it does is read"


def head_graph(model: AttentionModel, layer: int, head: int):
    """The stack the split's run goes up (a language model's or an encoder's) and its graph, the head checked to be
    there."""
    stack = patching_stack(model, WHAT)
    model.heads([(layer, head)])
    if head not in stack.kept[layer]:
        raise HeadLensError(f"Head {head} of layer {layer} was pruned away: it has no score to split.")
    return stack, C.graph_of(stack)


def _softmax(scores: np.ndarray, visible: np.ndarray, softcap: float | None = None) -> np.ndarray:
    """The weights of ``scores`` over the ``visible`` keys, each score soft-capped first where the model caps it."""
    s = np.where(visible, scores if softcap is None else np.tanh(scores / softcap) * softcap, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@dataclass(frozen=True)
class QKAttribution:
    """One head's scores from ``query`` to every key up to it (an encoder's: every key), split: ``split`` ``(writers,
    writers, keys)``
    float64 (query-side writer, key-side writer, key; the constant last on each side); ``scores`` the model's,
    ``weights`` its attention (zero on a key the query does not see); ``removed`` for the largest writers of each
    side, the weights with that writer taken out of the query (or key) input by a run with its norms recomputed."""

    model_name: str
    layer: int
    head: int
    tokens: list[str]
    query: int
    key: int
    writers: list[str]
    nodes: list[tuple[str, int, int]]
    split: np.ndarray
    scores: np.ndarray
    visible: np.ndarray
    removed: dict[tuple[str, int], np.ndarray]
    softcap: float | None = None                  # the cap on a score before the softmax (Gemma 2)

    @property
    def weights(self) -> np.ndarray:
        return _softmax(self.scores, self.visible, self.softcap)

    @property
    def n_keys(self) -> int:
        """How many keys the query is split against: up to it, or every token (an encoder's)."""
        return self.split.shape[2]

    def _key(self, key: int | None) -> int:
        key = self.key if key is None else int(key)
        if not 0 <= key < self.n_keys:
            raise HeadLensError(f"Key {key} is not among the query's keys (0 to {self.n_keys - 1}).")
        return key

    def pairs(self, key: int | None = None, n: int | None = None) -> pd.DataFrame:
        """Every (query-side, key-side) writer pair's part of the score to ``key`` (default the chosen one), largest
        |part| first (the first ``n``)."""
        key = self._key(key)
        m = self.split[:, :, key]
        order = np.argsort(-np.abs(m), axis=None, kind="stable")[:n]
        s, t = np.unravel_index(order, m.shape)
        return pd.DataFrame({"rank": np.arange(1, len(s) + 1), "query_writer": [self.writers[i] for i in s],
                             "key_writer": [self.writers[i] for i in t], "part": m[s, t],
                             "share": m[s, t] / self.scores[key], "query_index": s, "key_index": t})

    def side(self, side: str, key: int | None = None) -> pd.DataFrame:
        """Each writer's part of the score to ``key`` on one ``side`` ("q": summed over the key's writers; "k":
        over the query's), largest |part| first, with the key's weight without that writer: as the split predicts
        it, and (for the largest ``REMOVED``) as a run with it taken out gives it."""
        key = self._key(key)
        parts = self.split[:, :, key].sum(1 if side == "q" else 0)
        order = np.argsort(-np.abs(parts), kind="stable")
        predicted, real = [], []
        for w in order:
            less = self.scores - (self.split[w].sum(0) if side == "q" else self.split[:, w].sum(0))
            predicted.append(_softmax(less, self.visible, self.softcap)[key])
            run = self.removed.get((side, int(w)))
            real.append(np.nan if run is None else _softmax(run, self.visible, self.softcap)[key])
        return pd.DataFrame({"writer": [self.writers[w] for w in order], "part": parts[order],
                             "share": parts[order] / self.scores[key], "weight": self.weights[key],
                             "weight_without": predicted, "weight_without_run": real, "index": order})

    def query_writers(self, key: int | None = None) -> pd.DataFrame:
        return self.side("q", key)

    def key_writers(self, key: int | None = None) -> pd.DataFrame:
        return self.side("k", key)

    def keys(self) -> pd.DataFrame:
        """Every key the query is split against: its token, score, weight and the writer pair with the largest
        |part|."""
        flat = np.abs(self.split).reshape(-1, self.n_keys).argmax(0)
        s, t = np.unravel_index(flat, self.split.shape[:2])
        return pd.DataFrame({"key": np.arange(self.n_keys), "token": self.tokens[:self.n_keys],
                             "score": self.scores, "weight": self.weights, "visible": self.visible,
                             "top_pair": [f"{self.writers[a]} × {self.writers[b]}" for a, b in zip(s, t)]})

    def grid(self, key: int | None = None, n: int = GRID) -> tuple[list[str], list[str], np.ndarray]:
        """The ``n`` largest query-side writers (rows) against the ``n`` largest key-side ones (columns), each
        with "the rest" summed last: ``(rows, columns, parts)``; the parts sum to the score."""
        key = self._key(key)
        return _grid(self.split[:, :, key], self.writers, n)

    def summary(self, key: int | None = None) -> str:
        key = self._key(key)
        top = self.pairs(key, 1).iloc[0]
        return (f"{head_label(self.layer, self.head)}, query {self.query} ({self.tokens[self.query]!r}) → key {key} "
                f"({self.tokens[key]!r}): score {self.scores[key]:.2f}, weight {self.weights[key]:.2f}; the largest "
                f"part, {top.part:+.2f} ({top.share:.0%}), is {top.query_writer} × {top.key_writer}.")

    def to_json(self, key: int | None = None) -> dict:
        key = self._key(key)
        return {"model": self.model_name, "layer": self.layer, "head": self.head, "query": self.query, "key": key,
                "tokens": self.tokens[:self.n_keys], "score": float(self.scores[key]),
                "weight": float(self.weights[key]), "pairs": self.pairs(key, 200).drop(
                    columns=["query_index", "key_index"]).to_dict("records"),
                "query_writers": self.query_writers(key).drop(columns="index").to_dict("records"),
                "key_writers": self.key_writers(key).drop(columns="index").to_dict("records")}


def _grid(m: np.ndarray, writers: list[str], n: int) -> tuple[list[str], list[str], np.ndarray]:
    rows = np.argsort(-np.abs(m.sum(1)), kind="stable")[:n]
    cols = np.argsort(-np.abs(m.sum(0)), kind="stable")[:n]
    r_rest = np.setdiff1d(np.arange(len(m)), rows)
    c_rest = np.setdiff1d(np.arange(len(m)), cols)
    out = np.zeros((len(rows) + 1, len(cols) + 1))
    out[:-1, :-1] = m[np.ix_(rows, cols)]
    out[:-1, -1] = m[np.ix_(rows, c_rest)].sum(1)
    out[-1, :-1] = m[np.ix_(r_rest, cols)].sum(0)
    out[-1, -1] = m[np.ix_(r_rest, c_rest)].sum()
    return [writers[i] for i in rows] + [REST], [writers[i] for i in cols] + [REST], out


def _ids(model: AttentionModel, text: str) -> tuple[torch.Tensor, list[str]]:
    model.token_counts([text], "prompt")
    ids = model.tokenize(text, verbose=False)["input_ids"]
    if len(ids) > MAX_TOKENS:
        raise HeadLensError(f"The prompt has {len(ids):,} tokens; a score is split on prompts of at most "
                            f"{MAX_TOKENS}.")
    return torch.tensor([ids], dtype=torch.long), model.tokenizer.convert_ids_to_tokens(ids)


def prompt_tokens(model: AttentionModel, text: str) -> list[str]:
    """The tokens ``qk_attribution`` splits ``text`` into (a sentence for a text it does not take)."""
    patching_stack(model, WHAT)
    return _ids(model, text)[1]


def _position(at: int, n: int, what: str) -> int:
    at = int(at)
    if not -n <= at < n:
        raise HeadLensError(f"The {what} {at} is not a position of the prompt's {n} tokens.")
    return at % n


def _key_position(key: int, query: int, n: int, causal: bool = True) -> int:
    """``key`` as a position up to ``query`` (a negative one counted back from the query, -1 the query itself); a
    sentence for one past the prompt or after the query, which the query does not see. An encoder's (not
    ``causal``): any position of the prompt, a negative one counted back from the end."""
    key = int(key)
    if not causal:
        return _position(key, n, "key")
    if key < 0:
        return _position(key, query + 1, "key")
    if key >= n:
        raise HeadLensError(f"The key {key} is not a position of the prompt's {n} tokens.")
    if key > query:
        raise HeadLensError(f"The key {key} comes after the query {query}: a query sees only the keys up to it "
                            f"(0 to {query}).")
    return key


def qk_attribution(model: AttentionModel, text: str, layer: int, head: int, query: int = -1,
                   key: int | None = None) -> QKAttribution:
    """Head ``(layer, head)``'s scores from ``query`` (a token position; -1 the last) to every key, each split
    over (query-side writer, key-side writer) pairs; ``key`` chooses the key the frames read first (default the
    one the head weighs most)."""
    stack, graph = head_graph(model, layer, head)
    ids, tokens = _ids(model, text)
    query = _position(query, len(tokens), "query")
    run = Q.writers_run(stack, graph, ids.to(device_of(stack)))
    sides = Q.head_sides(stack, graph, run, layer, head)
    with torch.inference_mode():
        split = sides.split(query)[:, :, 0].double().cpu().numpy()               # (W, W, query + 1)
        visible = sides.visible(query).cpu().numpy()
    scores = split.sum((0, 1))
    weights = _softmax(scores, visible, sides.softcap)
    key = int(np.argmax(weights)) if key is None else _key_position(key, query, len(tokens), stack.causal)
    if not visible[key]:
        raise HeadLensError(f"Query {query} does not see key {key}: it lies outside this layer's window.")
    removed = {}
    for side, axis in (("q", 1), ("k", 0)):
        parts = split[:, :, key].sum(axis)[:-1]                                     # nodes only, not the constant
        for w in np.argsort(-np.abs(parts), kind="stable")[:REMOVED]:
            removed[(side, int(w))] = Q.scores_without(stack, graph, run, layer, head, query, int(w), side)[0] \
                .double().cpu().numpy()
    return QKAttribution(model.name, layer, head, tokens, query, key, Q.writer_names(graph, layer),
                         Q.writer_nodes(graph, layer), split, scores, visible, removed, sides.softcap)


@dataclass(frozen=True)
class QKTask:
    """A head's score from ``query_role`` to ``key_role`` split on every pair of a task: ``clean`` and ``corrupted``
    ``(pairs, writers, writers)`` float64, and each pair's whole scores."""

    model_name: str
    task: Task
    layer: int
    head: int
    query_role: str
    key_role: str
    writers: list[str]
    nodes: list[tuple[str, int, int]]
    clean: np.ndarray
    corrupted: np.ndarray

    def parts(self, which: str = "clean") -> np.ndarray:
        """``(pairs, writers, writers)``: "clean", "corrupted", or "difference" (clean − corrupted: what the
        corruption took away)."""
        if which not in ("clean", "corrupted", "difference"):
            raise HeadLensError(f"Choose clean, corrupted or difference, not {which!r}.")
        return self.clean - self.corrupted if which == "difference" else getattr(self, which)

    def frame(self, which: str = "clean", n: int = TASK_PAIRS) -> pd.DataFrame:
        """The ``n`` writer pairs of largest mean |part|: each one's mean part and mean share of its pair's score
        (the difference's share: of the clean score's fall), each with a 95% bootstrap interval over the pairs, and
        its rank."""
        p = self.parts(which)
        P, W, _ = p.shape
        flat = p.reshape(P, -1)
        order = np.argsort(-np.abs(flat.mean(0)), kind="stable")[:n]
        whole = flat.sum(1, keepdims=True)
        share = flat[:, order] / np.where(np.abs(whole) > 1e-12, whole, np.nan)
        part_lo, part_hi = interval(flat[:, order])
        s, t = np.unravel_index(order, (W, W))
        ok = ~np.isnan(share).any(1)
        share_lo, share_hi = interval(share[ok]) if ok.sum() > 1 else (np.full(len(order), np.nan),) * 2
        return pd.DataFrame({"rank": np.arange(1, len(order) + 1), "query_writer": [self.writers[i] for i in s],
                             "key_writer": [self.writers[i] for i in t], "part": flat[:, order].mean(0),
                             "part_lo": part_lo, "part_hi": part_hi, "share": np.nanmean(share, 0),
                             "share_lo": share_lo, "share_hi": share_hi, "query_index": s, "key_index": t})

    def side(self, side: str, which: str = "clean", n: int = TASK_PAIRS) -> pd.DataFrame:
        """The ``n`` writers of one ``side`` ("q" or "k") of largest mean |part| (summed over the other side's
        writers), each with its 95% interval over the pairs and its rank."""
        p = self.parts(which).sum(2 if side == "q" else 1)                             # (pairs, writers)
        order = np.argsort(-np.abs(p.mean(0)), kind="stable")[:n]
        low, high = interval(p[:, order])
        return pd.DataFrame({"rank": np.arange(1, len(order) + 1), "writer": [self.writers[i] for i in order],
                             "part": p[:, order].mean(0), "part_lo": low, "part_hi": high, "index": order})

    def grid(self, which: str = "clean", n: int = GRID) -> tuple[list[str], list[str], np.ndarray]:
        """``QKAttribution.grid`` of the mean over the pairs."""
        return _grid(self.parts(which).mean(0), self.writers, n)

    def scores(self, which: str = "clean") -> np.ndarray:
        """``(pairs,)``: each pair's whole score."""
        return self.parts(which).sum((1, 2))


def qk_attribution_task(model: AttentionModel, task: Task, layer: int, head: int, query_role: str | None = None,
                        key_role: str | None = None, *, batch_pairs: int = BATCH_PAIRS,
                        progress: Progress | None = None) -> QKTask:
    """Head ``(layer, head)``'s score from each pair's ``query_role`` token to its ``key_role`` token (default
    ``ROLE_PAIRS[task.name]``) split on the clean and the corrupted prompt of every pair of ``task``."""
    if not len(task):
        raise HeadLensError("The task has no pairs.")
    default = ROLE_PAIRS.get(task.name, ("END", None))
    query_role, key_role = query_role or default[0], key_role or default[1]
    if query_role not in task.roles or key_role not in task.roles:
        raise HeadLensError(f"Choose a query and a key among the task's roles ({', '.join(task.roles)}).")
    stack, graph = head_graph(model, layer, head)
    W = len(Q.writer_names(graph, layer))
    out = {w: np.zeros((len(task), W, W)) for w in ("clean", "corrupted")}
    done = 0
    for idx in batches(task, batch_pairs):
        pairs = [task.pairs[i] for i in idx]
        queries = torch.tensor([p.role(query_role) for p in pairs])
        keys = torch.tensor([p.role(key_role) for p in pairs])
        if stack.causal and bool((keys > queries).any()):
            raise HeadLensError(f"A pair's {key_role} comes after its {query_role}: a query sees no later key.")
        for which, ids in (("clean", [p.clean_ids for p in pairs]), ("corrupted", [p.corrupted_ids for p in pairs])):
            run = Q.writers_run(stack, graph, torch.tensor(ids, device=device_of(stack)))
            with torch.inference_mode():
                got = Q.head_sides(stack, graph, run, layer, head).at(queries, keys)
            out[which][idx] = got.double().cpu().numpy()
        done += len(idx)
        if progress is not None:
            progress(done, len(task))
    return QKTask(model.name, task, layer, head, query_role, key_role, Q.writer_names(graph, layer),
                  Q.writer_nodes(graph, layer), out["clean"], out["corrupted"])
