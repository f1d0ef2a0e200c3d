"""Head importance and pruning curves: computed once for every session, with a progress bar."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from analysis.importance import (attention_proxies, curve_work, head_importance, proxy_correlations, prune_counts,
                                 pruning_curve)
from models import AttentionModel

from .caches import SharedCache, cached_model, computed_once, model_for
from .exports import model_zip
from .profiles import CORPUS, uploaded_sentences
from .settings import MODELS, TRAINED, Settings
from .state import bound
from .training import trained_job

SAMPLE = 100  # sentences of the built-in corpus the page measures by default: about a minute on 2 CPU cores
MAX_SENTENCES = 400  # more would take many minutes: every step re-measures every remaining head
SEEDS = (0, 1, 2)
SOURCES = {"sample": f"{SAMPLE} sentences of the built-in corpus", "corpus": f"The whole built-in corpus ({len(CORPUS)})",
           "sidebar": "The sidebar's sentences", "upload": "An uploaded .txt"}
ENGINE = {"minilm": "scratch", "scratch": "scratch", "untrained": "untrained",  # the sidebar's model on our engine
          **{t: t for t in TRAINED}}


def corpus_sample() -> list[str]:
    """``SAMPLE`` sentences spread evenly over the built-in corpus, the same every time."""
    return [CORPUS[i] for i in np.linspace(0, len(CORPUS) - 1, SAMPLE).round().astype(int)]


def pruning_sentences(s: Settings) -> tuple[str, list[str]]:
    """The sentences the user picks to measure heads on, and the source's key. A trained decoder is
    measured on its training's held-out sequences, which are written in its own tokens."""
    if s.choice in TRAINED:
        job = trained_job()
        if job is not None and job.id == s.custom:
            st.caption(f"Measured on the training's {len(job.run.held_out)} held-out sequences (a half, then the "
                       "same half again), written in the model's own tokens.")
            return "held_out", list(job.run.held_out)
    source = bound(st.segmented_control, "prune_on", "sample", init="default", options=list(SOURCES), cast=str,
                   label="Sentences to measure on", format_func=SOURCES.get, required=True)
    sentences = (corpus_sample() if source == "sample" else CORPUS if source == "corpus"
                 else s.sentences if source == "sidebar" else uploaded_sentences())
    if len(sentences) > MAX_SENTENCES:
        st.warning(f"Measuring on the first {MAX_SENTENCES} of {len(sentences)} sentences: each step of the "
                   "curve measures every remaining head on every sentence.")
        sentences = sentences[:MAX_SENTENCES]
    if len(sentences) < 2:
        st.info("Pruning compares sentences with each other, so it needs at least two: type more lines in "
                "the sidebar, or measure on the built-in corpus.")
        st.stop()
    return source, sentences


def engine_choice(s: Settings) -> str:
    """The sidebar's model on the from-scratch engine, which alone can switch heads off and prune."""
    if s.choice not in ENGINE:
        st.info(f"Pruning runs on the from-scratch engine, which holds BERT encoders. The sidebar's model is "
                f"{MODELS[s.choice].split(' · ')[0].lower()}; choose all-MiniLM-L6-v2 or the untrained encoder there.")
        st.stop()
    return ENGINE[s.choice]


@dataclass
class Importance:
    frame: pd.DataFrame          # head_importance
    means: np.ndarray | None     # each head's mean output, for mean ablation
    full: np.ndarray             # the full model's embeddings of the sentences


@st.cache_resource
def pruning_cache() -> SharedCache:
    """Importance and curves for every session; values are only ever read."""
    return SharedCache(max_entries=12)


def engine_custom(choice: str, s: Settings) -> str:
    """What names the model beyond its choice on this page: a trained run's id, else nothing."""
    return s.custom if choice in TRAINED else ""


def _key(kind: str, choice: str, s: Settings, ablation: str, sentences: list[str]) -> tuple:
    digest = hashlib.sha256("\n".join(sentences).encode("utf-8", "surrogatepass")).hexdigest()
    return kind, choice, engine_custom(choice, s), s.device, ablation, digest


class Bar:
    """A progress bar that redraws at most every quarter second, with the time left estimated."""

    def __init__(self, text: str):
        self.text, self.start, self.shown = text, time.perf_counter(), 0.0
        self.bar = st.progress(0.0, text=f"{text}…")

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.shown < 0.25 and done < total:
            return
        self.shown = now
        share = done / max(total, 1)
        left = (now - self.start) * (1 - share) / share if share > 0.02 else None
        self.bar.progress(min(share, 1.0), text=f"{self.text}… {share:.0%}"
                          + (f", about {left:.0f} s left" if left is not None else ""))

    def empty(self) -> None:
        self.bar.empty()


def importance(choice: str, s: Settings, ablation: str, sentences: list[str]) -> Importance:
    """Every head's ablation importance on ``sentences``, with a progress bar while it runs."""
    def compute() -> Importance:
        model = cached_model(choice, engine_custom(choice, s), s.device)
        bar = Bar(f"Switching each of {model.n_layers * model.n_heads} heads off in turn, on {len(sentences)} sentences")
        means = model.head_means(sentences) if ablation == "mean" else None
        full = model.embed(sentences)
        frame = head_importance(model, sentences, ablation=ablation, head_means=means, reference=full, progress=bar)
        bar.empty()
        for array in (full, means):
            if array is not None:
                array.flags.writeable = False
        return Importance(frame, means, full)

    model_for(choice, engine_custom(choice, s), s.device)
    return computed_once(pruning_cache(), _key("importance", choice, s, ablation, sentences), compute,
                 "Another session is measuring the same heads; its result will be shown here…")


def curves(choice: str, s: Settings, ablation: str, sentences: list[str], imp: Importance) -> pd.DataFrame:
    """The pruning curves by importance, at random (``SEEDS``) and by attention alone."""
    def compute() -> pd.DataFrame:
        model = cached_model(choice, engine_custom(choice, s), s.device)
        proxies = proxy_table(choice, s, sentences)
        counts = prune_counts(model.n_layers * model.n_heads)
        n = len(sentences)
        runs = [("importance", 0), *(("random", seed) for seed in SEEDS), ("proxy", 0)]
        works = [curve_work(model, n, counts, order) for order, _ in runs]
        bar = Bar(f"Pruning 10% of the heads at a time, {len(runs)} ways, on {n} sentences")
        frames = []
        for i, (order, seed) in enumerate(runs):
            base = sum(works[:i])
            frames.append(pruning_curve(model, sentences, order=order, seed=seed, ablation=ablation,
                                        head_means=imp.means, proxies=proxies,
                                        progress=lambda done, _, base=base: bar(base + done, sum(works))))
        bar.empty()
        return pd.concat(frames, ignore_index=True)

    return computed_once(pruning_cache(), _key("curves", choice, s, ablation, sentences), compute,
                 "Another session is computing the same curves; they will be shown here…").copy()


def has_curves(choice: str, s: Settings, ablation: str, sentences: list[str]) -> bool:
    return pruning_cache().get(_key("curves", choice, s, ablation, sentences)) is not None


def proxy_table(choice: str, s: Settings, sentences: list[str]) -> pd.DataFrame:
    """Attention-only measures of each head on ``sentences`` (entropy, weight on special tokens)."""
    def compute() -> pd.DataFrame:
        model = cached_model(choice, engine_custom(choice, s), s.device)
        return attention_proxies(model.attend(sentences))

    return computed_once(pruning_cache(), _key("proxies", choice, s, "", sentences), compute,
                         "Measuring attention…").copy()


def correlations(imp: Importance, proxies: pd.DataFrame, labels: list[str] | None) -> pd.DataFrame:
    table = proxies.copy()
    if labels is not None:
        table["label"] = labels
    return proxy_correlations(imp.frame, table)


def pruned_zip(model: AttentionModel, heads: list[tuple[int, int]], means: np.ndarray | None) -> bytes:
    """The pruned model as a ZIP of its folder (safetensors, config.json, tokenizer)."""
    return model_zip(model.pruned(heads, head_means=means), "headlens-pruned")

