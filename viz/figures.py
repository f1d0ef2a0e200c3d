"""Plotly figures of attention: arrays and labels in, ``go.Figure`` out.

Every label is HTML-escaped: plotly renders a subset of HTML in text (tick labels, hover,
titles), and tokens come from what a user typed. Axes are categorical with one category per
position (``"3: the"``), so repeated words stay apart, and the tick text shows the token alone.
"""
from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Collection

import numpy as np
import plotly.colors as pc
import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLORSCALE = "Blues"
HIDDEN_COLOR = "#d4d4d4"  # cells a causal query cannot see: the plot's background, behind empty cells
HIDDEN_NOTE = "grey: not visible (a token sees only itself and earlier tokens)"
DIVERGING = "RdBu"
TICK_CHARS = 12  # longer tick labels are cut; hover shows them whole
MAX_CELLS = 128  # most cells along a heatmap axis; longer axes are max-pooled in blocks
TICK_PX = 6.5  # width of one character of a 10 px tick label, for margins fixed in advance
TITLE_SIZE = 14
LINE_CHARS = 20  # token labels beside the head view's lines are cut beyond this
LINES_PER_QUERY = 24  # the head view draws at most this many lines a query and head, the strongest
TITLE_CHARS = 64  # titles wrap beyond this (about 480 px at 14 px; a chart is 564 px in a 1024 px window)


# Control characters become visible symbols (a NUL would also break an SVG export); bidi
# overrides and isolates, which would reorder the text after them, are dropped. Joiners stay:
# emoji sequences and several scripts need them.
_WHITESPACE = dict.fromkeys(map(ord, "\t\n\r"), " ")
_C0 = {c: chr(0x2400 + c) for c in range(0x20) if chr(c) not in "\t\n\r"}
_OTHER_CONTROLS = {0x7F: "\u2421", **dict.fromkeys(range(0x80, 0xA0), "\ufffd")}
_BIDI = dict.fromkeys(map(ord, "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"), None)
_DISPLAY = {**_WHITESPACE, **_C0, **_OTHER_CONTROLS, **_BIDI}


def visible(text: str) -> str:
    """``text`` with control characters shown as symbols and bidi overrides removed."""
    return text.translate(_DISPLAY)


def safe(text: str) -> str:
    """Text as plotly should show it, literally: visible, then HTML-escaped."""
    return html.escape(visible(text), quote=False)


def _tick(label: str, chars: int = TICK_CHARS) -> str:
    return safe(label if len(label) <= chars else label[: chars - 1] + "…")


def wrapped_title(text: str, chars: int = TITLE_CHARS) -> dict:
    """A figure title, escaped, on lines of at most ``chars`` characters.

    Plotly never wraps a title: a long one runs past the chart's edge or into its neighbour's.
    """
    lines = textwrap.wrap(visible(text), chars, break_on_hyphens=False, drop_whitespace=True) or [""]
    return dict(text="<br>".join(html.escape(line, quote=False) for line in lines), font=dict(size=TITLE_SIZE))


def top_margin(title: dict, room: int = 30) -> int:
    """The top margin for a ``wrapped_title``: its lines and ``room`` below them."""
    return 22 * title["text"].count("<br>") + 30 + room


def head_targets(fig: go.Figure, n_layers: int, n_heads: int, text: list[str], *, size: int = 14,
                 action: str = "open this head") -> None:
    """An invisible marker over each cell of a layer x head grid (the trace "heads", point ``layer * heads +
    head``): plotly selects points of a scatter, not cells of a heatmap, so these take the clicks. The axes are
    fixed to the grid's cells, layer 0 at the top: left to themselves, they made room for the markers past the
    grid (a browser's plotly padded SmolLM2's 30 layers by more than a row each side)."""
    layer_of, head_of = np.divmod(np.arange(n_layers * n_heads), n_heads)
    fig.add_trace(go.Scatter(
        x=head_of, y=layer_of, mode="markers", name="heads", showlegend=False,
        marker=dict(symbol="square", size=size, color="rgba(0,0,0,0)"),
        customdata=[[int(l), int(h)] for l, h in zip(layer_of, head_of)], text=text,
        hovertemplate=f"layer %{{y}}, head %{{x}}<br>%{{text}}<br>click to {action}<extra></extra>"))
    fig.update_xaxes(range=[-0.5, n_heads - 0.5], autorange=False, zeroline=False)
    fig.update_yaxes(range=[n_layers - 0.5, -0.5], autorange=False, zeroline=False)
    fig.update_layout(clickmode="event+select", dragmode="pan")


def blocks(n: int, max_cells: int | None = MAX_CELLS) -> np.ndarray:
    """Start index of each block when ``n`` positions are drawn in at most ``max_cells`` cells."""
    return np.arange(0, n, max(1, math.ceil(n / (max_cells or n or 1))))


def pool(w: np.ndarray, q_starts: np.ndarray, k_starts: np.ndarray, signed: bool = False) -> np.ndarray:
    """The largest weight in each (query block, key block); ``signed``: the value largest in magnitude."""
    if len(q_starts) == w.shape[0] and len(k_starts) == w.shape[1]:
        return w
    top = np.maximum.reduceat(np.maximum.reduceat(w, q_starts, axis=0), k_starts, axis=1)
    if not signed:
        return top
    low = np.minimum.reduceat(np.minimum.reduceat(w, q_starts, axis=0), k_starts, axis=1)
    return np.where(-low > top, low, top)


def block_categories(labels: list[str], starts: np.ndarray) -> list[str]:
    """One category per block, naming its tokens: "3: the", or "40–43: the … mill" for a block."""
    ends = [*starts[1:], len(labels)]
    return [f"{a}: {safe(labels[a])}" if b - a == 1 else f"{a}–{b - 1}: {_tick(labels[a])} … {_tick(labels[b - 1])}"
            for a, b in zip(starts, ends)]


def _axis(labels: list[str], starts: np.ndarray, cats: list[str]) -> dict:
    """A categorical axis of blocks, each block's tick showing its first token.

    Plotly picks which ticks to draw from the pixels the axis has (about 15 px a label), so
    labels never crowd, in a 1024 px window or a 1920 px one; hover names every cell.
    """
    return dict(type="category", categoryorder="array", categoryarray=cats, tickmode="auto",
                labelalias={cat: _tick(labels[a]) for cat, a in zip(cats, starts)}, tickfont=dict(size=10))


def _label_px(labels: list[str]) -> int:
    """Room that tick labels need beside an axis (rotated -60 degrees for x labels, about as tall)."""
    if not labels:
        return 10
    return int(min(TICK_CHARS, max(len(visible(label)) for label in labels)) * TICK_PX) + 12


def _margins(query_labels: list[str], key_labels: list[str]) -> tuple[int, int]:
    """Left and bottom margins: the y labels, and the first rotated x label's reach to the left."""
    x_room, y_room = _label_px(key_labels), _label_px(query_labels)
    return max(y_room, x_room // 2) + 10, x_room + 10


def _hover(pooled: bool, value: str) -> str:
    if pooled:
        return f"queries %{{y}}<br>keys %{{x}}<br>largest {value} in this block %{{z:.3f}}"
    return f"%{{y}} → %{{x}}<br>{value} %{{z:.3f}}"


def hidden_cells(visible: np.ndarray | None, q_starts: np.ndarray, k_starts: np.ndarray) -> np.ndarray | None:
    """bool, per drawn cell (a block when pooled): True where no query of the cell could see any of its keys."""
    if visible is None:
        return None
    return pool(np.asarray(visible, dtype=np.float32), q_starts, k_starts) == 0


def _heatmap(w: np.ndarray, q_cats, k_cats, name: str, zmax: float | None, coloraxis: str | None = None,
             colorscale=COLORSCALE, zmid=None, pooled: bool = False, hidden: np.ndarray | None = None,
             note: str = "") -> go.Heatmap:
    """A heatmap trace; ``hidden`` cells are left empty (NaN), so the grey background shows through; ``note``: a
    line its hover adds."""
    z = np.asarray(w, dtype=np.float32)
    if hidden is not None:
        z = np.where(hidden, np.nan, z)
    return go.Heatmap(
        z=z, x=k_cats, y=q_cats, name=name, hoverongaps=False,
        coloraxis=coloraxis, colorscale=None if coloraxis else colorscale, zmin=None if zmid is not None else 0,
        zmax=zmax, zmid=zmid, showscale=False,
        hovertemplate=_hover(pooled, "weight" if zmid is None else "difference") + (f"<br>{safe(note)}" if note else "")
        + f"<extra>{safe(name)}</extra>")


def _hidden_background(fig: go.Figure, hidden: np.ndarray | None) -> None:
    """Grey where a causal query cannot see (the pages say so in a caption, ``HIDDEN_NOTE``)."""
    if hidden is not None and hidden.any():
        fig.update_layout(plot_bgcolor=HIDDEN_COLOR)
        fig.update_xaxes(showgrid=False)  # the grid would cross the grey at every cell's centre
        fig.update_yaxes(showgrid=False)


def head_grid(weights: np.ndarray, query_labels: list[str], key_labels: list[str], heads: list[int], *,
              shared_scale: bool = True, title: str = "", cols: int = 4, cell_px: int = 260,
              max_cells: int | None = MAX_CELLS, visible: np.ndarray | None = None,
              starts: tuple[np.ndarray, np.ndarray] | None = None, hidden: np.ndarray | None = None,
              links: dict[int, str] | None = None, about: dict[int, str] | None = None) -> go.Figure:
    """One heatmap per head of one layer: queries on rows, keys on columns.

    The heads share their axes: token labels run down the first column and under the lowest
    cell of each column, so the grid reads the same at any width. Axes longer than
    ``max_cells`` are max-pooled in blocks; hover then names a block's tokens and its largest weight.

    Args:
        weights: ``(heads_in_layer, n_queries, n_keys)``.
        heads: which heads to draw, in order.
        shared_scale: one colour scale for every head (0 to the largest weight shown), else
            each head from 0 to its own largest weight.
        visible: bool ``(n_queries, n_keys)`` (``View.visible``): cells a causal query cannot see are
            drawn grey, not as zero attention.
        starts: the weights come pooled already (a long prompt's ``analysis.attention.long.Grid``): ``weights`` is
            ``(len(heads), query blocks, key blocks)`` in the order of ``heads``, and ``starts`` the first
            query and key of each block; ``hidden`` (bool per block) replaces ``visible``.
        links: a head's title links to this address (its card), opened in the same tab.
        about: a line a head's hover adds (its explanation).
    """
    cols = max(1, min(cols, len(heads)))
    rows = math.ceil(len(heads) / cols)
    # Margins are fixed from the labels rather than measured by plotly (automargin): measuring
    # every subplot's ticks and laying out again costs more than drawing the heatmaps.
    left, bottom = _margins(query_labels, key_labels)
    head = wrapped_title(title)
    top = top_margin(head, room=40)
    height = rows * cell_px + top + bottom
    specs = [[{} if r * cols + c < len(heads) else None for c in range(cols)] for r in range(rows)]
    fig = make_subplots(rows=rows, cols=cols, specs=specs, subplot_titles=[
        f'<a href="{html.escape(links[h], quote=True)}" target="_self">Head {h}</a>' if links and h in links
        else f"Head {h}" for h in heads],
                        horizontal_spacing=0.02, vertical_spacing=min(0.3 / rows, 34 / height))
    if starts is None:
        q_starts, k_starts = blocks(len(query_labels), max_cells), blocks(len(key_labels), max_cells)
        hidden = hidden_cells(visible, q_starts, k_starts)
        drawn = [pool(weights[h], q_starts, k_starts) for h in heads]
        zmax = float(weights[heads].max()) if heads else 1.0
    else:
        q_starts, k_starts = starts
        drawn = list(weights)
        zmax = float(weights.max()) if len(weights) else 1.0
    q_cats, k_cats = block_categories(query_labels, q_starts), block_categories(key_labels, k_starts)
    pooled = bool(np.diff(q_starts, append=len(query_labels)).max(initial=1) > 1
                  or np.diff(k_starts, append=len(key_labels)).max(initial=1) > 1)
    traces = [_heatmap(w, q_cats, k_cats, f"head {h}", None if shared_scale else float(w.max()) or 1.0,
                       coloraxis="coloraxis" if shared_scale else None, pooled=pooled, hidden=hidden,
                       note=(about or {}).get(h, ""))
              for h, w in zip(heads, drawn)]
    fig.add_traces(traces, rows=[i // cols + 1 for i in range(len(heads))], cols=[i % cols + 1 for i in range(len(heads))])
    x_axis, y_axis = _axis(key_labels, k_starts, k_cats), _axis(query_labels, q_starts, q_cats)
    # One layout update: selecting each subplot's axes in turn costs plotly.py 20 ms a head, and
    # only axes that draw labels get the labels (plotly.py checks each of them).
    axes = {}
    for i in range(len(heads)):
        suffix = "" if i == 0 else str(i + 1)  # make_subplots numbers the axes of filled cells row by row
        for name, axis, labelled, extra in (("xaxis", x_axis, i + cols >= len(heads), dict(tickangle=-60)),
                                            ("yaxis", y_axis, i % cols == 0, dict(autorange="reversed"))):
            shown = axis if labelled else {k: v for k, v in axis.items() if k != "labelalias"}
            axes[name + suffix] = dict(shown, **extra, automargin=False, showticklabels=labelled)
    fig.update_layout(axes)
    if shared_scale:
        fig.update_layout(coloraxis=dict(colorscale=COLORSCALE, cmin=0, cmax=zmax or 1.0,
                                         colorbar=dict(title="weight", thickness=12)))
    fig.update_layout(title=head, height=height, margin=dict(t=top, l=left, r=10, b=bottom))
    _hidden_background(fig, hidden)
    return fig


def head_heatmap(weights: np.ndarray, query_labels: list[str], key_labels: list[str], *, title: str = "",
                 zmax: float | None = None, diverging: bool = False, height: int = 460,
                 max_cells: int | None = MAX_CELLS, title_chars: int = TITLE_CHARS,
                 visible: np.ndarray | None = None) -> go.Figure:
    """A single ``(n_queries, n_keys)`` heatmap with its colour bar; diverging centres 0 (differences).

    Axes longer than ``max_cells`` are max-pooled in blocks (for a difference, the value largest
    in magnitude wins); ``max_cells=None`` draws every weight. ``visible`` (``View.visible``): cells
    a causal query cannot see are drawn grey.
    """
    n_q, n_k = weights.shape
    q_starts, k_starts = blocks(n_q, max_cells), blocks(n_k, max_cells)
    q_cats, k_cats = block_categories(query_labels, q_starts), block_categories(key_labels, k_starts)
    pooled = len(q_cats) < n_q or len(k_cats) < n_k
    w = pool(weights, q_starts, k_starts, signed=diverging)
    hidden = hidden_cells(visible, q_starts, k_starts)
    if diverging:
        bound = zmax or float(np.abs(weights).max()) or 1.0
        trace = _heatmap(w, q_cats, k_cats, "difference", None, colorscale=DIVERGING, zmid=0, pooled=pooled,
                         hidden=hidden)
        trace.update(zmin=-bound, zmax=bound, reversescale=True)
    else:
        trace = _heatmap(w, q_cats, k_cats, "weight", zmax if zmax is not None else float(weights.max()) or 1.0,
                         pooled=pooled, hidden=hidden)
    trace.update(showscale=True, colorbar=dict(thickness=12))
    fig = go.Figure(trace)
    left, bottom = _margins(query_labels, key_labels)
    fig.update_xaxes(**_axis(key_labels, k_starts, k_cats), tickangle=-60, automargin=False)
    fig.update_yaxes(**_axis(query_labels, q_starts, q_cats), autorange="reversed", automargin=False)
    head = wrapped_title(title, title_chars)
    fig.update_layout(title=head, height=height, margin=dict(t=top_margin(head, room=10), l=left, r=10, b=bottom))
    _hidden_background(fig, hidden)
    return fig


def token_lines(weights: np.ndarray, query_labels: list[str], key_labels: list[str], heads: list[int],
                query: int | None, *, title: str = "", levels: int = 8, floor: float = 0.02,
                max_lines: int = 4096) -> go.Figure:
    """BertViz's head view: tokens in two columns, a line from query to key per head.

    Opacity follows the weight (in ``levels`` steps), colour the head. ``query=None`` draws every
    query's lines. Lines below ``floor`` times a head's largest weight are left out, and a query
    keeps its ``LINES_PER_QUERY`` strongest lines a head (fewer when many queries and heads share ``max_lines``):
    drawing every line of one query over 512 keys took the browser half a second.

    Args:
        weights: ``(heads_in_layer, n_queries, n_keys)``.
    """
    palette = pc.qualitative.Plotly + pc.qualitative.D3
    n_q, n_k = len(query_labels), len(key_labels)
    fig = go.Figure()
    rows = range(n_q) if query is None else [query]
    per_row = max(1, min(LINES_PER_QUERY, max_lines // (len(rows) * max(1, len(heads)))))
    row_index = np.asarray(rows)
    for h in heads:
        w = weights[h][row_index]  # (rows, keys)
        top = float(w.max()) or 1.0
        color = pc.hex_to_rgb(palette[h % len(palette)])
        # a key's share of the head's largest weight, 0 outside each query's strongest keys
        strongest = np.partition(w, -min(per_row, n_k), axis=1)[:, -min(per_row, n_k)]
        share = np.where(w >= strongest[:, None], w / top, 0.0)
        for level in range(1, levels + 1):
            lo, hi = (level - 1) / levels, level / levels
            qs, ks = np.nonzero((share > max(lo, floor)) & (share <= hi))
            xs = [x for _ in qs for x in (0, 1, None)]
            ys = [y for q, k in zip(row_index[qs].tolist(), ks.tolist()) for y in (-q, -k, None)]
            if xs:
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=level == levels,
                                         legendgroup=f"h{h}", name=f"head {h}",
                                         line=dict(width=2, color=f"rgba({color[0]},{color[1]},{color[2]},{hi:.3f})")))
    q_weight = None if query is None else weights[heads][:, query].mean(axis=0)
    fig.add_trace(go.Scatter(
        x=[0] * n_q, y=[-i for i in range(n_q)], mode="text", text=[_tick(t, LINE_CHARS) for t in query_labels],
        textposition="middle left", showlegend=False, name="queries",
        textfont=dict(color=["#d62728" if i == query else "#333" for i in range(n_q)], size=13),
        hovertemplate="%{text}<extra>query</extra>"))
    fig.add_trace(go.Scatter(
        x=[1] * n_k, y=[-i for i in range(n_k)], mode="text", text=[_tick(t, LINE_CHARS) for t in key_labels],
        textposition="middle right", showlegend=False, name="keys", textfont=dict(size=13),
        customdata=q_weight, hovertemplate="%{text}" + ("" if query is None else "<br>mean weight %{customdata:.3f}")
        + "<extra>key</extra>"))
    fig.update_xaxes(visible=False, range=[-0.9, 1.9])
    fig.update_yaxes(visible=False, range=[-max(n_q, n_k) + 0.5, 0.5])
    head = wrapped_title(title)
    fig.update_layout(title=head, height=max(360, 22 * max(n_q, n_k) + 170),
                      margin=dict(t=top_margin(head), l=10, r=10, b=70), legend=dict(orientation="h", y=-0.02, yanchor="top"),
                      plot_bgcolor="white")
    return fig


def text_shading(labels: list[str], values: np.ndarray, *, title: str = "",
                 highlight: int | Collection[int] | None = None, line_chars: int = 56) -> go.Figure:
    """The text as a paragraph of cells, each token shaded by its value; ``highlight`` (a token or
    several) is written in bold.

    Each line is a one-row heatmap whose cells are as wide as their tokens (in characters, with
    room around them; tokens beyond 20 characters are cut, hover shows them whole), so a long
    word gets the room it needs. ``line_chars`` characters fill the chart's width: 56 fit a chart
    564 px wide, the narrowest a 1024 px window gives.
    """
    widths = [min(len(visible(label)), LINE_CHARS) + 3 for label in labels]
    lines, current, width = [], [], 0
    for i, w in enumerate(widths):
        if current and width + w > line_chars:
            lines.append(current)
            current, width = [], 0
        current.append(i)
        width += w
    if current:
        lines.append(current)
    bold = set() if highlight is None else {highlight} if isinstance(highlight, (int, np.integer)) else set(highlight)
    fig = go.Figure()
    for r, line in enumerate(lines):
        text = [f"<b>{_tick(labels[i], LINE_CHARS)}</b>" if i in bold else _tick(labels[i], LINE_CHARS) for i in line]
        fig.add_trace(go.Heatmap(
            z=np.asarray([[values[i] for i in line]], dtype=np.float32), x=np.cumsum([0] + [widths[i] for i in line]),
            y=[r - 0.5, r + 0.5], text=[text], customdata=[[safe(labels[i]) for i in line]], texttemplate="%{text}",
            textfont=dict(size=13), coloraxis="coloraxis", xgap=3, ygap=6, name=f"line {r + 1}",
            hovertemplate="%{customdata}: %{z:.3f}<extra></extra>"))
    top = float(np.max(values)) if len(values) else 0.0
    fig.update_layout(coloraxis=dict(colorscale=COLORSCALE, cmin=0, cmax=top or 1.0,
                                     colorbar=dict(title="weight", thickness=12)))
    fig.update_xaxes(visible=False, range=[0, line_chars])
    fig.update_yaxes(visible=False, range=[len(lines) - 0.5, -0.5])
    head = wrapped_title(title)
    fig.update_layout(title=head, height=52 * len(lines) + 110, margin=dict(t=top_margin(head), l=10, r=10, b=10),
                      plot_bgcolor="white")
    return fig
