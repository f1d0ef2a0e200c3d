"""Queries and keys in one picture: a head across a corpus (Yeh et al. 2023, AttentionViz).

A head scores query ``i`` against key ``j`` by ``q_i · k_j`` and takes a softmax over the keys of
its sentence. ``qk_vectors`` reads those vectors for every token of a corpus; ``qk_embedding`` puts
queries and keys in one 2-D picture where a query should lie nearest the key it attends to most.

Two changes leave every softmax as it is and make queries and keys comparable (AttentionViz):
the keys are translated so that their centroid meets the queries' (``q · (k + t)`` adds the same
``q · t`` to every key of a query), and queries are multiplied by ``a`` and keys divided by it, so
that both have the same mean length.

Nearness is not the dot product: ``|q - k|² = |q|² + |k|² - 2 q · k`` favours short keys, and a
head that parks its weight on a long [CLS] key (most heads of a BERT) is drawn with its queries
far from that key. Giving each key one more coordinate, ``sqrt(M - |k|²)`` with ``M`` the largest
``|k|²``, and each query a zero there, makes the nearest key of every query its highest-scoring
one exactly (Bachrach et al. 2014, the reduction of inner-product search to nearest neighbours).

The 2-D projection (``method``):

- ``"fitted"`` (default): a linear map of those vectors to the plane, started from their first
  two principal components and fitted so that each query's nearest key in 2-D, among its own
  sentence's keys, is the one it attends to most (cross-entropy of that key under a softmax of
  minus the squared 2-D distances). Queries that attend most to a word, not to a key heads park on
  ([CLS], [SEP], a decoder's first token), are often a fifth of all; they count for half of the
  fit, which raises their faithfulness from 0.46 to 0.64 for 0.03 of the whole. One plane for
  queries and keys, so position bands and token clusters stay what the vectors make them. On the
  built-in corpus and all-MiniLM-L6-v2 the 72 heads average a faithfulness of 0.82 (chance 0.09);
  see docs/queries-keys.md.
- ``"pca"``: the plain AttentionViz version, the first two principal components of the translated
  and scaled vectors: 0.09 on average, below chance on 47 of the 72 heads.
- ``"tsne"``: scikit-learn's t-SNE of the translated and scaled vectors: 0.10 to 0.79 on three
  heads, at 31 to 43 s a head. UMAP was measured and left out: 0.07 at 8 s a head.

``frame.attrs["faithfulness"]`` is the share of queries whose nearest key in 2-D, among the keys
of their own sentence they may see, is their most-attended key; ``frame.attrs["chance"]`` is that
share for a key drawn at random, the mean of ``1 / keys seen``.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from models import HeadLensError
from models.base import Progress

from ..roles.foci import FOCI, token_classes, word_classes
from ..roles.measure import _SPACY_LOCK, align_to_words, load_spacy
from ..attention.views import token_label

METHODS = ("fitted", "pca", "tsne")
WORD_CLASSES = ("special", *FOCI, "other")
FIT_STEPS = 60  # on all-MiniLM-L6-v2, 40 steps give 0.855 of the 100 steps' 0.866 at 60% of the time
TRUST = 0.5  # below this share of queries drawn nearest their key, a picture misleads more often than not
WORD_QUERIES = 0.1  # the word-to-word figure is judged when at least this share of queries are word to word
WORD_WEIGHT = 0.5  # the share of the fit's loss given to word-to-word queries, however few they are
FIT_PAIRS = 400_000  # the most (query, key) pairs one fitting step reads; queries are sampled beyond it


@dataclass(frozen=True, eq=False)
class QK:
    """One head's queries and keys over a corpus, one row per token of all the sentences in order.

    Attributes:
        queries, keys: float32 ``(N, d_head)``, exactly as the softmax sees them: queries scaled by
            ``1 / sqrt(d_head)``, after the rotary rotation, a grouped-query head with its group's keys.
        tokens: ``sentence``, ``position``, ``token``, ``word_class`` (``WORD_CLASSES``: spaCy's parse
            as the Foci page reads it; a token in several foci takes the first), one row per token.
        sentences: the sentences, in order.
        layer, head: which head.
        causal: whether a query sees only the keys up to its own position.
    """

    queries: np.ndarray
    keys: np.ndarray
    tokens: pd.DataFrame
    sentences: list[str]
    layer: int
    head: int
    causal: bool

    @functools.cached_property
    def spans(self) -> list[tuple[int, int]]:
        """The rows of each sentence, ``(start, end)``."""
        ends = np.cumsum(np.bincount(self.tokens["sentence"].to_numpy(), minlength=len(self.sentences)))
        return list(zip([0, *ends[:-1].tolist()], ends.tolist()))

    def weights(self, sentence: int) -> np.ndarray:
        """The head's weights on one sentence, ``(n, n)``: the softmax of its queries times its keys."""
        start, end = self.spans[sentence]
        return _softmax_rows(self.queries[start:end] @ self.keys[start:end].T, self.causal)


def _softmax_rows(scores: np.ndarray, causal: bool) -> np.ndarray:
    scores = scores.astype(np.float64)
    if causal:
        scores = np.where(np.tri(*scores.shape, dtype=bool), scores, -np.inf)
    scores = scores - scores.max(axis=1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=1, keepdims=True)


def _word_classes(atts, nlp=None) -> list[list[str]]:
    """Each token's word class, for each sentence."""
    nlp = nlp or load_spacy()
    with _SPACY_LOCK:
        docs = list(nlp.pipe([a.text for a in atts]))
    out = []
    for att, doc in zip(atts, docs):
        members = token_classes(align_to_words(att, doc), word_classes(doc))
        names = []
        for i in range(len(att.tokens)):
            if att.special[i]:
                names.append("special")
                continue
            names.append(next((f for f in FOCI if members[f][i]), "other"))
        out.append(names)
    return out


def qk_heads(model, sentences: Sequence[str], heads: Sequence[tuple[int, int]] | None = None, *,
             progress: Progress | None = None, nlp=None, max_bytes: int = 64 * 2**20) -> dict[tuple[int, int], QK]:
    """``qk_vectors`` of several heads (default: every head), reading each layer's vectors once; layers are
    read in groups whose vectors stay within ``max_bytes``. ``progress(done, total)`` counts sentences read."""
    found = dict(iter_qk_heads(model, sentences, heads, progress=progress, nlp=nlp, max_bytes=max_bytes))
    return {pair: found[pair] for pair in _pairs(model, heads)}


def _pairs(model, heads) -> list[tuple[int, int]]:
    return model.heads([(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
                       if heads is None else heads)


def iter_qk_heads(model, sentences: Sequence[str], heads: Sequence[tuple[int, int]] | None = None, *,
                  progress: Progress | None = None, nlp=None, max_bytes: int = 64 * 2**20):
    """``qk_heads`` as ``((layer, head), QK)`` pairs, layer by layer, a group of layers read at a time (the first
    alone, then as many as ``max_bytes`` holds): a caller keeping less (a picture) holds one group's at most."""
    items = list(sentences)
    if not items:
        raise HeadLensError("There are no sentences to read queries and keys from.")
    pairs = _pairs(model, heads)
    pruned = model.pruned_heads if getattr(getattr(model, "stack", None), "pruned", False) else None
    for layer, head in pairs:
        if pruned is not None and pruned[layer, head]:
            raise HeadLensError(f"Head {head} of layer {layer} was pruned away; it has no queries or keys.")
    layers = sorted({layer for layer, _ in pairs})
    n_tokens = sum(model.token_counts(items))
    per_layer = 2 * 4 * n_tokens * model.n_heads * getattr(model, "head_dim", 64)
    step = max(1, max_bytes // max(1, per_layer))
    # the first layer alone, so that a page has its first heads to show after one layer's forward pass
    groups = layers[:1] and [layers[:1]] + [layers[i:i + step] for i in range(1, len(layers), step)]
    frame = None
    for group, read in zip(groups, model.queries_keys_groups(items, groups, progress=progress)):
        if frame is None:
            atts = [att for att, _, _ in read]
            classes = _word_classes(atts, nlp)
            frame = pd.DataFrame({
                "sentence": np.repeat(np.arange(len(atts)), [len(a.tokens) for a in atts]),
                "position": np.concatenate([np.arange(len(a.tokens)) for a in atts]),
                "token": [token_label(t) for a in atts for t in a.tokens],
                "word_class": pd.Categorical([c for names in classes for c in names], categories=WORD_CLASSES),
            })
            causal = bool(atts[0].causal)
        for j, layer in enumerate(group):
            for head in sorted({h for (lay, h) in pairs if lay == layer}):
                yield (layer, head), QK(
                    queries=np.concatenate([q[j, head] for _, q, _ in read]),
                    keys=np.concatenate([k[j, head] for _, _, k in read]),
                    tokens=frame, sentences=items, layer=layer, head=head, causal=causal)
        del read


def qk_vectors(model, sentences: Sequence[str], layer: int, head: int, *, progress: Progress | None = None,
               nlp=None) -> QK:
    """One head's queries and keys over ``sentences`` (from-scratch engine), one row per token.

    Check: for every sentence, ``QK.weights(i)`` equals ``model.attend(sentences[i]).weights[layer, head]``."""
    (pair,) = model.heads([(layer, head)])
    return qk_heads(model, sentences, [pair], progress=progress, nlp=nlp)[pair]


def normalised(queries: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Queries times ``a`` and keys divided by it, then translated so that their centroid meets the
    queries': ``a`` chosen so that both have the same mean length. Every query's scores change by
    one constant (the translation), so every softmax is unchanged."""
    q = queries.astype(np.float64)
    k = keys.astype(np.float64)
    centred, q_mean = k - k.mean(axis=0), q.mean(axis=0)
    q_len = np.linalg.norm(q, axis=1).mean()
    # |c / a + a m|² = |c|² / a² + 2 c · m + a² |m|²: each step of the search reads three numbers per key
    cc, cm, mm = (centred ** 2).sum(axis=1), centred @ q_mean, q_mean @ q_mean

    def gap(log_a: float) -> float:
        a = np.exp(log_a)
        return np.sqrt(np.maximum(cc / a ** 2 + 2 * cm + a ** 2 * mm, 0.0)).mean() - a * q_len

    # the keys' mean length falls from +inf to |q_mean| (< the queries') as a grows: one crossing
    lo, hi = -1.0, 1.0
    while gap(lo) < 0:
        lo -= 2.0
    while gap(hi) > 0 and hi < 60:
        hi += 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    a = np.exp((lo + hi) / 2)
    return a * q, centred / a + a * q_mean


def lifted(queries: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One more coordinate: ``sqrt(M - |k|²)`` for keys, 0 for queries, so that a query's nearest key is
    the one with its highest score (``|q - k|² = |q|² + M - 2 q · k``)."""
    sq = (keys ** 2).sum(axis=1)
    extra = np.sqrt(np.maximum(sq.max() - sq, 0.0))
    return (np.hstack([queries, np.zeros((len(queries), 1))]), np.hstack([keys, extra[:, None]]))


def _visible_pairs(spans, causal: bool, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(query row, key row)`` of every pair a query may see in its own sentence (of ``rows`` only, if given)."""
    qs, ks = [], []
    for start, end in spans:
        n = end - start
        i, j = np.tril_indices(n) if causal else np.divmod(np.arange(n * n), n)
        keep = slice(None) if rows is None else np.isin(i + start, rows)
        qs.append(i[keep] + start)
        ks.append(j[keep] + start)
    return np.concatenate(qs), np.concatenate(ks)


def most_attended(qk: QK) -> np.ndarray:
    """For each query row, the row of the key it gives the most weight."""
    out = np.empty(len(qk.queries), dtype=np.int64)
    for s, (start, end) in enumerate(qk.spans):
        out[start:end] = qk.weights(s).argmax(axis=1) + start
    return out


def nearest_keys(xy_q: np.ndarray, xy_k: np.ndarray, spans, causal: bool) -> np.ndarray:
    """For each query, the row of its nearest key in 2-D among the keys of its sentence it may see."""
    out = np.empty(len(xy_q), dtype=np.int64)
    for start, end in spans:
        d = ((xy_q[start:end, None, :] - xy_k[None, start:end, :]) ** 2).sum(axis=-1)
        if causal:
            d = np.where(np.tri(end - start, dtype=bool), d, np.inf)
        out[start:end] = d.argmin(axis=1) + start
    return out


def chance(spans, causal: bool) -> float:
    """The share of queries a key drawn at random from those each may see would draw right."""
    seen = [np.arange(1, end - start + 1) if causal else np.full(end - start, end - start) for start, end in spans]
    return float(np.mean(1.0 / np.concatenate(seen)))


def _principal_plane(x: np.ndarray) -> np.ndarray:
    """``(D, 2)``: the first two principal directions of the rows of ``x``, from their ``(D, D)`` covariance (a
    corpus has thousands of rows and a head tens of dimensions)."""
    centred = x - x.mean(axis=0)
    _, vectors = np.linalg.eigh(centred.T @ centred)                            # ascending eigenvalues
    return vectors[:, [-1, -2]]


def _fitted_planes(q: list[np.ndarray], k: list[np.ndarray], targets: list[np.ndarray], spans, causal: bool,
                   seed: int, weights: list[np.ndarray | None]) -> list[np.ndarray]:
    """For each head (queries ``q[h]``, keys ``k[h]``, each ``(N, D)``, over the same tokens), the linear map ``(D, 2)``
    under which each query's nearest key tends to be ``targets[h]``'s; ``weights[h]``: how much each query
    counts (None: each alike). The heads are fitted side by side, one batched step for all: each has its own
    map, loss and Adam state (Adam's update is elementwise), so each is fitted as it would be alone."""
    planes = [_principal_plane(np.vstack([qh, kh])) for qh, kh in zip(q, k)]
    planes = [plane / (np.abs(qh @ plane).std() + 1e-12) for qh, plane in zip(q, planes)]  # unit spread to start
    H, n = len(q), len(q[0])
    rows = None
    sizes = np.array([end - start for start, end in spans])
    if (sizes ** 2).sum() > FIT_PAIRS:
        share = FIT_PAIRS / (sizes ** 2).sum()
        rows = np.sort(np.random.default_rng(seed).choice(n, max(1, int(n * share)), replace=False))
    qi, kj = _visible_pairs(spans, causal, rows)
    qi_t, kj_t = torch.from_numpy(qi), torch.from_numpy(kj)
    hit = torch.from_numpy(np.stack([np.flatnonzero(kj == t[qi]) for t in targets]))  # (H, queries read)
    asked = qi_t[hit]                                                            # (H, queries read)
    qt = torch.from_numpy(np.stack(q)).float().transpose(1, 2).contiguous()      # (H, D, N): w^T x is 6x as fast as x w
    kt = torch.from_numpy(np.stack(k)).float().transpose(1, 2).contiguous()
    counts = torch.stack([torch.ones(n) if w is None else torch.as_tensor(w, dtype=torch.float32) for w in weights])
    counts = counts.gather(1, asked)
    counts = counts / counts.sum(dim=1, keepdim=True)
    w = torch.tensor(np.stack(planes).transpose(0, 2, 1), dtype=torch.float32, requires_grad=True)  # (H, 2, D)
    opt = torch.optim.Adam([w], lr=0.05)
    with torch.enable_grad():
        for _ in range(FIT_STEPS):
            d = -torch.stack([(w[h] @ qt[h]).index_select(1, qi_t) - (w[h] @ kt[h]).index_select(1, kj_t)
                              for h in range(H)]).square().sum(dim=1)  # (H, pairs); head by head, as alone
            top = torch.full((H, n), -torch.inf).scatter_reduce(1, qi_t.expand(H, -1), d.detach(), "amax")
            z = torch.zeros(H, n).index_add(1, qi_t, torch.exp(d - top[:, qi_t]))
            log_z = torch.log(z.gather(1, asked))
            loss = ((log_z + top.gather(1, asked) - d.gather(1, hit)) * counts).sum()  # each head's cross-entropy
            opt.zero_grad()
            loss.backward()
            opt.step()
    return list(w.detach().double().numpy().transpose(0, 2, 1))


def qk_embedding(qk: QK, *, method: str = "fitted", seed: int = 0) -> pd.DataFrame:
    """Queries and keys of one head in one 2-D picture: 2N rows, queries first, with ``x``, ``y``, ``kind``
    ("query" or "key"), ``sentence``, ``position``, ``token``, ``word_class`` and, for queries, ``near``:
    whether the query's nearest key in 2-D is its most-attended one (None for keys).

    ``attrs``: ``faithfulness`` (the share of queries ``near``), ``chance``, ``method``, ``layer``, ``head``,
    ``causal``; ``word_faithfulness``, the share ``near`` among ``word_share`` of the queries: the word queries
    whose most-attended key is a word, not a key heads park on (``parking_keys``). A head that parks nearly
    every query on one key is drawn faithfully with little effort; this says how the rest are drawn.
    ``misleads``: why the picture should not be read by nearness (``misleads``), or "".
    """
    return qk_embeddings([qk], method=method, seed=seed)[0]


def qk_embeddings(qks: Sequence[QK], *, method: str = "fitted", seed: int = 0) -> list[pd.DataFrame]:
    """``qk_embedding`` of several heads over the same sentences (a layer's, as ``iter_qk_heads`` reads them),
    their planes fitted side by side."""
    if method not in METHODS:
        raise HeadLensError(f"The projection is one of {', '.join(METHODS)}; {method!r} is not.")
    if not qks:
        return []
    spans, causal = qks[0].spans, qks[0].causal
    q, k = map(list, zip(*(normalised(qk.queries, qk.keys) for qk in qks)))
    targets = [most_attended(qk) for qk in qks]
    words = [word_queries(qk, target) for qk, target in zip(qks, targets)]
    if method == "fitted":
        q, k = map(list, zip(*(lifted(qh, kh) for qh, kh in zip(q, k))))
        planes = _fitted_planes(q, k, targets, spans, causal, seed, [fit_weights(w) for w in words])
    elif method == "pca":
        planes = [_principal_plane(np.vstack([qh, kh])) for qh, kh in zip(q, k)]
    drawn = ([_tsne(qh, kh, seed) for qh, kh in zip(q, k)] if method == "tsne"
             else [(qh @ plane, kh @ plane) for qh, kh, plane in zip(q, k, planes)])
    return [_picture(qk, xy_q, xy_k, target, w, method)
            for qk, (xy_q, xy_k), target, w in zip(qks, drawn, targets, words)]


def _tsne(q: np.ndarray, k: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.manifold import TSNE

    both = np.vstack([q, k])
    perplexity = min(30.0, max(1.0, (len(both) - 1) / 3))  # t-SNE needs fewer neighbours than points
    xy = TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=seed).fit_transform(both)
    return xy[:len(q)], xy[len(q):]


def _picture(qk: QK, xy_q: np.ndarray, xy_k: np.ndarray, target: np.ndarray, words: np.ndarray,
             method: str) -> pd.DataFrame:
    """``qk_embedding``'s frame of one head drawn at ``xy_q`` and ``xy_k``."""
    spans = qk.spans
    near = nearest_keys(xy_q, xy_k, spans, qk.causal) == target
    both = pd.concat([qk.tokens, qk.tokens], ignore_index=True)
    frame = pd.DataFrame({
        "x": np.concatenate([xy_q[:, 0], xy_k[:, 0]]).astype(np.float32),
        "y": np.concatenate([xy_q[:, 1], xy_k[:, 1]]).astype(np.float32),
        "kind": np.repeat(["query", "key"], len(xy_q)),
        **{c: both[c] for c in ("sentence", "position", "token", "word_class")},
        "near": pd.array([*near.tolist(), *[None] * len(xy_k)], dtype="boolean"),
    })
    frame.attrs.update(faithfulness=float(near.mean()), chance=chance(spans, qk.causal), method=method,
                       layer=qk.layer, head=qk.head, causal=qk.causal, word_share=float(words.mean()),
                       word_faithfulness=float(near[words].mean()) if words.any() else float("nan"))
    frame.attrs["misleads"] = misleads(frame.attrs)
    return frame


def misleads(attrs: dict) -> str:
    """Why a picture with these ``attrs`` should not be read by nearness, in words; "" when it may be."""
    if attrs["faithfulness"] < TRUST:
        return f"only {attrs['faithfulness']:.0%} of queries lie nearest the key they attend to most"
    if attrs["word_share"] >= WORD_QUERIES and attrs["word_faithfulness"] < TRUST:
        return (f"of the {attrs['word_share']:.0%} of queries that attend most to a word, only "
                f"{attrs['word_faithfulness']:.0%} lie nearest it")
    return ""


def word_queries(qk: QK, target: np.ndarray) -> np.ndarray:
    """bool per query: a word whose most-attended key (``target``, a row) is a word, not a parking key."""
    parked = parking_keys(qk)
    return ~parked & ~parked[target]


def fit_weights(words: np.ndarray) -> np.ndarray | None:
    """How much each query counts in the fit: ``WORD_WEIGHT`` of it shared by the word-to-word queries."""
    share = words.mean()
    return None if share in (0, 1) else np.where(words, WORD_WEIGHT / share, (1 - WORD_WEIGHT) / (1 - share))


def parking_keys(qk: QK) -> np.ndarray:
    """bool per token: where heads park attention they do not use (Clark et al. 2019): special tokens, and
    in a causal model the first token (a sink, Xiao et al. 2024)."""
    parked = (qk.tokens["word_class"] == "special").to_numpy()
    return parked | ((qk.tokens["position"] == 0).to_numpy() & qk.causal)
