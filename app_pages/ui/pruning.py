"""Head importance and pruning curves: computed once for every session, with a progress bar."""
from __future__ import annotations


import numpy as np
import pandas as pd
import streamlit as st

from analysis.defaults import PRUNING_RANK
from analysis.pruning.ablation import ABLATIONS, NEIGHBOURS
from analysis.pruning.importance import most_important_with_a_later_layer, proxy_correlations
from analysis.pruning.curves import ORDERS, point_comparison
from models import AttentionModel, Head, HeadLensError, head_label
from models.corpus import CORPUS, corpus_sample

from ..results.models import LLM, TRAINED
from viz.pruning import head_values_grid

from ..results.messages import stop_with
from ..results.pruning import Importance, LLM_SAMPLE, SAMPLE, switched_off
from .exports import chart, model_zip
from .uploads import uploaded_sentences
from .settings import Settings
from .state import bound, head_from_url, head_to_url
from ..results.models import trained_job

ABOUT = {
    "page": "A head's importance is what removing it alone does to the model's output: one minus the cosine of each "
            "sentence's embedding (the mean of the last layer over its tokens, as all-MiniLM-L6-v2 is trained to give) "
            "to the full model's, averaged over the sentences. The curves prune 10% of the heads at a time, as Michel "
            "et al. (2019) do: by importance, recomputed on the pruned model at each step (on "
            f"{PRUNING_RANK} of the sentences, evenly spread, when there are more; every pruned model is measured on "
            "all of them); at random; and by attention alone.",
    "llm": "This model is measured by what it does, predicting the next token: a head's importance is the rise of "
           "the next-token loss (nats per token) when it alone is switched off, or by gradient, |dL/d(mask of the "
           "head)| as Michel et al. (2019) define it, one backward pass for every head. The curve by importance "
           "re-measures by gradient after each step. A pruned model is measured by its loss and by top-1 agreement: "
           "the share of next-token predictions equal to the full model's. Pruning removes query heads; a key/value "
           "head goes only with the last of the query heads that share it.",
    "engine": "This page runs the from-scratch engine with the same weights: it can remove heads, which "
              "transformers no longer does, and gives the same numbers.",
    "ablation": " ".join(f"{v}." for v in ABLATIONS.values()) + " Mean ablation disturbs the later layers less; a "
                "model pruned that way keeps the means in its output bias.",
    "grid": "Darker heads matter more. The heads marked ✕ (grey) are those the curve by importance has removed at the "
            "chosen point; it re-measures the remaining heads after each step, so a head pale here can stay when its "
            "neighbours go. Hover a cell for its value and rank.",
    "curves": f"Fidelity: mean cosine of each sentence's embedding to the full model's. Neighbour agreement: the "
              f"overlap of each sentence's {NEIGHBOURS} nearest neighbours (by embedding) with the full model's. "
              "Forward time: seconds to embed the sentences, measured once per step while the curves ran, so it is "
              "noisy; `python -m bench.bench_pruning` measures it properly.",
    "llm_curves": "Next-token loss: the mean cross-entropy of each next token of the sentences, in nats. Top-1 "
                  "agreement: the share of next-token predictions equal to the full model's. Forward time: seconds "
                  "to run the sentences, measured once per step while the curves ran, so it is noisy.",
    "zip": "safetensors, a config.json recording the pruned heads, and the tokenizer. Unzip it and open the folder "
           "with models.load_model(folder, backend='scratch').",
    "proxies": "Spearman's rank correlation over the heads between importance and what attention alone shows: how "
               "spread out a head's attention is, how much of it goes to [CLS] and [SEP], and its role on Head roles "
               "(each head scored by the mean importance of the other heads with its role). The curve \"by attention "
               "alone\" removes the heads with the most weight on [CLS] and [SEP] first.",
    "change": "Each head's change is half the summed absolute difference of its weights, per query row, averaged over "
              "rows and sentences: 0 unchanged, 1 looking somewhere else entirely. Layers before the first head "
              "switched off cannot change.",
}
MAX_SENTENCES = 400  # more would take many minutes: every step re-measures every remaining head
SOURCES = {"sample": f"{SAMPLE} sentences of the built-in corpus", "corpus": f"The whole built-in corpus ({len(CORPUS)})",
           "sidebar": "The sidebar's sentences", "upload": "An uploaded .txt"}
METHODS = {"ablation": "Switching it off", "gradient": "Gradient"}
# per measure: (column, name, help) of the two numbers a pruned model is judged by; the first is better lower for a loss
MEASURES = {
    "embedding": (("fidelity", "Fidelity", "Mean cosine to the full model's embeddings."),
                  ("agreement", "Neighbour agreement", f"Overlap of each sentence's {NEIGHBOURS} nearest neighbours.")),
    "loss": (("loss", "Next-token loss", "Mean cross-entropy of each next token, in nats; lower is better."),
             ("agreement", "Top-1 agreement", "Share of next-token predictions equal to the full model's.")),
}


def pruning_sentences(s: Settings) -> tuple[str, list[str]]:
    """The sentences the user picks to measure heads on, and the source's key. A trained decoder is
    measured on its training's held-out sequences, which are written in its own tokens."""
    if s.model.choice in TRAINED:
        job = trained_job()
        if job is not None and job.id == s.model.run:
            st.caption(f"Measured on the training's {len(job.run.held_out)} held-out sequences (a half, then the "
                       "same half again), written in the model's own tokens.")
            return "held_out", list(job.run.held_out)
    llm = s.model.choice in LLM
    sources = {**SOURCES, "sample": f"{LLM_SAMPLE} sentences of the built-in corpus"} if llm else SOURCES
    source = bound(st.segmented_control, "prune_on", "sample", init="default", options=list(sources), cast=str,
                   label="Sentences to measure on", format_func=sources.get, required=True)
    sample = LLM_SAMPLE if llm else SAMPLE
    sentences = (corpus_sample(sample) if source == "sample" else list(CORPUS) if source == "corpus"
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


def correlations(imp: Importance, proxies: pd.DataFrame, labels: list[str] | None) -> pd.DataFrame:
    table = proxies.copy()
    if labels is not None:
        table["label"] = labels
    return proxy_correlations(imp.frame, table)


def pruned_zip(model: AttentionModel, heads: list[Head], means: np.ndarray | None) -> bytes:
    """The pruned model as a ZIP of its folder (safetensors, config.json, tokenizer)."""
    return model_zip(model.pruned(heads, head_means=means), "headlens-pruned")


def curves_csv(frame: pd.DataFrame) -> str:
    """The pruning curves as CSV, each step's pruned heads named as the page names them."""
    return frame.assign(heads=frame["heads"].map(lambda heads: ", ".join(head_label(*h) for h in heads))).to_csv(
        index=False)


def show_point(summary: pd.DataFrame, at: int, measure: str) -> None:
    """The pruned model at ``at`` heads, by importance against random order: metrics, and every order in a table."""
    point = point_comparison(summary, at).set_index("order")
    by_imp, rand = point.loc["importance"], point.loc["random"]
    columns = st.columns(3)
    for col, (column, name, about), digits in zip(columns, MEASURES[measure], (3, 2)):
        col.metric(name, f"{by_imp[column]:.{digits}f}", f"{by_imp[column] - rand[column]:+.{digits}f} vs random",
                   help=about, delta_color="inverse" if column == "loss" else "normal")
    columns[2].metric("Forward time", f"{by_imp.speed:.2f} × full",
                      help=f"{by_imp.forward_s:.2f} s against {by_imp.forward_s / by_imp.speed:.2f} s for the full "
                           "model.")
    st.dataframe(pd.DataFrame({"pruned": [ORDERS[o] for o in point.index],
                               **{name.lower(): point[column].round(4) for column, name, _ in MEASURES[measure]},
                               "forward time / full": point["speed"].round(2)}), hide_index=True, key="prune-point")


def how_to_measure(measure: str) -> tuple[str, str]:
    """``(method, ablation)`` the user picks: a language model's loss by gradient or by switching each head off (to
    zero: Llama's attention has no output bias to hold a pruned head's mean); an embedding's by switching each off,
    to its mean or to zero."""
    if measure == "loss":  # Llama's attention has no output bias to hold a pruned head's mean
        ablation = "zero"
        left, _ = st.columns([1, 2])
        method = bound(left.segmented_control, "method", "gradient", init="default", options=list(METHODS),
                       cast=str, label="Measure a head's importance by", format_func=METHODS.get, required=True,
                       help="Gradient: one backward pass for every head. Switching each head off in turn: one pass "
                            "per head, about two minutes for 24 sentences on two CPU cores.")
    else:
        method = "ablation"
        ablation = bound(st.segmented_control, "ablation", "mean", init="default", options=list(ABLATIONS),
                         cast=str, label="Switch a head off by", format_func=lambda a: ABLATIONS[a].split(":")[0],
                         required=True, help=ABOUT["ablation"])
    return method, ablation


def switch_off(s: Settings, ref, model: AttentionModel, imp: Importance, measured_on: list[str], ablation: str,
               method: str) -> None:
    """The page's last section: heads the user picks switched off together, and what changes."""
    st.subheader("Switch heads off")
    heads = [(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
    off = bound(st.multiselect, "ablate", [most_important_with_a_later_layer(imp.frame)], init="default",
                options=heads, multi=True, cast=head_from_url, to_url=head_to_url, format_func=lambda h: head_label(*h),
                label="Heads to switch off together", placeholder="L0 H0",
                help="Measured on the sidebar's sentences, with the ablation chosen above.")
    if not off:
        st.info("Pick heads to switch off; at first the most important head before the last layer is picked.")
        st.stop()
    try:
        effect = switched_off(ref, measured_on, s.sentences, off, ablation, method)
    except HeadLensError as err:
        stop_with(err)
    off_names = ", ".join(head_label(*h) for h in off)
    change = head_values_grid(effect.attention_change, marked=np.isnan(effect.attention_change), mark="off",
                              digits=2, title=f"Change in each head's attention · {off_names} off", value_name="change")
    chart(change, "prune-ablate-grid")
    st.caption(ABOUT["change"])
    per_sentence = {"cosine to the full model": effect.cosine.round(4)}
    if effect.sentence_losses is not None:
        per_sentence = {"loss, every head": effect.sentence_losses[:, 0].round(4),
                        "loss, these heads off": effect.sentence_losses[:, 1].round(4), **per_sentence}
    st.dataframe(pd.DataFrame({"sentence": s.sentences, **per_sentence}), hide_index=True,
                 key="prune-ablate-cosines")
    if effect.loss is not None:
        st.caption(f"Loss {effect.loss:.4f} with these heads off; {effect.full_loss:.4f} with every head.")
