"""The Effects page's sections, each drawn from the one ``Effects`` of the pair and the prompts' traces."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import streamlit as st

from analysis import make_view
from analysis.roles.detector import DETECTORS
from analysis.defaults import Pair
from analysis.effects import grid, readout_for
from analysis.effects.routes import THRESHOLD, flow_graph, flow_heads, strongest_route
from analysis.attention.views import token_label
from models import DETECTOR, VOCABULARY, AttentionModel, head_label, offers
from viz import head_heatmap
from viz.effects import effect_grid, flow_figure, parts_bars, position_grid, vocabulary_bars

from ..results.detector import detected
from ..results.effects import Effects, copying, flow, per_position, prompt_trace, vocabulary
from ..results.messages import plain
from ..results.models import ModelRef, TRAINED, offers_of
from .card_links import card_button
from .detector import NAMES
from .effects import frame_csv, parts_frame
from .exports import chart, file_name
from .settings import Settings
from .state import bound, flag
from ..results.models import trained_job

TOP_HEADS = 12  # heads shown position by position


@dataclass
class EffectsView:
    """What the page shows of one pair: the results, the grids read from them, and the figures drawn so far."""

    ref: ModelRef
    model: AttentionModel
    pair: Pair
    method: str
    found: Effects
    figures: dict = field(default_factory=dict)  # key -> (name, figure, what its export's signature adds)
    events: list = field(default_factory=list)   # (key, selection event) of the charts a click opens a head on
    words: dict = field(default_factory=dict)    # "clean"/"corrupted" -> what the head writes there

    def __post_init__(self):
        L, H = self.model.n_layers, self.model.n_heads
        a = self.found.heads.attrs
        self.readout = readout_for(self.model, self.pair.clean)  # what the figures measure, and their words
        self.compared = self.readout.compared(a["answer"], a["distractor"])
        self.attribution = None if self.found.attribution is None else \
            self.found.attribution["attribution"].to_numpy().reshape(L, H)
        self.recovered = grid(self.found.heads, "recovered", L, H)
        heads = self.found.heads
        self.ranked = heads.reindex(heads["recovered"].abs().sort_values(ascending=False).index)


def metrics(v: EffectsView) -> None:
    """The clean and corrupted differences, the heads' direct share, and the head that recovers most."""
    att, heads = v.found.attribution, v.found.heads
    cols = st.columns(4)
    cols[0].metric("Clean", f"{heads.attrs['ld_clean']:+.2f}", help=plain(v.readout.clean_help(v.compared)))
    cols[1].metric("Corrupted", f"{heads.attrs['ld_corrupted']:+.2f}", help="The same after the corrupted prompt.")
    if att is None:
        cols[2].metric("By the heads", "—", help=v.readout.not_linear)
    else:
        cols[2].metric("By the heads", f"{att['attribution'].sum():+.2f}",
                       help="The heads' direct share of the clean difference; the MLPs, the embeddings and the biases "
                            "write the rest (the bars below)." + v.readout.parts_note)
    best = heads.loc[heads["recovered"].idxmax()]
    cols[3].metric("Best head", head_label(best["layer"], best["head"]),
                   help=f"Patching this head alone brings back {best['recovered']:.2f} of the difference.")


PICK_HELP = "Heads in order of the share patching recovers, largest in size first; a click on either grid picks one too."


def head_note(v: EffectsView, h: tuple[int, int]) -> str:
    """What the head picker says of head ``h`` beside its name."""
    return f"recovered {v.recovered[h]:+.2f}" + ("" if v.attribution is None else
                                                   f" · attribution {v.attribution[h]:+.2f}")


def grids(v: EffectsView, selected: tuple[int, int]) -> None:
    """Attribution and patching as two grids centred on zero, and the ten heads that recover most."""
    label = "Patching, estimated" if v.method == "attribution" else "Patching"
    units, logit = v.readout.units, "logit " if v.readout.units == "logits" else ""
    grids_drawn = (("effects-attribution", "Attribution grid", v.attribution, units,
                    f"Direct {logit}attribution · {v.compared}"),
                   ("effects-patching", "Patching grid", v.recovered, "recovered",
                    f"{label} · share of the difference recovered"))
    if v.attribution is None:
        grids_drawn = grids_drawn[1:]
        st.caption(v.readout.not_linear)
    for col, (key, name, values, value_name, title) in zip(st.columns(2), grids_drawn):
        with col:
            fig = effect_grid(values, value_name=value_name, selected=selected, title=title)
            v.events.append((key, chart(fig, key, on_select="rerun", selection_mode="points")))
            v.figures[key] = (name, fig, "")
    st.caption(("Both grids are" if len(grids_drawn) == 2 else "The grid is") + " centred on zero: red raises the "
               "answer over the distractor, blue lowers it. Hover a cell for its value; click a head to open it below.")
    strongest = v.ranked.head(10)
    table = {"head": [head_label(r.layer, r.head) for r in strongest.itertuples()],
             "recovered": strongest["recovered"].to_numpy()}
    if v.attribution is not None:
        table[f"attribution{' (logits)' if logit else ''}"] = \
            v.attribution[strongest["layer"], strongest["head"]]
    st.dataframe(pd.DataFrame(table).style.format(precision=3), hide_index=True, key="effects-strongest")


def parts_and_residual(v: EffectsView) -> list[str]:
    """Where the clean difference comes from, and the residual stream patched by layer and position; the
    tokens as the residual grid names them (clean/corrupted where they differ)."""
    att, residual = v.found.attribution, v.found.residual
    if att is None:
        return _residual_alone(v)
    a = att.attrs
    top = att.reindex(att["attribution"].abs().sort_values(ascending=False).index).head(6)
    parts = {head_label(r.layer, r.head): float(r.attribution) for r in top.itertuples()}
    parts["other heads"] = float(att["attribution"].sum() - top["attribution"].sum())
    parts["MLPs"] = float(sum(a["mlp"]))
    parts["embeddings"] = float(a["embeddings"])
    if any(a["attention_bias"]):
        parts["attention biases"] = float(sum(a["attention_bias"]))
    if a["final_norm"]:
        parts[v.readout.norm_bias] = float(a["final_norm"])
    left, right = st.columns(2)
    with left:
        chart(parts_bars(parts, title=f"Where the clean difference of {a['logit_diff']:+.2f} comes from",
                         value_name=v.readout.title), "effects-parts")
    tokens = [token_label(c) if c == k else f"{token_label(c)}/{token_label(k)}"
              for c, k in zip(a["tokens"], residual.attrs["tokens"])]
    with right:
        values = residual.pivot(index="layer", columns="position", values="recovered").to_numpy()
        fig = position_grid(values, tokens, title="The residual stream entering each layer, patched at one position")
        chart(fig, "effects-residual")
        v.figures["effects-residual"] = ("Residual stream", fig, "")
    st.caption("The residual stream patched from the clean run at one position and layer (TransformerLens's first "
               "picture): where the information that decides the answer sits, layer by layer. Positions where the "
               "two prompts agree carry nothing until a layer has mixed the difference into them.")
    return tokens


def _residual_alone(v: EffectsView) -> list[str]:
    """The residual stream patched by layer and position, where no part of the difference is direct."""
    residual = v.found.residual
    clean = prompt_trace(v.ref, v.pair.clean).tokens
    tokens = [token_label(c) if c == k else f"{token_label(c)}/{token_label(k)}"
              for c, k in zip(clean, residual.attrs["tokens"])]
    values = residual.pivot(index="layer", columns="position", values="recovered").to_numpy()
    fig = position_grid(values, tokens, title="The residual stream entering each layer, patched at one position")
    chart(fig, "effects-residual")
    v.figures["effects-residual"] = ("Residual stream", fig, "")
    return tokens


def head_section(v: EffectsView, s: Settings, layer: int, head: int) -> None:
    """The head on both prompts: where it looks (from each prompt's trace) and what it writes at a token."""
    writes = VOCABULARY in offers(v.model)  # into a vocabulary, where the model has one
    st.subheader(f"{head_label(layer, head)}: where it looks" + (" and what it writes" if writes else ""))
    card_button(layer, head, "effects-card")
    if not writes:
        _encoder_head(v, s, layer, head)
        return
    tokens = v.found.attribution.attrs["tokens"]
    at = bound(st.selectbox, "effects_at", len(tokens) - 1, init="index", options=list(range(len(tokens))),
               cast=int, label="What it writes at",
               format_func=lambda p: f"{p}: {token_label(tokens[p])}" + (" · the prediction" if
                                                                        p == len(tokens) - 1 else ""),
               help="The head's output at this token through the final norm (its scale frozen at the model's own "
                    "value) and the unembedding: the logits it adds to each token of the vocabulary, the ten it "
                    "raises most and the ten it lowers most.")
    for what, text in (("clean", v.pair.clean), ("corrupted", v.pair.corrupted)):
        view = make_view(prompt_trace(v.ref, text).attention(), hide_special=s.hide_special)
        left, right = st.columns(2)
        with left:
            chart(head_heatmap(view.head(layer, head), view.query_labels, view.key_labels,
                               visible=view.visible(layer), title=f"{head_label(layer, head)} · {what} prompt"),
                  f"effects-head-{what}")
        with right:
            w = v.words[what] = vocabulary(v.ref, text, layer, head, at)
            chart(vocabulary_bars(w, title=f"What {head_label(layer, head)} writes at “{token_label(w.attrs['at'])}” "
                                           f"({what})"), f"effects-vocabulary-{what}")
    said = (f"{head_label(layer, head)}: recovers {v.recovered[layer, head]:+.3f} of the difference, writes "
            f"{v.attribution[layer, head]:+.3f} logits directly.")
    job = trained_job() if v.ref.choice in TRAINED else None
    if job is not None and job.run is not None:  # the training's own scores, on its held-out sequences
        last = job.run.history.query("layer == @layer and head == @head").tail(1)
        if len(last):
            said += (f" On the training's held-out sequences at step {int(last['step'].iloc[0]):,}: previous token "
                     f"{last['prev_token'].iloc[0]:.2f}, induction {last['induction'].iloc[0]:.2f}.")
    elif DETECTOR in offers_of(v.ref):  # a bundled decoder's detector, prepared
        scores = detected(v.ref).set_index(["layer", "head"]).loc[(layer, head)]
        said += f" Head detector: **{scores['label']}**; " + "; ".join(
            f"{NAMES[n]} {scores[n]:.2f} ({scores[f'{n}_lo']:.2f}–{scores[f'{n}_hi']:.2f})" for n in DETECTORS) + "."
    st.caption(said + " The bars: the logits its output adds at the chosen token, the ten tokens it raises most "
                      "(red) and lowers most (blue); on average it adds "
                      f"{v.words['clean'].attrs['mean']:+.3f} to every token.")


def _encoder_head(v: EffectsView, s: Settings, layer: int, head: int) -> None:
    """An encoder's head on both prompts: where it looks, side by side, and its figures."""
    for col, (what, text) in zip(st.columns(2), (("clean", v.pair.clean), ("corrupted", v.pair.corrupted))):
        view = make_view(prompt_trace(v.ref, text).attention(), hide_special=s.hide_special)
        with col:
            chart(head_heatmap(view.head(layer, head), view.query_labels, view.key_labels,
                               visible=view.visible(layer), title=f"{head_label(layer, head)} · {what} prompt"),
                  f"effects-head-{what}")
    said = f"{head_label(layer, head)}: recovers {v.recovered[layer, head]:+.3f} of the difference"
    st.caption(said + ("." if v.attribution is None else
                       f", writes {v.attribution[layer, head]:+.3f} of it directly (its output at every token through "
                       "the norms above it, pooled into the embedding)."))


def copying_section(v: EffectsView, selected: tuple[int, int]) -> None:
    """On request, every head's copying and suppression scores as a grid and a table."""
    st.subheader("Which heads copy")
    if not bound(st.toggle, "effects_copying", False, cast=flag, label="Read every head's OV circuit over the vocabulary",
                 help="Were a head to put all its weight on a token, would that token be among the five it raises "
                      "most (it copies, Elhage et al. 2021) or lowers most (it suppresses copies, McDougall et al. "
                      "2023)? Measured on 200 tokens of the built-in corpus against the whole vocabulary; computed "
                      "once per server (about 17 s for SmolLM2 on two cores)."):
        return
    L, H = v.model.n_layers, v.model.n_heads
    scores = copying(v.ref)
    copy_grid = scores["copying"].to_numpy().reshape(L, H)
    suppress_grid = scores["suppression"].to_numpy().reshape(L, H)
    tips = [[("pruned" if np.isnan(copy_grid[l, h]) else
              f"copies {copy_grid[l, h]:.0%} of tokens, suppresses {suppress_grid[l, h]:.0%}")
             for h in range(H)] for l in range(L)]
    left, right = st.columns(2)
    with left:
        fig = effect_grid(copy_grid - suppress_grid, value_name="copying", zmax=1.0, selected=selected, tips=tips,
                          title="Copying (red) and suppression (blue) of the tokens attended to")
        v.events.append(("effects-copying", chart(fig, "effects-copying", on_select="rerun", selection_mode="points")))
        v.figures["effects-copying"] = ("Copying grid", fig, "")
    with right:
        ranked = scores.dropna().assign(score=lambda f: f["copying"] - f["suppression"])
        ranked = ranked.reindex(ranked["score"].abs().sort_values(ascending=False).index).head(12)
        st.dataframe(pd.DataFrame({"head": [head_label(r.layer, r.head) for r in ranked.itertuples()],
                                   "copies": ranked["copying"].to_numpy(),
                                   "suppresses": ranked["suppression"].to_numpy(),
                                   "recovered": v.recovered[ranked["layer"], ranked["head"]]}
                                  ).style.format(precision=2), hide_index=True, key="effects-copying-table")
        a = scores.attrs
        st.caption(f"Over {a['tokens']} tokens, each ranked against all {a['vocabulary']:,}: by chance a head "
                   f"copies or suppresses {a['chance']:.2%} of them. A click on a cell opens the head above.")
    st.download_button("Copying and suppression per head · CSV", lambda: frame_csv(scores),
                       "headlens-effects-copying.csv", "text/csv", key="effects-copying-csv", on_click="ignore")


def flow_section(v: EffectsView) -> pd.DataFrame:
    """The routes of a prediction drawn layer by layer, from the chosen prompt's trace; the edges drawn, each
    with its tokens and whether it is on the strongest route."""
    st.subheader("How the prediction flows")
    left, mid = st.columns(2)
    with left:
        which = bound(st.segmented_control, "effects_flow_prompt", "clean", init="default",
                      options=["clean", "corrupted"], cast=str, label="Prompt", required=True)
    found = flow(v.ref, v.pair.clean if which == "clean" else v.pair.corrupted)
    tokens = found.tokens
    with mid:
        end = bound(st.selectbox, "effects_flow_at", len(tokens) - 1, init="index", options=list(range(len(tokens))),
                    cast=int, label="Routes to", format_func=lambda p: f"{p}: {token_label(tokens[p])}" + (
                        " · the prediction" if p == len(tokens) - 1 else ""))
    threshold = bound(st.slider, "effects_threshold", THRESHOLD, cast=float, label="Smallest share drawn",
                      min_value=0.01, max_value=0.5, step=0.01,
                      help="An edge is drawn when its part makes up at least this share of the update it writes "
                           "into (Ferrando & Voita 2024 and the LLM Transparency Tool use 0.04). Lower shows more "
                           "routes.")
    graph = flow_graph(found, end, threshold)
    route = strongest_route(graph)
    fig = flow_figure(graph, [token_label(t) for t in tokens], found.n_layers, route=route,
                      title=f"The routes to “{token_label(tokens[end])}” ({which} prompt), edges of at least "
                            f"{threshold:.2f} of an update")
    v.events.append(("effects-flow", chart(fig, "effects-flow", on_select="rerun", selection_mode="points")))
    v.figures["effects-flow"] = ("Routes", fig, f"|{which}|{end}|{threshold}")
    on_route = route[route["kind"] == "head"]
    per_head = flow_heads(found, end)  # every route, however small: what the drawn ones leave out counts too
    strong = [divmod(int(i), v.model.n_heads) for i in np.argsort(-per_head, axis=None, kind="stable")[:10]
              if per_head.flat[i] > 0]
    varies = np.ptp(per_head) > 0 and np.ptp(v.recovered) > 0  # a rank correlation needs both to vary
    from scipy.stats import spearmanr  # a second to import: read when the section is drawn

    rho = spearmanr(per_head.reshape(-1), np.abs(v.recovered).reshape(-1)).statistic if varies else float("nan")
    route_said = ("; ".join(f"{head_label(r.layer, r.head)} from “{token_label(tokens[r.source])}” ({r.share:.2f})"
                            for r in on_route.itertuples()) or "none: it stays in its token")
    st.caption(f"One forward pass: each update of the residual stream split into what wrote it, each part's share "
               f"its closeness to the result (L1). {len(graph):,} edges reach the end at this threshold; the dotted "
               f"line is the strongest route through a head (its shares multiply to the most): {route_said}. Hover a "
               "line's middle for its heads and shares; a click on a head's line opens it above. How much of the end "
               "passes through each head (every route, however small, its shares multiplied) against the share "
               f"patching recovers (by size), over all heads: Spearman {'—' if np.isnan(rho) else f'{rho:.2f}'}. The "
               "routes read one prompt, patching the difference between two.")
    if strong:
        st.dataframe(pd.DataFrame({"head": [head_label(*h) for h in strong],
                                   "passes through it": [per_head[h] for h in strong],
                                   "recovered by patching": [v.recovered[h] for h in strong]}
                                  ).style.format(precision=3), hide_index=True, key="effects-flow-table")
    return graph.assign(source_token=[tokens[i] for i in graph["source"]],
                        target_token=[tokens[i] for i in graph["target"]], on_strongest_route=graph.index.isin(route.index))


def positions_section(v: EffectsView, tokens: list[str]) -> None:
    """On request, the heads that recover most patched at one position at a time."""
    st.subheader("Position by position")
    if not bound(st.toggle, "effects_positions", False, cast=flag, label="Patch every head at each position on its own",
                 help="One copy of the corrupted prompt per head and position; positions where both prompts' "
                      "activations are equal cost nothing, since a patch there changes nothing."):
        return
    positions = per_position(v.ref, v.pair, v.method)
    strongest = [(int(r.layer), int(r.head)) for r in v.ranked.head(TOP_HEADS).itertuples()]
    by_head = positions.set_index(["layer", "head", "position"])["recovered"]
    values = np.array([[by_head[(l, h, p)] for p in range(len(tokens))] for l, h in strongest])
    chart(position_grid(values, tokens, rows=[head_label(*h) for h in strongest],
                        title=f"The {len(strongest)} heads that recover most, patched at one position"),
          "effects-positions")
    st.download_button("Every head at each position · CSV", lambda: frame_csv(positions),
                       "headlens-effects-positions.csv", "text/csv", key="effects-positions-csv", on_click="ignore")


def downloads(v: EffectsView, layer: int, head: int, edges: pd.DataFrame) -> None:
    """Every frame behind the page as CSV."""
    st.subheader("Downloads")
    att, heads = v.found.attribution, v.found.heads
    table = pd.DataFrame({"layer": heads["layer"], "head": heads["head"], "recovered": heads["recovered"]})
    if att is not None:
        table["attribution"] = att["attribution"].to_numpy()
    files = [("Patching and attribution per head · CSV", table, "headlens-effects-heads.csv", "effects-heads-csv"),
             ("Residual stream patching · CSV", v.found.residual, "headlens-effects-residual.csv",
              "effects-residual-csv")]
    if att is not None:
        files.insert(1, ("Every part of the attribution · CSV", parts_frame(att), "headlens-effects-parts.csv",
                         "effects-parts-csv"))
    if v.words:
        written = pd.concat([w.assign(prompt=what) for what, w in v.words.items()])[
            ["prompt", "direction", "rank", "token", "text", "logit"]]
        files.append((f"What {head_label(layer, head)} writes, both prompts · CSV", written,
                      file_name("effects-vocabulary", (layer, head), ext="csv"), "effects-vocabulary-csv"))
    if edges is not None:
        files.append(("The routes drawn, one edge a row · CSV", edges, "headlens-effects-routes.csv",
                      "effects-routes-csv"))
    for col, (label, frame, name, key) in zip(st.columns(3) + st.columns(2), files):
        col.download_button(label, lambda frame=frame: frame_csv(frame), name, "text/csv", key=key, on_click="ignore")
