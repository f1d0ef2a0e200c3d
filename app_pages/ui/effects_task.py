"""The Effects page over a task: every section drawn from the one ``TaskEffects`` of the task's pairs."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import streamlit as st

from analysis.effects import readout_reading
from analysis.tasks.effects import METRICS, TaskEffects, per_pair, table
from models import AttentionModel, head_label
from viz.effects import position_grid
from viz.tasks import kept_curve, role_bars, strip_figure, task_grid

from ..results.messages import plain
from ..results.models import ModelRef
from ..results.pruning import task_curve
from .card_links import card_button
from .effects import frame_csv
from .exports import chart, file_name
from .state import bound, flag
from .tasks import SHORT_METRICS, TaskChoice, role_attention_summary

MAX_PROBLEMS = 12  # a CSV's bad rows listed on the page (the rest counted)


@dataclass
class TaskView:
    """What the page shows of one task: the effects averaged, their tables, and the figures drawn so far."""

    ref: ModelRef
    model: AttentionModel
    choice: TaskChoice
    all_pairs: TaskEffects
    found: TaskEffects
    figures: dict = field(default_factory=dict)
    events: list = field(default_factory=list)

    def __post_init__(self):
        L, H = self.model.n_layers, self.model.n_heads
        self.readout = readout_reading(self.model, self.choice.metric)  # what the task's metric reads
        self.heads = table(self.found, "heads", self.choice.normalise)
        self.attribution = table(self.found, "attribution")
        self.residual = table(self.found, "residual", self.choice.normalise)
        self.grid = {c: self.heads[c].to_numpy().reshape(L, H) for c in ("mean", "low", "high", "q", "significant")}
        self.ranked = self.heads.reindex(self.heads["mean"].abs().sort_values(ascending=False, kind="stable").index)


def problems(task) -> None:
    """A CSV's rows left out, each with its sentence."""
    if task.problems:
        shown = "\n".join(f"- {plain(p)}" for p in task.problems[:MAX_PROBLEMS])
        more = len(task.problems) - MAX_PROBLEMS
        st.warning(f"{len(task.problems)} row{'s' if len(task.problems) > 1 else ''} left out; the other "
                   f"{len(task)} run:\n{shown}" + (f"\n\n…and {more} more (in the downloads)." if more > 0 else ""))


def metrics(v: TaskView) -> None:
    """Pairs, the model's accuracy, the mean metric of each prompt, and the heads that pass."""
    f, everyone = v.found, v.all_pairs
    cols = st.columns(5)
    cols[0].metric("Pairs", f"{len(f.task):,}", help=f"Of {len(everyone.task):,} in the task." if
                   len(f.task) != len(everyone.task) else "Every pair of the task.")
    cols[1].metric("Model right", f"{everyone.accuracy:.0%}",
                   help="The share of the task's pairs whose clean prompt favours the answer (its metric above zero).")
    name = SHORT_METRICS[f.metric]
    cols[2].metric("Clean", f"{f.clean.mean():+.3f}", help=f"Mean {METRICS[f.metric]} after the clean prompts.")
    cols[3].metric("Corrupted", f"{f.corrupted.mean():+.3f}", help=f"The mean {name.lower()} after the corrupted ones.")
    cols[4].metric("Passing", f"{int(v.heads['significant'].sum())}",
                   help="Heads whose patching effect is non-zero at a false discovery rate of 5%: sign-flip "
                        "permutation p-values, Benjamini-Hochberg corrected over every head.")


PICK_HELP = "Heads in order of their mean recovered share, largest in size first; a click on a grid picks one too."


def head_note(v: TaskView, h: tuple[int, int]) -> str:
    """What the head picker says of head ``h`` beside its name."""
    return f"recovered {v.grid['mean'][h]:+.3f} [{v.grid['low'][h]:+.3f}, {v.grid['high'][h]:+.3f}]"


def grids(v: TaskView, selected: tuple[int, int]) -> None:
    """Patching and attribution averaged over the pairs, significant heads dotted, and the strongest in a table."""
    L, H = v.model.n_layers, v.model.n_heads
    att = {c: v.attribution[c].to_numpy().reshape(L, H) for c in ("mean", "low", "high", "q", "significant")}
    label = "Attribution patching" if v.choice.method == "attribution" else "Patching"
    drawn = (("task-patching", "Patching grid", v.grid, "recovered",
              f"{label} · mean share recovered over {len(v.found.task)} pairs"),
             ("task-attribution", "Attribution grid", att, SHORT_METRICS[v.found.metric].lower(),
              "Direct attribution · mean over the clean prompts"))
    for col, (key, name, g, value_name, title) in zip(st.columns(2), drawn):
        with col:
            fig = task_grid(g["mean"], g["low"], g["high"], g["q"], g["significant"].astype(bool),
                            value_name=value_name, title=title, selected=selected)
            v.events.append((key, chart(fig, key, on_select="rerun", selection_mode="points")))
            v.figures[key] = (name, fig, "")
    st.caption("Means over the pairs, centred on zero: red raises the answer over the distractor, blue lowers it. "
               "A dot marks a head whose effect passes (q < 0.05); hover a cell for its 95% bootstrap interval and q; "
               "click a head to open it below.")
    top = v.ranked.head(10)
    st.dataframe(pd.DataFrame({"head": [head_label(r.layer, r.head) for r in top.itertuples()],
                               "recovered": top["mean"].to_numpy(), "95% low": top["low"].to_numpy(),
                               "95% high": top["high"].to_numpy(), "q": top["q"].to_numpy(),
                               "passes": top["significant"].to_numpy()}).style.format(precision=3),
                 hide_index=True, key="task-strongest")


def residual_section(v: TaskView) -> None:
    f = v.found
    values = v.residual["mean"].to_numpy().reshape(v.model.n_layers, len(f.roles))
    fig = position_grid(values, list(f.roles), title=f"The residual stream patched at each role's token · mean over "
                                                     f"{len(f.task)} pairs", title_chars=80)
    chart(fig, "task-residual")
    v.figures["task-residual"] = ("Residual grid", fig, "")
    st.caption("Each cell: the clean residual stream entering a layer put into the corrupted run at one role's token "
               "(the same role in every pair, wherever its template puts it), the share of the metric it recovers.")


def head_section(v: TaskView, layer: int, head: int) -> pd.DataFrame:
    """The head's value on each pair, and where its last token looks, averaged over the pairs."""
    f = v.found
    st.subheader(f"{head_label(layer, head)} over the task")
    card_button(layer, head, "task-card")
    pairs = per_pair(f, layer, head)
    groups = [t.split(" ")[0] if t else "pairs" for t in pairs["template"]]
    left, right = st.columns(2)
    with left:
        column = "recovered" if v.choice.normalise == "pair" else "effect"
        fig = strip_figure(pairs[column].to_numpy(), groups, texts=[p[:80] for p in pairs["clean"]],
                           value_name="recovered share" if column == "recovered" else
                           f"effect on the {SHORT_METRICS[f.metric].lower()}",
                           title=f"{head_label(layer, head)} patched, pair by pair")
        chart(fig, "task-strip")
        v.figures["task-strip"] = ("Per-pair strip", fig, f"|{layer}.{head}")
    with right:
        mean, low, high = role_attention_summary(f, layer, head)
        fig = role_bars(mean, low, high, list(f.roles),
                        title=f"{head_label(layer, head)}: attention from {v.readout.reads_from} to each role")
        chart(fig, "task-roles")
        v.figures["task-roles"] = ("Role attention", fig, f"|{layer}.{head}")
    st.caption("Left: each pair is a point (hover for its prompt), grouped by template kind. Right: the head's weight "
               f"from {v.readout.reads_from} to each role's token of the clean prompt, then the mean over the pairs "
               f"with its 95% interval{v.readout.roles_note}.")
    return pairs


def curve_section(v: TaskView) -> pd.DataFrame | None:
    """On request: the task's metric with only the k heads of largest effect working, beside importance's order."""
    st.subheader("How few heads keep it")
    if not bound(st.toggle, "task_curve", False, cast=flag, label="Keep the k heads of largest effect, mean-ablate "
                 "the rest", help="For k from 0 to every head: the task's metric on its first 50 clean prompts with "
                                  "only k heads working, every other one giving its mean output over the task's "
                                  "tokens; once in the order of the task's mean effect, once in the Pruning page's "
                                  "order of importance."):
        return None
    c = v.choice
    frame = task_curve(v.ref, c.spec, c.metric, c.method, c.normalise, c.correct_only)
    curves = {name: (g["kept"].to_numpy(), g["metric"].to_numpy()) for name, g in frame.groupby("order", sort=False)}
    fig = kept_curve(curves, value_name=SHORT_METRICS[frame.attrs["metric"]].lower(), full=frame.attrs["full"],
                     title=f"The task's metric with k heads kept · {frame.attrs['pairs']} pairs")
    chart(fig, "task-curve")
    v.figures["task-curve"] = ("Heads-kept curve", fig, "")
    said = []
    for name, g in frame.groupby("order", sort=False):
        enough = g[(g["share"] >= 0.8) & (g["kept"] < g["kept"].max())]
        said.append(f"{name}, {int(enough['kept'].iloc[0])} heads" if len(enough) else f"{name}, only every head")
    st.caption(f"80% of the whole model's mean {SHORT_METRICS[frame.attrs['metric']].lower()} "
               f"({frame.attrs['full']:+.3f}) is reached with: {'; '.join(said)}. The other heads output their mean "
               "over the task's tokens, which removes what they do on these prompts, the general work of a layer "
               "included.")
    return frame


def downloads(v: TaskView, layer: int, head: int, pairs: pd.DataFrame, curve: pd.DataFrame | None) -> None:
    st.subheader("Downloads")
    t = v.found.task
    pair_rows = pd.DataFrame({"clean": [p.clean for p in t.pairs], "corrupted": [p.corrupted for p in t.pairs],
                              "answer": [p.probes[0] if p.probes else v.model.tokenizer.decode([p.answer])
                                         for p in t.pairs],
                              "distractor": [p.probes[1] if p.probes else v.model.tokenizer.decode([p.distractor])
                                             for p in t.pairs],
                              "template": [p.template for p in t.pairs], "clean_metric": v.found.clean,
                              "corrupted_metric": v.found.corrupted, "correct": v.found.correct})
    files = [("Patching per head, with intervals · CSV", v.heads, "headlens-task-heads.csv"),
             ("Attribution per head · CSV", v.attribution, "headlens-task-attribution.csv"),
             ("Residual stream by role · CSV", v.residual, "headlens-task-residual.csv"),
             (f"{head_label(layer, head)} on each pair · CSV", pairs, file_name("task", (layer, head), ext="csv")),
             ("The pairs and their metrics · CSV", pair_rows, "headlens-task-pairs.csv")]
    if curve is not None:
        files.append(("Heads-kept curve · CSV", curve, "headlens-task-curve.csv"))
    if t.problems:
        files.append(("Rows left out · CSV", pd.DataFrame({"problem": list(t.problems)}), "headlens-task-problems.csv"))
    cols = st.columns(3)
    for i, (label, frame, name) in enumerate(files):
        cols[i % 3].download_button(label, lambda frame=frame: frame_csv(frame), name, "text/csv", key=f"task-dl-{i}",
                                    on_click="ignore")


def task_signature(c: TaskChoice) -> str:
    return f"{c.spec.cache_key}|{c.metric}|{c.method}|{c.normalise}|{c.correct_only}"

