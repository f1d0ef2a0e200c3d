"""Head roles over one long document, each sentence read in its context: the measures of
``analysis.roles.measure`` for every head of every layer, computed from a ``LongAttention`` a block of query
rows at a time, so that no layer's weights are ever held whole.

A sentence of the document stands where a sentence of a corpus stands in ``measure_heads``: its
queries' values are summed, each measure is a mean over queries, per-sentence values rank sentences
and foci are bootstrapped over sentences. What differs is the context: a query sees every token
before it (and after it, in an encoder), not only its own sentence's, so

- ``cls`` is the weight on the document's first token, ``sep`` on its last, ``final_mark`` on the
  query's own sentence's final "?", "!" or ".";
- ``entropy_norm`` divides each row's entropy by the log of the number of keys that row sees;
- a focus's share counts every member token the query sees, and its uniform share (``f_base``) and
  a part of speech's (``noun_base``...) are what uniform attention over the tokens or words that
  query sees would give. A sentence counts for a focus when it has a member word itself.

For a one-sentence document read by an encoder these are exactly ``measure_heads``'s values.
Head similarity (Jensen-Shannon divergence between heads) is averaged over ``SIMILARITY_ROWS``
query rows spread over the document.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from models.long import LongAttention
from models.memory import release_memory

from .foci import FINAL_MARKS, FOCI, token_classes, word_classes
from ..stats import text_key
from .measure import (
    _SPACY_LOCK,
    POS_GROUPS,
    RELATIONS,
    HeadMeasures,
    _Totals,
    align_to_words,
    is_punct,
    load_spacy,
)
from ..attention.views import set_aside, token_label

SIMILARITY_ROWS = 32  # query rows of the document whose weights, in every head, measure how alike heads are

Progress = Callable[[int, int], None]


@dataclass(frozen=True, eq=False)
class DocumentProfile:
    """Head roles over one document's sentences.

    Attributes:
        measures: as ``measure_heads`` gives them, one "sentence" per sentence of the document.
        sentences: each sentence's ``(text, first token, stop token)``, in order.
        sample: the query rows whose weights measure how alike heads are (``SIMILARITY_ROWS``, spread evenly).
        sampled: for each, every head's weights on the keys that row sees, ``(layers * heads, keys)`` float32.
    """

    measures: HeadMeasures
    sentences: list[tuple[str, int, int]]
    sample: np.ndarray
    sampled: list[np.ndarray]

    def divergences(self, layer: int, head: int) -> np.ndarray:
        """``(layers * heads,)``: the Jensen-Shannon divergence (nats) between ``(layer, head)``'s weights and
        each head's, ``H((a + b) / 2) - (H(a) + H(b)) / 2``, the mean over the sampled rows; 0 for itself."""
        n_heads = self.measures.frame_shape[1]
        index = layer * n_heads + head
        total = np.zeros(len(self.sampled[0]) if self.sampled else 0)
        for p in self.sampled:
            p = torch.as_tensor(p)
            a = p[index]
            own = torch.special.entr(p).double().sum(dim=-1)
            mixed = torch.special.entr((p + a) / 2).double().sum(dim=-1)
            total += (mixed - (own + own[index]) / 2).numpy()
        return np.maximum(total / max(1, len(self.sampled)), 0.0)

    def similarity(self) -> np.ndarray:
        """``(layers * heads, layers * heads)``: ``divergences`` of every head (as ``head_similarity`` gives for
        sentences; slow for many heads: each pair over every key of every sampled row)."""
        n_layers, n_heads = self.measures.frame_shape
        return np.stack([self.divergences(layer, head) for layer in range(n_layers) for head in range(n_heads)])


def _sentence_of_tokens(token_words: list[int | None], doc) -> tuple[np.ndarray, list]:
    """Each token's sentence (a token without a word joins the sentence before it) and the sentences
    that hold a token, as spaCy spans."""
    sent_of_word = np.zeros(len(doc), dtype=np.int64)
    sents = list(doc.sents)
    for s, sent in enumerate(sents):
        sent_of_word[sent.start:sent.end] = s
    out = np.zeros(len(token_words), dtype=np.int64)
    current = 0
    for t, w in enumerate(token_words):
        if w is not None:
            current = int(sent_of_word[w])
        out[t] = current
    used = np.unique(out)
    renumber = np.full(len(sents), -1, dtype=np.int64)
    renumber[used] = np.arange(len(used))
    return renumber[out], [sents[i] for i in used]


def _chunks(sentence: np.ndarray, token_words: list[int | None], size: int) -> list[tuple[int, int]]:
    """Row ranges of at most ``size`` tokens that never split a word, cut at sentence ends when they can."""
    n = len(sentence)
    starts_word = np.array([t == 0 or w is None or token_words[t - 1] != w for t, w in enumerate(token_words)])
    out, lo = [], 0
    while lo < n:
        hi = min(n, lo + size)
        if hi < n:
            ends = [t for t in range(hi, lo, -1) if sentence[t] != sentence[t - 1]]  # a sentence starts at t
            cut = ends[0] if ends else next((t for t in range(hi, lo, -1) if starts_word[t]), hi)
            hi = cut
        out.append((lo, hi))
        lo = hi
    return out


@dataclass
class _Document:
    """What every block of one document's profile reads and adds to."""

    n: int
    causal: bool
    sentence: np.ndarray          # each token's sentence
    query: np.ndarray             # bool: the token is a query (not set aside)
    final: np.ndarray             # each sentence's final mark (token), or -1
    word_of: np.ndarray           # each token's word, or -1
    key_words: np.ndarray         # each token's word as a key: -1 for none, or a word the model did not read
    n_words: int
    present_words: np.ndarray     # bool per word: the model read one of its tokens
    pos_member: dict[str, np.ndarray]
    sent_of_word: np.ndarray
    sums: dict[str, np.ndarray]   # name -> (sentences, layers, heads)
    best: np.ndarray              # (layers, heads, words): each query word's most-attended other word, or -1
    sample: np.ndarray            # query rows whose weights measure head similarity
    sampled: list[list[np.ndarray]]

    def add(self, name: str, layer: int, rows: np.ndarray, values: torch.Tensor, where: np.ndarray) -> None:
        """Sum ``values`` (heads, rows) over the rows ``where`` into each row's sentence."""
        v = values.double().cpu().numpy()[:, where]
        np.add.at(self.sums[name][:, layer, :], self.sentence[rows[where]], v.T)


def profile_document(att: LongAttention, nlp=None, progress: Progress | None = None) -> DocumentProfile:
    """Every head's measures over ``att``'s document, sentence by sentence in context (module docs).
    ``progress(done, layers)`` after each layer."""
    nlp = nlp or load_spacy()
    with _SPACY_LOCK:
        doc = nlp(att.text)
    n, L, H = len(att.tokens), att.n_layers, att.n_heads
    token_words = align_to_words(att, doc)
    sentence, sents = _sentence_of_tokens(token_words, doc)
    S = len(sents)
    aside = set_aside(att)
    query = ~aside
    labels = [token_label(t) for t in att.tokens]
    punct = np.array([is_punct(lab) and not s for lab, s in zip(labels, att.special)])
    content_members = {f: m & ~aside for f, m in token_classes(token_words, word_classes(doc)).items()}
    final = np.full(S, -1, dtype=np.int64)  # each sentence's last token that is not special, when a final mark
    for t in np.flatnonzero(~np.asarray(att.special, dtype=bool)):
        final[sentence[t]] = t
    final = np.where([final[s] >= 0 and labels[final[s]] in FINAL_MARKS for s in range(S)], final, -1)

    word_of = np.array([-1 if w is None else w for w in token_words], dtype=np.int64)
    present_words = np.zeros(len(doc), dtype=bool)
    present_words[word_of[word_of >= 0]] = True
    n_words = int(np.flatnonzero(present_words).max()) + 1 if present_words.any() else 0
    words = doc[:n_words]
    present_words = present_words[:n_words]
    pos_member = {g: np.array([w.pos_ in tags for w in words], dtype=bool) & present_words
                  for g, tags in POS_GROUPS.items()}
    sent_of_word = np.zeros(n_words, dtype=np.int64)
    for t, w in enumerate(token_words):
        if w is not None and w < n_words:
            sent_of_word[w] = sentence[t]
    if att.causal:  # what uniform attention gives over the keys each query sees
        token_base = {f: np.cumsum(m) / np.maximum(np.cumsum(query), 1) for f, m in content_members.items()}
        word_base = {g: np.cumsum(m) / np.maximum(np.cumsum(present_words), 1) for g, m in pos_member.items()}
    else:
        token_base = {f: np.full(n, m.sum() / max(query.sum(), 1)) for f, m in content_members.items()}
        word_base = {g: np.full(n_words, m.sum() / max(present_words.sum(), 1)) for g, m in pos_member.items()}

    names = (*TOKEN_SUMS, *POS_GROUPS, *FOCI)
    sample = _similarity_rows(query)
    key_words = np.where(word_of < n_words, word_of, -1)
    d = _Document(n, bool(att.causal), sentence, query, final, word_of, key_words, n_words, present_words, pos_member,
                  sent_of_word, {name: np.zeros((S, L, H)) for name in names},
                  np.full((L, H, n_words), -1, dtype=np.int64), sample, [[] for _ in sample])
    columns = np.stack([np.arange(n), aside, punct, *(content_members[f] for f in FOCI)], axis=1).astype(np.float32)
    chunks = _chunks(sentence, token_words, att.block_rows(H))
    for layer in range(L):
        att.run_to(layer)
        for lo, hi in chunks:
            for start, stop, w, entropy, mixed in att.blocks(layer, None, rows=(lo, hi), with_entropy=True,
                                                              columns=columns):
                _token_block(d, layer, start, stop, w, entropy, mixed)
                if n_words >= 2:
                    _word_block(d, layer, start, stop, w)
        release_memory()
        if progress is not None:
            progress(layer + 1, L)

    measures = _measures(d, att, sents, token_base, word_base, words, content_members)
    spans = []
    for s, sent in enumerate(sents):
        where = np.flatnonzero(sentence == s)
        spans.append((sent.text, int(where[0]), int(where[-1]) + 1))
    sampled = [np.concatenate(layers, axis=0) for layers in d.sampled if len(layers) == L]
    return DocumentProfile(measures, spans, sample, sampled)


TOKEN_SUMS = ("prev_token", "next_token", "self", "distance", "cls", "sep", "punct", "final_mark", "entropy",
              "entropy_norm")


def _token_block(d: _Document, layer: int, start: int, stop: int, w: torch.Tensor, entropy: torch.Tensor,
                 mixed: torch.Tensor) -> None:
    """Token-level measures and foci of query rows ``start``-``stop``: ``w`` their weights, ``entropy`` each
    row's, ``mixed`` the weights times the columns [position, set aside, punctuation, each focus]."""
    dev, seen = w.device, w.shape[-1]
    i = np.arange(start, stop)
    rows = torch.arange(stop - start, device=dev)
    ok = d.query[start:stop]

    def at(col: np.ndarray, w=w) -> torch.Tensor:
        """Each row's weight on key ``col[row]`` (0 where that key is outside what it sees)."""
        inside = (col >= 0) & (col < seen)
        out = torch.zeros(w.shape[:2], dtype=w.dtype, device=dev)
        if inside.any():
            r = rows[torch.as_tensor(inside, device=dev)]
            out[:, r] = w[:, r, torch.as_tensor(col[inside], device=dev)]
        return out

    position = torch.arange(d.n, dtype=torch.float32, device=dev)
    if d.causal:
        distance = position[start:stop] - mixed[..., 0]
    else:
        distance = (w * (position[start:stop].view(-1, 1) - position[:seen].view(1, -1)).abs_()).sum(dim=-1)
    mark = d.final[d.sentence[start:stop]]
    keys_seen = (i + 1) if d.causal else np.full(stop - start, d.n)
    norm = torch.as_tensor(np.log(np.maximum(keys_seen, 2)), dtype=entropy.dtype, device=dev)
    content = (1.0 - mixed[..., 1]).clamp_min(0.0)
    values = {"prev_token": at(i - 1), "next_token": at(np.where(i + 1 < d.n, i + 1, -1)), "self": at(i),
              "distance": distance, "cls": w[..., 0], "sep": at(np.full(stop - start, d.n - 1)),
              "punct": mixed[..., 2], "entropy": entropy, "entropy_norm": entropy / norm}
    for c, f in enumerate(FOCI):
        values[f] = torch.where(content > 0, mixed[..., 3 + c] / content.clamp_min(1e-30), torch.zeros_like(content))
    for name, v in values.items():
        d.add(name, layer, i, v, ok)
    d.add("final_mark", layer, i, at(mark), ok & (mark >= 0))
    for r in np.flatnonzero(np.isin(i, d.sample)):
        keys = i[r] + 1 if d.causal else seen
        d.sampled[int(np.searchsorted(d.sample, i[r]))].append(w[:, r, :keys].cpu().numpy().copy())


def _word_block(d: _Document, layer: int, start: int, stop: int, w: torch.Tensor) -> None:
    """Word-level measures of the query words whose tokens are rows ``start``-``stop`` (a block never splits
    a word): pieces summed as keys and averaged as queries (Clark et al. 2019)."""
    dev, seen = w.device, w.shape[-1]
    rows_word = d.word_of[start:stop]
    use = (rows_word >= 0) & (rows_word < d.n_words)
    if not use.any():
        return
    # pieces averaged as queries (one small product), then keys summed into words: every key seen lands in
    # its word's column, a key without a word in the last one
    qwords, local = np.unique(rows_word[use], return_inverse=True)
    average = torch.zeros(len(qwords), stop - start, dtype=torch.float32, device=dev)
    average[torch.as_tensor(local, device=dev), torch.as_tensor(np.flatnonzero(use), device=dev)] = 1.0
    average /= average.sum(dim=1, keepdim=True)
    by_query = torch.matmul(average, w)                                                    # (heads, q words, keys)
    columns = int(d.key_words[:seen].max()) + 1 if seen else 1
    W = torch.zeros(w.shape[0], len(qwords), columns + 1, dtype=torch.float32, device=dev)
    W.index_add_(2, torch.as_tensor(np.where(d.key_words[:seen] >= 0, d.key_words[:seen], columns), device=dev),
                 by_query)
    del by_query
    W = W[..., :columns]                                                                   # (heads, q words, words)
    sid = d.sent_of_word[qwords]
    member = torch.as_tensor(np.stack([m[:columns] for m in d.pos_member.values()], axis=1), dtype=torch.float32,
                             device=dev)
    mass = torch.matmul(W, member).double().cpu().numpy()                                   # (heads, q words, groups)
    for g, name in enumerate(d.pos_member):
        np.add.at(d.sums[name][:, layer, :], sid, mass[..., g].T)
    # each query word's most-attended other word; a tie names none (uniform attention is no evidence)
    W[:, torch.arange(len(qwords), device=dev), torch.as_tensor(qwords, device=dev)] = -1.0
    W.masked_fill_(torch.as_tensor(~d.present_words[:columns], device=dev), -1.0)
    if columns < 2:
        return
    top = torch.topk(W, 2, dim=-1)
    best = top.indices[..., 0].masked_fill_(top.values[..., 0] - top.values[..., 1] < 1e-6, -1)
    d.best[layer][:, qwords] = best.cpu().numpy()


def _measures(d: _Document, att: LongAttention, sents, token_base, word_base, words, content_members) -> HeadMeasures:
    """The sums per sentence turned into ``measure_heads``'s totals, one sentence at a time."""
    L, H = att.n_layers, att.n_heads
    S = len(sents)
    totals = _Totals((L, H))
    totals.causal = d.causal
    q_count = np.bincount(d.sentence[d.query], minlength=S)
    word_q = np.bincount(d.sent_of_word[d.present_words], minlength=S)
    qword_index = np.flatnonzero(d.present_words)
    for s in range(S):
        totals.sentence = s
        if q_count[s]:
            for name in TOKEN_SUMS:
                if name != "final_mark":
                    totals.add(name, d.sums[name][s], int(q_count[s]))
            if d.final[s] >= 0:
                totals.add("final_mark", d.sums["final_mark"][s], int(q_count[s]))
        if word_q[s] and d.n_words >= 2:
            mine = qword_index[d.sent_of_word[qword_index] == s]
            for g in POS_GROUPS:
                totals.add(g, d.sums[g][s], int(word_q[s]))
                totals.add(f"{g}_base", np.full((L, H), word_base[g][mine].sum()), int(word_q[s]))
        rows = np.flatnonzero((d.sentence == s) & d.query)
        if not len(rows):
            continue
        for f in FOCI:
            if not content_members[f][d.sentence == s].any():
                continue
            share, base = d.sums[f][s] / len(rows), float(token_base[f][rows].mean())
            totals.add(f, share, 1)
            totals.add(f"{f}_base", np.full((L, H), base), 1)
            totals.keep(f"{f}_lift", share / base)
            totals.bootstraps[f].add(text_key(sents[s].text), share, base)
    for word in words:
        rel, dep, head = word.dep_, word.i, word.head.i
        if rel not in RELATIONS or dep == head or head >= d.n_words or not (d.present_words[dep] and d.present_words[head]):
            continue
        for direction, src, dst in (("dep2head", dep, head), ("head2dep", head, dep)):
            key = (rel, direction)
            totals.relations[key] += d.best[..., src] == dst
            totals.relation_counts[key] += 1
            totals.offsets[key][dst - src] += 1
    return HeadMeasures(totals, S)


def _similarity_rows(query: np.ndarray) -> np.ndarray:
    """``SIMILARITY_ROWS`` query positions spread evenly over the document's queries."""
    rows = np.flatnonzero(query)
    if not len(rows):
        return rows
    return np.unique(rows[np.linspace(0, len(rows) - 1, min(len(rows), SIMILARITY_ROWS)).round().astype(int)])
