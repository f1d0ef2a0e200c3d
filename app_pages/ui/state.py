"""Widget values that live in the session and the URL.

Every widget that shapes a view takes its value from, in order: its own state on this page;
what this session chose last (so a value survives a page switch); the URL, for a session just
opened from a link; its default. Each run writes the value back to the URL (defaults left out),
so a copied link reproduces the view.
"""
from __future__ import annotations

import streamlit as st

from models import Head


def remember(key: str, value) -> None:
    """Keep a view choice for the session, so a page opened later starts from it."""
    st.session_state.setdefault("_kept", {})[key] = value


def flag(text: str) -> bool:
    """A URL value as a boolean; anything else than the usual words is refused."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def head_from_url(text: str) -> Head:
    """A head as the URL writes it, "3.11", as ``(3, 11)``."""
    layer, head = text.split(".")
    return int(layer), int(head)


def head_to_url(head: Head) -> str:
    return f"{head[0]}.{head[1]}"


def open_page(page: str, **values) -> None:
    """Ask for ``page``, its widgets starting from ``values``; ``app.py`` switches to it when the next run
    starts. It works from a button's callback, where ``st.switch_page`` cannot be called, and before
    the widgets are drawn, so that the sidebar's widgets start again from ``values`` too."""
    for key, value in values.items():
        preset(key, value)
    st.session_state["_open_page"] = page


def preset(key: str, value) -> None:
    """Start the widget ``key`` from ``value`` the next time it is drawn (before it is drawn in this run)."""
    st.session_state.pop(key, None)
    remember(key, value)


def _from_url(key: str, cast, multi: bool):
    if key not in st.query_params:
        raise KeyError(key)
    return [cast(x) for x in st.query_params.get_all(key)] if multi else cast(st.query_params[key])


def _to_url(key: str, value, default, multi: bool, to_url=str) -> None:
    if value == default or value is None:
        if key in st.query_params:
            del st.query_params[key]
        return
    one = {True: "true", False: "false"}.get(value) if isinstance(value, bool) else None
    text = [to_url(v) for v in value] if multi else one or to_url(value)
    current = st.query_params.get_all(key) if multi else st.query_params.get(key)
    if current != text:
        st.query_params[key] = text


def bound(draw, key: str, default, *, init: str = "value", options: list | None = None, multi: bool = False,
          cast=str, to_url=str, valid=None, **kwargs):
    """Draw a widget (``st.selectbox``, ``container.toggle``…) whose value lives in the session and the URL.

    Args:
        draw: the widget function, called with ``key``, ``kwargs``, ``options`` when given, and the
            initial value under ``init`` ("value", "default", or "index" into ``options``).
        default: the value when neither this session nor the URL gives one; left out of the URL.
        options: the allowed values; a kept or linked value outside them is ignored.
        multi: the value is a list (multiselect).
        cast: turns one URL string into a value (``int``, ``flag``, ``head_from_url``…); ``to_url`` back.
    """
    if valid is None:
        valid = (lambda v: True) if options is None else (
            (lambda v: all(x in options for x in v)) if multi else (lambda v: v in options))
    ss = st.session_state
    if key in ss and not valid(ss[key]):
        del ss[key]
    # The widget's own state wins once it exists; this initial value matters on the first run of
    # a page, which after a page switch is a new widget with the same key.
    initial = default
    for get in (lambda: ss["_kept"][key], lambda: _from_url(key, cast, multi)):
        try:
            value = get()
        except (KeyError, ValueError, TypeError):
            continue
        if valid(value):
            initial = value
            break
    if options is not None:
        kwargs["options"] = options
    kwargs[init] = options.index(initial) if init == "index" else initial
    value = draw(key=key, **kwargs)
    remember(key, value)
    _to_url(key, value, default, multi, to_url)
    return value


def choose(label: str, options: list, key: str, default=None, container=st, cast=int, **kwargs):
    """A selectbox of ``options`` whose choice lives in the session and the URL."""
    default = default if default in options else options[0]
    return bound(container.selectbox, key, default, init="index", options=options, cast=cast, label=label, **kwargs)


def fresh_click(event, key: str):
    """The first point of a chart's selection when it differs from the one handled last; else None.

    A chart keeps its selection across reruns, so a click is acted on once; widgets changed since
    then keep their values."""
    points = list(event.selection.points) if event else []
    seen = st.session_state.get(f"_{key}_handled")
    point = points[0] if points else None
    signature = None if point is None else (point.get("curve_number"), point.get("point_index"))
    st.session_state[f"_{key}_handled"] = signature
    return point if signature is not None and signature != seen else None


def choose_head(key: str, picks: list, **kwargs) -> Head:
    """A head picker kept in the session and the URL, set first by a click a chart made in the run before
    (``click_head``)."""
    clicked = st.session_state.pop(f"_{key}_click", None)
    if clicked in picks:
        st.session_state[key] = clicked
    return choose("Head", picks, key, cast=head_from_url, to_url=head_to_url, **kwargs)


def click_head(key: str, head: Head) -> None:
    """Open ``head`` in the picker ``key`` (``choose_head``) in a rerun."""
    st.session_state[f"_{key}_click"] = tuple(int(x) for x in head)
    st.rerun()


def head_of(point: dict, figure, n_heads: int | None) -> Head | None:
    """The head a clicked ``point`` of ``figure`` names: a point of a head grid's "heads" trace (one a head, in
    order, ``n_heads`` a row), or a point whose ``customdata`` is ``[layer, head]`` (a list, or the
    ``{"0": layer, "1": head}`` mapping the browser sends); None for any other point."""
    trace = figure.data[int(point.get("curve_number", 0))]
    if trace.name == "heads" and "point_index" in point and n_heads:
        return divmod(int(point["point_index"]), n_heads)
    data = point.get("customdata")
    if trace.name != "this head" and data is not None and len(data) >= 2:
        head = tuple(int(data[k]) for k in ((0, 1) if isinstance(data, (list, tuple)) else ("0", "1")))
        return head if head[0] >= 0 else None  # a point of no head (an MLP's, the embeddings')
    return None
