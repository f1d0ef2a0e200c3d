"""The sections of the Circuits page: the circuit drawn, the faithfulness curve, what its heads are, path patching
and the downloads."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis import circuits as AC
from analysis.circuits import PATTERNS, circuit_heads
from analysis.circuits import EdgeScores
from analysis.effects import own_readout
from analysis.tasks.build import built_in
from viz.circuits import circuit_figure, curve_figure

from ..results.circuits import KINDS, circuit_roles
from ..results.detector import detected
from ..results.effects import cheap_copying, copying
from ..results.messages import markdown_table, plain
from ..results.models import ModelRef, cached_model
from .card_links import point_picks_head
from .circuits import CircuitChoice, comparison, graph_json, heads_above
from .exports import chart, exports
from .state import bound, choose, fresh_click, head_from_url, head_to_url, preset
from .why import edge_head
from models.result import head_label


def graph_section(ref: ModelRef, c: CircuitChoice, scores: EdgeScores, n: int, faith: AC.Curve):
    """The circuit of the top ``n`` edges drawn layer by layer; a click on a head opens its card."""
    frame = scores.frame(n, list(c.kinds))
    f, low, high = float(faith.faithfulness[0]), float(faith.low[0]), float(faith.high[0])
    g = scores.graph
    nodes = len({*frame.sender, *(g.receiver_node_name(r) for r in frame.receiver_index)})
    title = (f"The top {n:,} edges ({nodes} nodes): faithfulness {f:.0%} [{low:.0%}, {high:.0%}] over "
             f"{len(scores.task)} pairs")
    fig = circuit_figure(frame, scores.graph, cached_model(ref).n_heads, title=title,
                         value_name=f"{'EAP-IG' if scores.method == 'eap_ig' else 'EAP'} score")
    event = chart(fig, "circuit-graph", on_select="rerun", selection_mode="points")
    point = fresh_click(event, "circuit-graph")
    if point is not None:
        edge = edge_head(point, fig, frame, scores.graph)
        if edge is not None:  # an edge into a query or a key: why that head attends where it does, below
            preset("cwhy_head", edge)
            st.rerun()
        point_picks_head(point, fig, None, choice=ref.choice)
    st.caption("Blue edges carry the task (corrupting one lowers the metric), red ones work against it; wider is a "
               "larger |score|. Solid lines enter a query, an MLP or the output (the logits; an encoder's "
               "embedding), dashed ones a key, dotted ones a value (a key/value head's input is drawn below the heads "
               "that share it). Hover an edge's middle for "
               "its score; a click on a head opens its card, on an edge into a query or a key shows below why that "
               "head attends where it does.")
    return fig


def curve_section(curve: AC.Curve, n: int):
    smallest = curve.smallest()
    reach = (f"the smallest circuit reaching {AC.TARGET:.0%} has {smallest:,} edges" if smallest is not None else
             f"no circuit tried reaches {AC.TARGET:.0%}")
    fig = curve_figure(curve.frame(), target=AC.TARGET, smallest=smallest, chosen=n,
                       title=f"Faithfulness against the circuit's size: {reach}")
    chart(fig, "circuit-curve")
    st.caption("Faithfulness: the circuit's metric over the whole model's, each counted from the corrupted "
               "prompts' (every edge outside the circuit carries the corrupted run's output): 0 with no edge, 1 "
               "with all of them; the band is a 95% bootstrap interval over the pairs.")
    return fig


def heads_section(ref: ModelRef, c: CircuitChoice, scores: EdgeScores, n: int) -> pd.DataFrame | None:
    """What the circuit's heads are: their attention between the task's roles, detector label and OV scores, and
    Wang et al.'s classes set beside GPT-2 small's."""
    if not all(r in scores.task.roles for pattern in PATTERNS.values() for r in pattern):
        offered = "ioi" in built_in(own_readout(cached_model(ref)))
        st.caption("The heads are classed between the indirect-object task's roles (IO, S1, S1+1, S2, END), as "
                   "Wang et al. class GPT-2 small's; "
                   + ("choose that task to see them." if offered else "that is a language model's task."))
        return None
    st.subheader("What its heads are")
    copy = copying(ref) if cheap_copying(ref) or ref in st.session_state.get("_copying_asked", ()) else None
    heads = circuit_heads(scores, n, circuit_roles(ref, c.spec), copy, detected(ref), list(c.kinds))
    st.markdown(markdown_table(comparison(heads).to_dict("records")))
    shown = heads.sort_values("edges_in", ascending=False)
    st.dataframe(shown.drop(columns=["layer", "index"]).style.format(precision=2), hide_index=True,
                 key="circuit-heads")
    st.caption("A head's class is the pattern it attends along most over the clean prompts, when that reaches "
               "0.3: END → IO a name mover (a negative one when its OV circuit suppresses more than it copies), "
               "END → S2 S-inhibition, S2 → S1+1 induction, S2 → S1 duplicate token, S1+1 → S1 previous token.")
    if copy is None and st.button("Add OV copying scores", key="circuit-copying",
                                  help="Reads every head's OV circuit over the vocabulary (Gemma 3: about 100 s)."):
        st.session_state.setdefault("_copying_asked", set()).add(ref)
        st.rerun()
    return heads


def path_section(ref: ModelRef, c: CircuitChoice, scores: EdgeScores) -> None:
    """Path patching (Wang et al. 2022): one head's corrupted output sent to chosen receivers' inputs alone."""
    st.subheader("Path patching: test one edge as the paper does")
    senders = [(l, h) for kind, l, h in scores.graph.senders if kind == "head" and l < scores.graph.n_layers - 1]
    g, top = scores.graph, scores.frame(50, ["q", "k", "v"])
    between = [(g.senders[s], g.receiver_node(r)) for s, r in zip(top.sender_index, top.receiver_index)
               if g.senders[s][0] == "head"]
    first = (between[0][0][1], between[0][0][2]) if between else senders[0]
    cols = st.columns([1, 2, 1])
    sender = choose("Sender", senders, "path_sender", default=first, container=cols[0], cast=head_from_url,
                    to_url=head_to_url, format_func=lambda h: head_label(*h))
    above = heads_above(scores, sender[0])
    linked = list(dict.fromkeys((node[1], head) for send, node in between if send[1:] == sender
                                for head in ([node[2]] if node[0] == "head" else g.reads[node[1]][node[2]])))
    receivers = bound(cols[1].multiselect, "path_receivers", [h for h in linked if h in above][:3] or above[:1],
                      init="default", options=above, multi=True, cast=head_from_url, to_url=head_to_url,
                      label="Receivers", format_func=lambda h: head_label(*h))
    inputs = bound(cols[2].pills, "path_inputs", ["q"], init="default", options=["q", "k", "v"], multi=True, cast=str,
                   label="Their inputs", format_func=KINDS.get, selection_mode="multi")
    if not receivers or not inputs:
        st.caption("Choose receiving heads and at least one of their inputs.")
        return
    if st.button("Patch this path", key="path-run", type="primary"):
        with st.spinner("Running the pairs with the path patched…"):
            st.session_state["_path_result"] = (c, sender, tuple(receivers), tuple(inputs), AC.path_patching(
                cached_model(ref), scores.task, sender, receivers, kinds=inputs, metric=c.metric))
    kept = st.session_state.get("_path_result")
    if kept and kept[:4] == (c, sender, tuple(receivers), tuple(inputs)):
        result = kept[4]
        st.metric(f"{result.sender} → {', '.join(result.receivers)}", f"{result.share:.1%}",
                  help="The fall of the metric when only these edges carry the sender's corrupted output, over the "
                       "clean − corrupted span (mean over the pairs).")
        st.caption(plain(f"95% interval [{result.low:.1%}, {result.high:.1%}] over {len(result.effects)} pairs. "
                         "1 means the whole effect of the corruption goes through these edges; 0, none of it."))


def downloads(scores: EdgeScores, c: CircuitChoice, n: int, faith: AC.Curve, curve: AC.Curve, figures: dict) -> None:
    cols = st.columns(3)
    stem = f"headlens-circuit-{scores.task.name}-{scores.method}-{n}"
    cols[0].download_button("Circuit · JSON", lambda: graph_json(scores, n, c.kinds, float(faith.faithfulness[0]),
                                                                 float(faith.low[0]), float(faith.high[0])),
                            f"{stem}.json", "application/json", key="circuit-json", on_click="ignore")
    cols[1].download_button("Every edge · CSV", lambda: scores.frame(None, list(c.kinds)).drop(
        columns=["sender_index", "receiver_index"]).to_csv(index=False), f"{stem}-edges.csv", "text/csv",
        key="circuit-csv", on_click="ignore")
    cols[2].download_button("Faithfulness curve · CSV", lambda: curve.frame().to_csv(index=False),
                            f"{stem}-curve.csv", "text/csv", key="circuit-curve-csv", on_click="ignore")
    sig = f"{c}|{n}"
    for key, (name, fig) in figures.items():
        st.caption(name)
        exports(key, fig, None, sig=sig)
