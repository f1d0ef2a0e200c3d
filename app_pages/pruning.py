"""Pruning: which heads matter, measured by switching each one off, and how far the model prunes."""
import dataclasses

import numpy as np
import pandas as pd
import streamlit as st

from analysis.importance import ABLATIONS, NEIGHBOURS, ORDERS, ablate, curve_summary, prune_counts
from app_pages.ui.caches import model_for
from app_pages.ui.exports import chart, exports
from app_pages.ui.messages import stop_with
from app_pages.ui.profiles import profile
from app_pages.ui.pruning import (correlations, curves, engine_choice, engine_custom, importance, has_curves,
                                  pruned_zip, proxy_table, pruning_sentences)
from app_pages.ui.settings import settings
from app_pages.ui.state import bound
from models import HeadLensError
from viz.pruning import head_values_grid, pruning_curves

s = settings()
st.title("Pruning")
st.caption("A head's importance is what removing it alone does to the model's output: one minus the cosine of each "
           "sentence's embedding (the mean of the last layer over its tokens, as all-MiniLM-L6-v2 is trained to give) "
           "to the full model's, averaged over the sentences. The curves prune 10% of the heads at a time, as Michel "
           "et al. (2019) do: by importance, recomputed on the pruned model at each step; at random; and by attention "
           "alone.")
choice = engine_choice(s)
model = model_for(choice, engine_custom(choice, s), s.device)
notes = []
if s.choice == "minilm":
    notes.append("This page runs the from-scratch engine with the same weights: it can remove heads, which "
                 "transformers no longer does, and gives the same numbers.")
if s.heads_off or s.causal:
    notes.append("The sidebar's switched-off heads and causal mask do not apply here; this page switches heads off itself.")
if notes:
    st.caption(" ".join(notes))
source, sentences = pruning_sentences(s)
ablation = bound(st.segmented_control, "ablation", "mean", init="default", options=list(ABLATIONS), cast=str,
                 label="Switch a head off by", format_func=lambda a: ABLATIONS[a].split(":")[0], required=True,
                 help=" ".join(f"{v}." for v in ABLATIONS.values()) + " Mean ablation disturbs the later layers "
                      "less; a model pruned that way keeps the means in its output bias.")
if len(sentences) <= NEIGHBOURS:
    st.caption(f"With {len(sentences)} sentences, neighbour agreement compares each sentence's "
               f"{len(sentences) - 1} nearest neighbours instead of {NEIGHBOURS}.")

total = model.n_layers * model.n_heads
counts = prune_counts(total)
at = bound(st.select_slider, "prune_to", counts[min(4, len(counts) - 1)], options=counts, cast=int,
           label="Prune to", format_func=lambda c: f"{c / total:.0%} ({c} heads)",
           help="The share of heads removed, by importance; the curves and the grid show that point.")

imp = importance(choice, s, ablation, sentences)
values = imp.frame["importance"].to_numpy().reshape(model.n_layers, model.n_heads)
grid_title = f"Importance · {len(sentences)} sentences · {ablation} ablation"
slot = st.empty()
if not has_curves(choice, s, ablation, sentences):  # the grid now, the curves below it once they are computed
    with slot:
        chart(head_values_grid(values, title=grid_title), "prune-grid-first")
frame = curves(choice, s, ablation, sentences, imp)
summary = curve_summary(frame)
point = frame[(frame["order"] == "importance") & (frame["n_pruned"] == at)].iloc[0]
pruned = [tuple(map(int, name.split("."))) for name in point["heads"]]
marked = np.zeros_like(values, dtype=bool)
for layer, head in pruned:
    marked[layer, head] = True
grid = head_values_grid(values, marked=marked, mark_text="✕", title=f"{grid_title} · ✕: pruned at {at / total:.0%}")
with slot:
    chart(grid, "prune-grid")
st.caption("Darker heads matter more. The heads marked ✕ (grey) are those the curve by importance has removed at the chosen "
           "point; it re-measures the remaining heads after each step, so a head pale here can stay when its "
           "neighbours go. Hover a cell for its value and rank.")

st.subheader(f"Pruned to {at / total:.0%}: {at} of {total} heads removed")
fig = pruning_curves(summary, at=at / total, title=f"Pruning curves · {len(sentences)} sentences · {ablation} ablation")
chart(fig, "prune-curves")
st.caption(f"Fidelity: mean cosine of each sentence's embedding to the full model's. Neighbour agreement: the overlap "
           f"of each sentence's {NEIGHBOURS} nearest neighbours (by embedding) with the full model's. Forward time: "
           "seconds to embed the sentences, measured once per step while the curves ran, so it is noisy; "
           "`python -m bench.bench_pruning` measures it properly.")
here = summary[summary["n_pruned"] == at].set_index("order")
full_s = summary[summary["n_pruned"] == 0].set_index("order")["forward_s"]
by_imp = here.loc["importance"]
a, b, c = st.columns(3)
a.metric("Fidelity", f"{by_imp.fidelity:.3f}", f"{by_imp.fidelity - here.loc['random'].fidelity:+.3f} vs random",
         help="Mean cosine to the full model's embeddings.")
b.metric("Neighbour agreement", f"{by_imp.agreement:.2f}",
         f"{by_imp.agreement - here.loc['random'].agreement:+.2f} vs random")
c.metric("Forward time", f"{by_imp.forward_s / full_s['importance']:.2f} × full",
         help=f"{by_imp.forward_s:.2f} s against {full_s['importance']:.2f} s for the full model.")
table = pd.DataFrame({"pruned": [ORDERS[o] for o in here.index], "fidelity": here["fidelity"].round(4),
                      "neighbour agreement": here["agreement"].round(3),
                      "forward time / full": (here["forward_s"] / full_s.reindex(here.index)).round(2)})
st.dataframe(table, hide_index=True, key="prune-point")

st.markdown("**The pruned model**")
if pruned:
    st.caption("Removed: " + ", ".join(f"L{l}H{h}" for l, h in sorted(pruned)) + ".")
left, mid, right = st.columns(3)
left.download_button(
    "Pruned model · ZIP", lambda: pruned_zip(model, pruned, imp.means), f"headlens-pruned-{at}-heads.zip",
    "application/zip", key="prune-zip", on_click="ignore", disabled=not pruned,
    help="safetensors, a config.json recording the pruned heads, and the tokenizer. Unzip it and open the folder "
         "with models.load_model(folder, backend='scratch').")
mid.download_button("Importance · CSV", lambda: imp.frame.to_csv(index=False), "headlens-importance.csv", "text/csv",
                    key="prune-importance-csv", on_click="ignore")
right.download_button("Curves · CSV", lambda: frame.assign(heads=frame["heads"].map(" ".join)).to_csv(index=False),
                      "headlens-pruning-curves.csv", "text/csv", key="prune-curves-csv", on_click="ignore")
exports("pruning", fig, None, sig=f"{at}|{ablation}|{source}")

st.subheader("Importance against attention alone")
proxies = proxy_table(choice, s, sentences)
plain_s = dataclasses.replace(s, heads_off=(), causal=False)
roles, _, _ = profile(plain_s, sentences)
corr = correlations(imp, proxies, roles["label"].tolist())
st.dataframe(corr.assign(spearman=corr["spearman"].round(3), p_value=corr["p_value"].map("{:.2g}".format)),
             hide_index=True, key="prune-proxies")
by_role = (imp.frame.assign(role=roles["label"].to_numpy()).groupby("role")["importance"]
           .agg(["mean", "max", "size"]).rename(columns={"size": "heads"}).sort_values("mean", ascending=False)
           .reset_index())
st.dataframe(by_role.style.format({"mean": "{:.4f}", "max": "{:.4f}"}), hide_index=True, key="prune-roles",
             height=35 * (len(by_role) + 1) + 3, column_config={"role": st.column_config.TextColumn(width="medium")})
st.caption("Spearman's rank correlation over the heads between importance and what attention alone shows: how "
           "spread out a head's attention is, how much of it goes to [CLS] and [SEP], and its role on Head roles "
           "(each head scored by the mean importance of the other heads with its role). The curve \"by attention alone\" removes the heads "
           "with the most weight on [CLS] and [SEP] first.")

st.subheader("Switch heads off")
names = [f"{l}.{h}" for l in range(model.n_layers) for h in range(model.n_heads)]
# the most important head with a layer after it, so that there is a later layer to change
earlier = imp.frame[imp.frame["layer"] < model.n_layers - 1] if model.n_layers > 1 else imp.frame
top = earlier.sort_values("importance", ascending=False).iloc[0]
off = bound(st.multiselect, "ablate", [f"{int(top['layer'])}.{int(top['head'])}"], init="default", options=names, multi=True,
            label="Heads to switch off together", placeholder="layer.head",
            help="Measured on the sidebar's sentences, with the ablation chosen above.")
if not off:
    st.info("Pick heads to switch off; at first the most important head before the last layer is picked.")
    st.stop()
heads = [tuple(map(int, n.split("."))) for n in off]
try:
    effect = ablate(model, s.sentences, heads, ablation=ablation, head_means=imp.means)
except HeadLensError as err:
    stop_with(err)
change_title = "Change in each head's attention · " + ", ".join(f"L{l}H{h}" for l, h in heads) + " off"
change = head_values_grid(effect.attention_change, marked=np.isnan(effect.attention_change), mark="off",
                          title=change_title, value_name="change", digits=2)
chart(change, "prune-ablate-grid")
st.caption("Each head's change is half the summed absolute difference of its weights, per query row, averaged over "
           "rows and sentences: 0 unchanged, 1 looking somewhere else entirely. Layers before the first head "
           "switched off cannot change.")
st.dataframe(pd.DataFrame({"sentence": s.sentences, "cosine to the full model": effect.cosine.round(4)}),
             hide_index=True, key="prune-ablate-cosines")
if effect.loss is not None:
    st.caption(f"Loss {effect.loss:.4f} with these heads off; {effect.full_loss:.4f} with every head.")
