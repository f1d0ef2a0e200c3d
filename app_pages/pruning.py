"""Pruning: which heads matter, measured by switching each one off, and how far the model prunes."""
import dataclasses

import streamlit as st

from analysis import heads_marked
from analysis.pruning.ablation import NEIGHBOURS
from analysis.pruning.importance import importance_by_role
from analysis.pruning.curves import curve_summary, prune_counts
from app_pages.results.models import TRANSFORMERS
from app_pages.results.pruning import (
    FIRST_STEP,
    curves,
    importance,
    measure_of,
    proxy_table,
)
from app_pages.ui.exports import chart, exports
from app_pages.ui.models import model_for
from app_pages.ui.page import start
from app_pages.ui.profiles import profile
from app_pages.ui.pruning import (
    ABOUT,
    MEASURES,
    correlations,
    curves_csv,
    how_to_measure,
    pruned_zip,
    pruning_sentences,
    show_point,
    switch_off,
)
from app_pages.ui.state import bound
from models import head_label
from viz.pruning import head_values_grid, pruning_curves

s, ref = start("pruning")
measure = measure_of(ref)
st.caption(ABOUT["page"] if measure == "embedding" else ABOUT["llm"])
model = model_for(ref)
notes = [ABOUT["engine"]] if s.model.choice in TRANSFORMERS else []
if s.heads_off or s.causal:
    notes.append("The sidebar's switched-off heads and causal mask do not apply here; this page switches heads off "
                 "itself.")
if notes:
    st.caption(" ".join(notes))
source, sentences = pruning_sentences(s)
method, ablation = how_to_measure(measure)
if len(sentences) <= NEIGHBOURS and measure == "embedding":
    st.caption(f"With {len(sentences)} sentences, neighbour agreement compares each sentence's "
               f"{len(sentences) - 1} nearest neighbours instead of {NEIGHBOURS}.")

total = model.n_layers * model.n_heads
counts = prune_counts(total)
at = bound(st.select_slider, "prune_to", counts[min(4, len(counts) - 1)], options=counts, cast=int,
           label="Prune to", format_func=lambda c: f"{c / total:.0%} ({c} heads)",
           help="The share of heads removed, by importance; the curves and the grid show that point.")

# on a cold server, each head measured on the first sentences first; the page then measures on those throughout
_, _, measured_on, _ = importance.now(ref, ablation, sentences, method)
first_form = len(measured_on) < len(sentences)
imp = importance(ref, ablation, measured_on, method)
values = imp.frame["importance"].to_numpy().reshape(model.n_layers, model.n_heads)
grid_title = f"Importance · {len(measured_on)} sentences · " + (f"{ablation} ablation" if method == "ablation"
                                                                else "gradient of the loss")
slot = st.empty()
# the curves at 3 sizes first: with the first importance (its full curves are not asked for), or while the full
# curves are computed
shown = ((ref, ablation, measured_on, method, FIRST_STEP) if first_form else
         curves.now(ref, ablation, measured_on, method))
if curves.peek(*shown) is None:  # the grid now, the curves below it once they are computed
    with slot:
        chart(head_values_grid(values, title=grid_title), "prune-grid-first")
frame = curves(*shown)
summary = curve_summary(frame)
sizes = sorted(set(frame["n_pruned"]))
if at not in sizes:  # the first form's sizes: the nearest of them
    at = min(sizes, key=lambda c: (abs(c - at), c))
    st.caption(f"The first curves have {len(sizes)} sizes: shown at {at / total:.0%} ({at} heads) until the "
               "full ones are ready.")
pruned = frame[(frame["order"] == "importance") & (frame["n_pruned"] == at)].iloc[0]["heads"]
grid = head_values_grid(values, marked=heads_marked(model.n_layers, model.n_heads, pruned), mark_text="✕",
                        title=f"{grid_title} · ✕: pruned at {at / total:.0%}")
with slot:
    chart(grid, "prune-grid")
st.caption(ABOUT["grid"])

st.subheader(f"Pruned to {at / total:.0%}: {at} of {total} heads removed")
fig = pruning_curves(summary, at=at / total, measures=MEASURES["loss"] if measure == "loss" else None,
                     title=f"Pruning curves · {len(shown[2])} sentences · {ablation} ablation")
chart(fig, "prune-curves")
st.caption(ABOUT["curves"] if measure == "embedding" else ABOUT["llm_curves"])
show_point(summary, at, measure)

st.markdown("**The pruned model**")
if pruned:
    st.caption("Removed: " + ", ".join(head_label(*h) for h in pruned) + ".")
left, mid, right = st.columns(3)
left.download_button("Pruned model · ZIP", lambda: pruned_zip(model, pruned, imp.means),
                     f"headlens-pruned-{at}-heads.zip", "application/zip", key="prune-zip", on_click="ignore",
                     disabled=not pruned, help=ABOUT["zip"])
mid.download_button("Importance · CSV", lambda: imp.frame.to_csv(index=False), "headlens-importance.csv", "text/csv",
                    key="prune-importance-csv", on_click="ignore")
right.download_button("Curves · CSV", lambda: curves_csv(frame), "headlens-pruning-curves.csv", "text/csv",
                      key="prune-curves-csv", on_click="ignore")
exports("pruning", fig, None, sig=f"{at}|{ablation}|{source}|{len(measured_on)}|{len(sizes)}")

st.subheader("Importance against attention alone")
roles, _, _ = profile(dataclasses.replace(s, heads_off=(), causal=False), measured_on)
corr = correlations(imp, proxy_table(ref, measured_on), roles["label"].tolist())
st.dataframe(corr.assign(spearman=corr["spearman"].round(3), p_value=corr["p_value"].map("{:.2g}".format)),
             hide_index=True, key="prune-proxies")
by_role = importance_by_role(imp.frame, roles["label"])
st.dataframe(by_role.style.format({"mean": "{:.4f}", "max": "{:.4f}"}), hide_index=True, key="prune-roles",
             height=35 * (len(by_role) + 1) + 3, column_config={"role": st.column_config.TextColumn(width="medium")})
st.caption(ABOUT["proxies"])

switch_off(s, ref, model, imp, measured_on, ablation, method)
