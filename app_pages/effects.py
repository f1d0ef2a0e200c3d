"""Effects: which heads make a prediction, by direct logit attribution and activation patching."""
import numpy as np
import pandas as pd
import streamlit as st

from analysis import make_view
from analysis.views import token_label
from analysis.effects import METHODS, grid
from analysis.routes import THRESHOLD, flow_graph, flow_heads, strongest_route
from scipy.stats import spearmanr
from app_pages.ui.detector import NAMES, detected
from app_pages.ui.effects import (copying, effects, flow, frame_csv, parts_frame, per_position, pick_pair,
                                  prompt_trace, vocabulary)
from app_pages.ui.exports import chart, exports
from app_pages.ui.models import LLM, TRAINED, model_for, twin
from app_pages.ui.settings import settings
from app_pages.ui.training import trained_job
from app_pages.ui.state import bound, choose, flag, fresh_click, head_from_url, head_to_url
from analysis.detector import DETECTORS
from models import head_label
from viz import head_heatmap
from viz.effects import effect_grid, flow_figure, parts_bars, position_grid, vocabulary_bars

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
ref = twin(s.model) or s.model  # the same weights on our engine, which reads and patches each head
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
for key, event in events[:2]:
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

st.subheader(f"{head_label(layer, head)}: where it looks and what it writes")
clean_tokens = att.attrs["tokens"]
at = bound(st.selectbox, "effects_at", len(clean_tokens) - 1, init="index", options=list(range(len(clean_tokens))),
           cast=int, label="What it writes at",
           format_func=lambda p: f"{p}: {token_label(clean_tokens[p])}" + (" · the prediction" if
                                                                          p == len(clean_tokens) - 1 else ""),
           help="The head's output at this token through the final norm (its scale frozen at the model's own "
                "value) and the unembedding: the logits it adds to each token of the vocabulary, the ten it "
                "raises most and the ten it lowers most.")
views = [make_view(prompt_trace(ref, text).attention(), hide_special=s.hide_special)
         for text in (pair.clean, pair.corrupted)]
words = {}
for v, text, what in ((views[0], pair.clean, "clean"), (views[1], pair.corrupted, "corrupted")):
    left, right = st.columns(2)
    with left:
        chart(head_heatmap(v.head(layer, head), v.query_labels, v.key_labels, visible=v.visible(layer),
                           title=f"{head_label(layer, head)} · {what} prompt"), f"effects-head-{what}")
    with right:
        words[what] = vocabulary(ref, text, layer, head, at)
        w = words[what]
        chart(vocabulary_bars(w, title=f"What {head_label(layer, head)} writes at “{token_label(w.attrs['at'])}” "
                                       f"({what})"), f"effects-vocabulary-{what}")
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
st.caption(said + " The bars: the logits its output adds at the chosen token, the ten tokens it raises most "
                  "(red) and lowers most (blue); on average it adds "
                  f"{words['clean'].attrs['mean']:+.3f} to every token.")

st.subheader("Which heads copy")
fig_copy = None
if bound(st.toggle, "effects_copying", False, cast=flag, label="Read every head's OV circuit over the vocabulary",
         help="Were a head to put all its weight on a token, would that token be among the five it raises most "
              "(it copies, Elhage et al. 2021) or lowers most (it suppresses copies, McDougall et al. 2023)? "
              "Measured on 200 tokens of the built-in corpus against the whole vocabulary; computed once per "
              "server (about 17 s for SmolLM2 on two cores)."):
    scores = copying(ref)
    copy_grid = scores["copying"].to_numpy().reshape(L, H)
    suppress_grid = scores["suppression"].to_numpy().reshape(L, H)
    tips = [[("pruned" if np.isnan(copy_grid[l, h]) else
              f"copies {copy_grid[l, h]:.0%} of tokens, suppresses {suppress_grid[l, h]:.0%}")
             for h in range(H)] for l in range(L)]
    left, right = st.columns(2)
    with left:
        fig_copy = effect_grid(copy_grid - suppress_grid, value_name="copying", zmax=1.0, selected=(layer, head),
                               tips=tips, title="Copying (red) and suppression (blue) of the tokens attended to")
        events.append(("effects-copying", chart(fig_copy, "effects-copying", on_select="rerun",
                                                selection_mode="points")))
    with right:
        ranked_copy = scores.dropna().assign(score=lambda f: f["copying"] - f["suppression"])
        ranked_copy = ranked_copy.reindex(ranked_copy["score"].abs().sort_values(ascending=False).index).head(12)
        st.dataframe(pd.DataFrame({"head": [head_label(r.layer, r.head) for r in ranked_copy.itertuples()],
                                   "copies": ranked_copy["copying"].to_numpy(),
                                   "suppresses": ranked_copy["suppression"].to_numpy(),
                                   "recovered": recovered[ranked_copy["layer"], ranked_copy["head"]]}
                                  ).style.format(precision=2), hide_index=True, key="effects-copying-table")
        a_ = scores.attrs
        st.caption(f"Over {a_['tokens']} tokens, each ranked against all {a_['vocabulary']:,}: by chance a head "
                   f"copies or suppresses {a_['chance']:.2%} of them. A click on a cell opens the head above.")
    st.download_button("Copying and suppression per head · CSV", lambda: frame_csv(scores),
                       "headlens-effects-copying.csv", "text/csv", key="effects-copying-csv", on_click="ignore")

st.subheader("How the prediction flows")
left, mid = st.columns(2)
with left:
    prompt_name = bound(st.segmented_control, "effects_flow_prompt", "clean", init="default",
                        options=["clean", "corrupted"], cast=str, label="Prompt", required=True)
text = pair.clean if prompt_name == "clean" else pair.corrupted
found_flow = flow(ref, text)
flow_tokens = found_flow.tokens
with mid:
    end = bound(st.selectbox, "effects_flow_at", len(flow_tokens) - 1, init="index",
                options=list(range(len(flow_tokens))), cast=int, label="Routes to",
                format_func=lambda p: f"{p}: {token_label(flow_tokens[p])}" + (
                    " · the prediction" if p == len(flow_tokens) - 1 else ""))
threshold = bound(st.slider, "effects_threshold", THRESHOLD, cast=float, label="Smallest share drawn",
                  min_value=0.01, max_value=0.5, step=0.01,
                  help="An edge is drawn when its part makes up at least this share of the update it writes "
                       "into (Ferrando & Voita 2024 and the LLM Transparency Tool use 0.04). Lower shows more "
                       "routes.")
graph = flow_graph(found_flow, end, threshold)
route = strongest_route(graph)
fig_flow = flow_figure(graph, [token_label(t) for t in flow_tokens], found_flow.n_layers, route=route,
                       title=f"The routes to “{token_label(flow_tokens[end])}” ({prompt_name} prompt), edges of at "
                             f"least {threshold:.2f} of an update")
events.append(("effects-flow", chart(fig_flow, "effects-flow", on_select="rerun", selection_mode="points")))
on_route = route[route["kind"] == "head"]
per_head = flow_heads(found_flow, end)  # every route, however small: what the drawn ones leave out counts too
strong = np.argsort(-per_head, axis=None, kind="stable")[:10]
strong = [divmod(int(i), H) for i in strong if per_head.flat[i] > 0]
varies = np.ptp(per_head) > 0 and np.ptp(recovered) > 0  # a rank correlation needs both to vary
rho = spearmanr(per_head.reshape(-1), np.abs(recovered).reshape(-1)).statistic if varies else float("nan")
route_said = ("; ".join(f"{head_label(r.layer, r.head)} from “{token_label(flow_tokens[r.source])}” "
                        f"({r.share:.2f})" for r in on_route.itertuples()) or "none: it stays in its token")
st.caption(f"One forward pass: each update of the residual stream split into what wrote it, each part's share "
           f"its closeness to the result (L1). {len(graph):,} edges reach the end at this threshold; the dotted "
           f"line is the strongest route through a head (its shares multiply to the most): {route_said}. Hover a "
           "line's middle for its heads and shares; a click on a head's line opens it above. How much of the end passes "
           "through each head (every route, however small, its shares multiplied) against the share patching "
           f"recovers (by size), over all heads: Spearman {'—' if np.isnan(rho) else f'{rho:.2f}'}. The routes "
           "read one prompt, patching the "
           "difference between two.")
if strong:
    st.dataframe(pd.DataFrame({"head": [head_label(*h) for h in strong],
                               "passes through it": [per_head[h] for h in strong],
                               "recovered by patching": [recovered[h] for h in strong]}).style.format(precision=3),
                 hide_index=True, key="effects-flow-table")
for key, event in events[2:]:  # the copying grid's and the routes' clicks, read here as the grids' are above
    point = fresh_click(event, key)
    if point is None or "point_index" not in point:
        continue
    trace = (fig_copy if key == "effects-copying" else fig_flow).data[int(point.get("curve_number", -1))]
    if trace.name == "heads":
        st.session_state["_effects_click"] = tuple(int(x) for x in divmod(int(point["point_index"]), H))
        st.rerun()
    if trace.name == "edges" and trace.customdata[int(point["point_index"])][0] >= 0:
        st.session_state["_effects_click"] = tuple(int(x) for x in trace.customdata[int(point["point_index"])])
        st.rerun()

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
cols = st.columns(2)
written = pd.concat([w.assign(prompt=what) for what, w in words.items()])[["prompt", "direction", "rank", "token",
                                                                            "text", "logit"]]
cols[0].download_button(f"What {head_label(layer, head)} writes, both prompts · CSV", lambda: frame_csv(written),
                        f"headlens-effects-vocabulary-L{layer}-H{head}.csv", "text/csv", key="effects-vocabulary-csv",
                        on_click="ignore")
edges = graph.assign(source_token=[flow_tokens[i] for i in graph["source"]],
                     target_token=[flow_tokens[i] for i in graph["target"]],
                     on_strongest_route=graph.index.isin(route.index))
cols[1].download_button("The routes drawn, one edge a row · CSV", lambda: frame_csv(edges),
                        "headlens-effects-routes.csv", "text/csv", key="effects-routes-csv", on_click="ignore")
sig = f"{pair.clean}|{pair.corrupted}|{pair.answer}|{pair.distractor}|{method}"
figures = {"effects-attribution": ("Attribution grid", fig_attr), "effects-patching": ("Patching grid", fig_patch),
           "effects-residual": ("Residual stream", fig_resid),
           "effects-flow": ("Routes", fig_flow)}
if fig_copy is not None:
    figures["effects-copying"] = ("Copying grid", fig_copy)
for key, (name, fig) in figures.items():
    st.caption(name)
    exports(key, fig, None, sig=sig + (f"|{prompt_name}|{end}|{threshold}" if key == "effects-flow" else ""))
