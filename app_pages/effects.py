"""Effects: which heads make a prediction, by direct logit attribution and activation patching."""
import numpy as np
import pandas as pd
import streamlit as st

from analysis import make_view
from analysis.views import token_label
from analysis.effects import METHODS, grid
from app_pages.ui.caches import cached_attention
from app_pages.ui.detector import NAMES, detected
from app_pages.ui.effects import effects, frame_csv, parts_frame, per_position, pick_pair
from app_pages.ui.exports import chart, exports
from app_pages.ui.models import LLM, TRAINED, model_for, scratch_twin
from app_pages.ui.settings import settings
from app_pages.ui.training import trained_job
from app_pages.ui.state import bound, choose, flag, fresh_click, head_from_url, head_to_url
from analysis.detector import DETECTORS
from models import head_label
from viz import head_heatmap
from viz.effects import effect_grid, parts_bars, position_grid

ABOUT = ("Which heads make this prediction? Direct logit attribution splits the clean prompt's logit difference, "
         "logit(answer) − logit(distractor) at its last token, into what each head writes there, read through the "
         "final norm (its scale frozen at the model's own value) and the unembedding: the parts add up to the "
         "model's own difference. Activation patching runs the corrupted prompt with one head's output taken from the "
         "clean run and reports the share of the difference that comes back: 1 brings the clean answer back whole, "
         "0 changes nothing, below 0 pushes further away.")
SHORT = {"exact": "Exact patching", "attribution": "Attribution patching (a fast estimate)"}
TOP_HEADS = 12  # heads shown position by position

s = settings()
st.title("Effects")
st.caption(ABOUT)
ref = scratch_twin(s.model) or s.model  # the same weights on our engine, which reads and patches each head
model = model_for(ref)
stack = getattr(model, "stack", None)
if stack is None or not stack.language_model:
    st.info(f"Effects are read through a language model's unembedding, and {s.model.title} has none: it is an "
            "encoder. Choose SmolLM2-135M-Instruct in the sidebar, or a decoder you trained on the Train page.")
    st.stop()
pair = pick_pair(ref, model)
method = bound(st.segmented_control, "effects_method", "exact", init="default", options=list(METHODS), cast=str,
               label="Patching", format_func=SHORT.get, required=True,
               help="Exact: the corrupted prompt rerun once per head, all the heads of a layer at once, each copy "
                    "recomputing only the layers above it (about 3 s for SmolLM2's 270 heads on two cores). "
                    "Attribution patching (Nanda 2023): one forward and one backward pass, a first-order estimate "
                    "of every patch.")
found = effects(ref, pair, method)
att, heads, residual = found.attribution, found.heads, found.residual
L, H = model.n_layers, model.n_heads
answer, distractor = att.attrs["answer"], att.attrs["distractor"]
cols = st.columns(4)
cols[0].metric("Clean", f"{heads.attrs['ld_clean']:+.2f}",
               help=f"The logit difference logit(“{answer}”) − logit(“{distractor}”) after the clean prompt.")
cols[1].metric("Corrupted", f"{heads.attrs['ld_corrupted']:+.2f}", help="The same after the corrupted prompt.")
cols[2].metric("By the heads", f"{att['attribution'].sum():+.2f}",
               help="The heads' direct share of the clean difference; the MLPs, the embeddings and the biases "
                    "write the rest (the bars below).")
best = heads.loc[heads["recovered"].idxmax()]
cols[3].metric("Best head", head_label(best["layer"], best["head"]),
               help=f"Patching this head alone brings back {best['recovered']:.2f} of the difference.")

attribution_values = att["attribution"].to_numpy().reshape(L, H)
recovered = grid(heads, "recovered", L, H)
ranked = heads.reindex(heads["recovered"].abs().sort_values(ascending=False).index)
picks = list(zip(ranked["layer"].tolist(), ranked["head"].tolist()))
clicked = st.session_state.pop("_effects_click", None)  # a click on a grid, made in the run before
if clicked in picks:
    st.session_state["effects_head"] = clicked
layer, head = choose("Head", picks, "effects_head", cast=head_from_url, to_url=head_to_url,
                     format_func=lambda h: f"{head_label(*h)} · recovered {recovered[h]:+.2f} · attribution "
                                           f"{attribution_values[h]:+.2f}",
                     help="Heads in order of the share patching recovers, largest in size first; a click on either "
                          "grid picks one too.")
label = "Patching, estimated" if method == "attribution" else "Patching"
left, right = st.columns(2)
events = []
with left:
    fig_attr = effect_grid(attribution_values, value_name="logits", selected=(layer, head),
                           title=f"Direct logit attribution · logit(“{answer}”) − logit(“{distractor}”)")
    events.append(("effects-attribution", chart(fig_attr, "effects-attribution", on_select="rerun",
                                                selection_mode="points")))
with right:
    fig_patch = effect_grid(recovered, value_name="recovered", selected=(layer, head),
                            title=f"{label} · share of the logit difference recovered")
    events.append(("effects-patching", chart(fig_patch, "effects-patching", on_select="rerun",
                                             selection_mode="points")))
st.caption("Both grids are centred on zero: red raises the answer over the distractor, blue lowers it. Hover a "
           "cell for its value; click a head to open it below.")
strongest = ranked.head(10)
st.dataframe(pd.DataFrame({"head": [head_label(r.layer, r.head) for r in strongest.itertuples()],
                           "recovered": strongest["recovered"].to_numpy(),
                           "attribution (logits)": attribution_values[strongest["layer"], strongest["head"]]}
                          ).style.format(precision=3), hide_index=True, key="effects-strongest")
for key, event in events:
    point = fresh_click(event, key)
    if point is not None and point.get("curve_number") == 1 and "point_index" in point:  # the "heads" markers
        st.session_state["_effects_click"] = tuple(int(x) for x in divmod(int(point["point_index"]), H))
        st.rerun()

a = att.attrs
top = att.reindex(att["attribution"].abs().sort_values(ascending=False).index).head(6)
parts = {head_label(r.layer, r.head): float(r.attribution) for r in top.itertuples()}
parts["other heads"] = float(att["attribution"].sum() - top["attribution"].sum())
parts["MLPs"] = float(sum(a["mlp"]))
parts["embeddings"] = float(a["embeddings"])
if any(a["attention_bias"]):
    parts["attention biases"] = float(sum(a["attention_bias"]))
if a["final_norm"]:
    parts["final norm's bias"] = float(a["final_norm"])
left, right = st.columns(2)
with left:
    fig_parts = parts_bars(parts, title=f"Where the clean difference of {a['logit_diff']:+.2f} comes from")
    chart(fig_parts, "effects-parts")
with right:
    tokens = [token_label(c) if c == k else f"{token_label(c)}/{token_label(k)}"  # clean/corrupted where they differ
              for c, k in zip(att.attrs["tokens"], residual.attrs["tokens"])]
    values = residual.pivot(index="layer", columns="position", values="recovered").to_numpy()
    fig_resid = position_grid(values, tokens, title="The residual stream entering each layer, patched at one "
                                                    "position")
    chart(fig_resid, "effects-residual")
st.caption("The residual stream patched from the clean run at one position and layer (TransformerLens's first "
           "picture): where the information that decides the answer sits, layer by layer. Positions where the two "
           "prompts agree carry nothing until a layer has mixed the difference into them.")

st.subheader(f"{head_label(layer, head)} on both prompts")
views = [make_view(cached_attention(model, ref, text, False, ()), hide_special=s.hide_special)
         for text in (pair.clean, pair.corrupted)]
left, right = st.columns(2)
for col, v, what in ((left, views[0], "clean"), (right, views[1], "corrupted")):
    with col:
        chart(head_heatmap(v.head(layer, head), v.query_labels, v.key_labels, visible=v.visible(),
                           title=f"{head_label(layer, head)} · {what} prompt"), f"effects-head-{what}")
said = f"{head_label(layer, head)}: recovers {recovered[layer, head]:+.3f} of the difference, writes " \
       f"{attribution_values[layer, head]:+.3f} logits directly."
job = trained_job() if ref.choice in TRAINED else None
if job is not None and job.run is not None:  # the training's own scores, on its held-out sequences
    last = job.run.history.query("layer == @layer and head == @head").tail(1)
    if len(last):
        said += (f" On the training's held-out sequences at step {int(last['step'].iloc[0]):,}: previous token "
                 f"{last['prev_token'].iloc[0]:.2f}, induction {last['induction'].iloc[0]:.2f}.")
elif ref.choice in LLM:
    scores = detected(ref).set_index(["layer", "head"]).loc[(layer, head)]
    said += f" Head detector: **{scores['label']}**; " + "; ".join(
        f"{NAMES[n]} {scores[n]:.2f} ({scores[f'{n}_lo']:.2f}–{scores[f'{n}_hi']:.2f})" for n in DETECTORS) + "."
st.caption(said)

st.subheader("Position by position")
if bound(st.toggle, "effects_positions", False, cast=flag, label="Patch every head at each position on its own",
         help="One copy of the corrupted prompt per head and position; positions where both prompts' activations "
              "are equal cost nothing, since a patch there changes nothing."):
    positions = per_position(ref, pair, method)
    strongest = [(int(r.layer), int(r.head)) for r in ranked.head(TOP_HEADS).itertuples()]
    by_head = positions.set_index(["layer", "head", "position"])["recovered"]
    values = np.array([[by_head[(l, h, p)] for p in range(len(tokens))] for l, h in strongest])
    chart(position_grid(values, tokens, rows=[head_label(*h) for h in strongest],
                        title=f"The {len(strongest)} heads that recover most, patched at one position"),
          "effects-positions")
    st.download_button("Every head at each position · CSV", lambda: frame_csv(positions),
                       "headlens-effects-positions.csv", "text/csv", key="effects-positions-csv", on_click="ignore")

st.subheader("Downloads")
table = pd.DataFrame({"layer": heads["layer"], "head": heads["head"], "recovered": heads["recovered"],
                      "attribution": att["attribution"]})
cols = st.columns(3)
cols[0].download_button("Patching and attribution per head · CSV", lambda: frame_csv(table),
                        "headlens-effects-heads.csv", "text/csv", key="effects-heads-csv", on_click="ignore")
cols[1].download_button("Every part of the attribution · CSV", lambda: frame_csv(parts_frame(att)),
                        "headlens-effects-parts.csv", "text/csv", key="effects-parts-csv", on_click="ignore")
cols[2].download_button("Residual stream patching · CSV", lambda: frame_csv(residual),
                        "headlens-effects-residual.csv", "text/csv", key="effects-residual-csv", on_click="ignore")
sig = f"{pair.clean}|{pair.corrupted}|{pair.answer}|{pair.distractor}|{method}"
for key, fig in (("effects-attribution", fig_attr), ("effects-patching", fig_patch), ("effects-residual", fig_resid)):
    st.caption({"effects-attribution": "Attribution grid", "effects-patching": "Patching grid",
                "effects-residual": "Residual stream"}[key])
    exports(key, fig, None, sig=sig)
