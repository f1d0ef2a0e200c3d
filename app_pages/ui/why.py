"""Why a head attends here: a head's score from a query to a key split over what its query and its key read
(``analysis.qk_attribution``), on a text and over a task, as a section of the Head, Circuits and Explore pages."""
from __future__ import annotations

import json

import numpy as np
import streamlit as st

from analysis import qk_attribution as QA
from analysis.attention.views import token_label
from models import HeadLensError, head_label
from viz.qk_attribution import cell_targets, writer_bars, writer_grid

from ..results.messages import plain
from ..results.models import ModelRef, cached_model
from ..results.tasks import TaskSpec, built_task
from ..results.why import qk_split, qk_task
from .card_links import click_picks_head
from .exports import chart, file_name
from .state import bound, choose, fresh_click, head_from_url, head_to_url, preset

ABOUT = ("A head's score from a query to a key is its query times its key. Each is read from the residual stream, "
         "the sum of what the input, every earlier head and every earlier MLP wrote (with the norms' scales as they "
         "were in this run), so the score splits exactly into one part for each pair of a query-side writer and a "
         "key-side writer, the biases one more writer. A click on a head's bar opens its card.")


def _figures(rows, cols, grid, score, query_side, key_side, nodes, key: str, title: str) -> None:
    """The grid and the writers' bars of one split, a click on a head's bar opening its card."""
    fig = writer_grid(rows, cols, grid, score, title=title)
    chart(fig, f"{key}-grid")

    def bars(frame):
        top = frame.head(QA.GRID)
        return list(top.writer), top.part.to_numpy(), [nodes[i] for i in top["index"]]

    fig_bars = writer_bars({"Query side": bars(query_side), "Key side": bars(key_side)},
                           title="Each side's largest writers, summed over the other side")
    event = chart(fig_bars, f"{key}-bars", on_select="rerun", selection_mode="points")
    click_picks_head(event, f"{key}-bars", fig_bars, None)


def why_section(ref: ModelRef, text: str, layer: int, head: int, key: str, *, query: int | None = None,
                spec: TaskSpec | None = None, heading: bool = True) -> None:
    """The section for head ``(layer, head)`` on ``text``: a query (default ``query``, else the last token) and one
    of its keys (the strongest first) chosen, the split's grid, bars and tables, its downloads; and
    with ``spec``, the same averaged over that task's pairs on a button. Widget keys and URL names start with
    ``key``."""
    if heading:
        st.subheader("Why it attends here")
        st.caption(ABOUT)
    scratch = ref.analysed
    try:
        tokens = QA.prompt_tokens(cached_model(scratch), text)
    except HeadLensError as err:
        st.info(plain(str(err)))
        return
    n = len(tokens)
    names = [f"{i}: {token_label(t)}" for i, t in enumerate(tokens)]
    a, b = st.columns(2)
    q = choose("Query", list(range(n)), f"{key}_query", default=n - 1 if query is None else query, container=a,
               format_func=names.__getitem__, help="The token whose attention is explained.")
    with st.spinner(f"Splitting {head_label(layer, head)}'s scores from {names[q]}…"):
        split = qk_split(scratch, text, layer, head, q)
    moved = st.session_state.get(f"_{key}_asked", (text, layer, head, q)) != (text, layer, head, q)
    st.session_state[f"_{key}_asked"] = (text, layer, head, q)
    if moved:  # another query (or head, or text): its own strongest key first
        preset(f"{key}_key", None)
        st.query_params.pop(f"{key}_key", None)
    keys = [int(k) for k in range(split.n_keys) if split.visible[k]]  # up to the query; an encoder's: every one
    k = choose("Key", keys, f"{key}_key", default=split.key, container=b,
               format_func=lambda i: f"{names[i]} · weight {split.weights[i]:.2f}",
               help="One of the keys the query sees; the strongest first.")
    if k != split.key:  # its own largest writers run without
        with st.spinner(f"Splitting {head_label(layer, head)}'s score to {names[k]}…"):
            split = qk_split(scratch, text, layer, head, q, k)
    top = split.pairs(k, 1).iloc[0]
    cols = st.columns(3)
    cols[0].metric("Score", f"{split.scores[k]:+.2f}", help="Before the softmax: the query times the key, scaled.")
    cols[1].metric("Weight", f"{split.weights[k]:.2f}", help="The head's attention from the query to this key.")
    cols[2].metric("Largest pair", f"{top.share:.0%}", help=f"{top.query_writer} × {top.key_writer}: "
                   f"{top.part:+.3f} of the score.")
    rows, cols_, grid = split.grid(k)
    sides = {"q": split.query_writers(k), "k": split.key_writers(k)}
    _figures(rows, cols_, grid, split.scores[k], sides["q"], sides["k"], split.nodes, key,
             f"{head_label(layer, head)}: {names[q]} → {names[k]}, score {split.scores[k]:+.2f} split by writer")
    st.caption("Each cell is one query-side writer's part of the query times one key-side writer's part of the key "
               "(blue raises the score, red lowers it); the last row and column sum every other writer. The parts "
               "sum to the score.")
    _side_tables(sides, split.weights[k], key)
    d1, d2 = st.columns(2)
    d1.download_button("Writer pairs · CSV", lambda: split.pairs(k).drop(columns=["query_index", "key_index"])
                       .to_csv(index=False), file_name("why", (layer, head), f"q{q}", f"k{k}", ext="csv"), "text/csv",
                       key=f"{key}-csv", on_click="ignore")
    d2.download_button("Split · JSON", lambda: json.dumps(split.to_json(k), indent=1, default=float),
                       file_name("why", (layer, head), f"q{q}", f"k{k}", ext="json"), "application/json", key=f"{key}-json",
                       on_click="ignore")
    if spec is not None:
        _over_task(scratch, spec, layer, head, key)


def _side_tables(sides: dict, weight: float, key: str) -> None:
    """Each side's largest writers (``sides``: ``QKAttribution.side``'s frames by side), with the key's weight
    without each: as the split predicts it (norm scales frozen) and as a run with that writer taken out gives it
    (norms recomputed)."""
    left, right = st.columns(2)
    for col, side, name in ((left, "q", "Query side"), (right, "k", "Key side")):
        frame = sides[side].head(QA.GRID).drop(columns=["index", "weight"])
        frame.columns = ["writer", "part", "share", "weight without (split)", "weight without (run)"]
        frame["weight without (run)"] = frame["weight without (run)"].map(
            lambda w: "not run" if np.isnan(w) else f"{w:.3f}")  # the biases, and writers past the largest ten
        col.markdown(f"**{name}**")
        col.dataframe(frame.style.format({"part": "{:+.3f}", "share": "{:.1%}", "weight without (split)": "{:.3f}"}),
                      hide_index=True, key=f"{key}-{side}-table")
    st.caption(f"The weight is {weight:.3f} with every writer. Without one (taken out of the query's input, "
               "or out of every key's): the split's prediction holds each norm's scale as it was; the run recomputes "
               f"the norms, for the {QA.REMOVED} largest writers of each side.")


def _over_task(ref: ModelRef, spec: TaskSpec, layer: int, head: int, key: str) -> None:
    """The split averaged over a task's pairs, between two of its roles, on a button."""
    task = built_task.peek(ref, spec)
    if task is None:  # built here, so that a model whose tokenizer cannot make it gets a note, not a stopped page
        try:
            task = built_task.__wrapped__(ref, spec)
        except HeadLensError as err:
            st.info(plain(f"Over a task: {err}"))
            return
        built_task.cache.put(built_task.key(ref, spec), task)
    roles = task.roles
    default = QA.ROLE_PAIRS.get(task.name, ("END", roles[-2] if len(roles) > 1 else roles[0]))
    st.markdown(f"**Over the task** · {task.title}, {len(task)} pairs")
    a, b, c = st.columns([1, 1, 1], vertical_alignment="bottom")
    q_role = choose("Query role", roles, f"{key}_qrole", default=default[0], container=a, cast=str)
    k_role = choose("Key role", roles, f"{key}_krole", default=default[1], container=b, cast=str)
    which = bound(c.segmented_control, f"{key}_which", "clean", init="default",
                  options=["clean", "corrupted", "difference"], cast=str, label="Prompts", required=True,
                  help="The clean prompts, the corrupted ones, or clean less corrupted: what the corruption took away.")
    asked = st.session_state.setdefault("_why_task_asked", set())
    args = (ref, spec, layer, head, q_role, k_role)
    if args not in asked and qk_task.peek(*args) is None:
        if not st.button(f"Split over the {len(task)} pairs", key=f"{key}-task", icon=":material/functions:",
                         help="Each pair's score from its query role to its key role, split; a few seconds."):
            return
        asked.add(args)
    try:
        found = qk_task(*args)
    except HeadLensError as err:
        st.info(plain(str(err)))
        return
    scores = found.scores(which)
    rows, cols, grid = found.grid(which)
    q_side, k_side = found.side("q", which), found.side("k", which)
    _figures(rows, cols, grid, float(scores.mean()), q_side, k_side, found.nodes, f"{key}-task",
             f"{head_label(layer, head)}: {q_role} → {k_role}, mean over {len(task)} pairs ({which}), "
             f"score {scores.mean():+.2f}")
    frame = found.frame(which)
    st.dataframe(frame.drop(columns=["query_index", "key_index"]).style.format(precision=3), hide_index=True,
                 key=f"{key}-task-table")
    st.caption("Each writer pair's mean part of the score and mean share of each pair's score, with 95% bootstrap "
               "intervals over the pairs.")
    st.download_button("Writer pairs over the task · CSV", lambda: found.frame(which, n=200).to_csv(index=False),
                       file_name("why-task", (layer, head), q_role, k_role, which, ext="csv"), "text/csv",
                       key=f"{key}-task-csv", on_click="ignore")


CLICKABLE = 48   # labels a side up to which Explore's cells take clicks (markers: heads x labels² / 2)


def explore_clicks(fig, v, heads: list[int], layer: int) -> bool:
    """Let a click on a cell of Explore's grid ask why (drawn small enough); whether it does."""
    if len(v.query_labels) > CLICKABLE:
        return False
    cell_targets(fig, heads, v.visible(layer))
    return True


def explore_why(ref: ModelRef, event, fig, v, text: str, layer: int, focus: int) -> None:
    """Explore's section: opened by a click on a cell (that query and key, of that head) or by a button (the focus
    head, the last query, its strongest key); its head, query and key in the URL as ``xwhy_head``, ``xwhy_query``,
    ``xwhy_key``."""
    point = fresh_click(event, "explore-why-click")
    if point is not None and fig.data[int(point.get("curve_number", 0))].name == "cells":
        data = point.get("customdata")
        h, q, k = (int(data[i]) for i in ((0, 1, 2) if isinstance(data, (list, tuple)) else ("0", "1", "2")))
        preset("xwhy_head", h)
        preset("xwhy_query", v.query_spans[q][1] - 1)
        preset("xwhy_key", v.key_spans[k][0])
        st.rerun()
    kept = st.session_state.get("_kept", {}).get("xwhy_head")
    if kept is None and "xwhy_head" not in st.query_params:
        if st.button(f"Why does {head_label(layer, focus)} attend where it does?", key="explore-why-open",
                     icon=":material/psychology_alt:", help="Its score split over what its query and its key read; "
                     "or click a cell of a head's heatmap."):
            preset("xwhy_head", focus)
            st.rerun()
        return
    st.subheader("Why it attends here")
    st.caption(ABOUT)
    head = choose("Head to explain", list(range(cached_model(ref).n_heads)), "xwhy_head", default=focus,
                  format_func=lambda h: head_label(layer, h))
    why_section(ref, text, layer, head, "xwhy", heading=False)


def edge_head(point: dict, fig, frame, graph) -> tuple[int, int] | None:
    """The head whose query or key a clicked edge of the circuit enters (a key/value head's: the first query head
    reading it), or None for any other point."""
    if fig.data[int(point.get("curve_number", 0))].name != "edges" or "point_index" not in point:
        return None
    return _entered(graph, int(frame.receiver_index.iloc[int(point["point_index"])]))


def _entered(graph, r: int) -> tuple[int, int] | None:
    """The head whose query or key receiver ``r`` is (a key/value head's: the first query head reading it)."""
    kind, layer, index = graph.receivers[r]
    if kind == "q":
        return layer, index
    return (layer, graph.reads[layer][index][0]) if kind == "k" else None


def circuit_why(ref: ModelRef, spec: TaskSpec, task, frame, graph) -> None:
    """Circuits' section: a head whose query or key the circuit enters (or a clicked one), on one of the task's
    clean prompts from the task's query role (END) to the key the head weighs most, and over the task."""
    heads = []
    for r in frame.receiver_index:
        head = _entered(graph, int(r))
        if head is not None and head not in heads:
            heads.append(head)
    heads = heads or [(layer, h) for kind, layer, h in graph.senders if kind == "head"]
    st.subheader("Why it attends here")
    st.caption(ABOUT)
    a, b = st.columns([1, 2])
    layer, head = choose("Head", heads, "cwhy_head", container=a, cast=head_from_url, to_url=head_to_url,
                         format_func=lambda h: head_label(*h),
                         help="The heads whose queries or keys the circuit's edges enter; a click on such an edge "
                              "chooses its head.")
    i = bound(b.number_input, "cwhy_pair", 1, cast=int, label=f"Pair (of {len(task)})", min_value=1,
              max_value=len(task), step=1, valid=lambda x: 1 <= x <= len(task)) - 1
    pair = task.pairs[i]
    q_role = QA.ROLE_PAIRS.get(task.name, ("END", None))[0]
    roles = dict(pair.roles)
    st.caption(f"Pair {i + 1}'s clean prompt: {plain(pair.clean)}")
    why_section(ref, pair.clean, layer, head, "cwhy", query=roles.get(q_role), spec=spec,
                heading=False)
