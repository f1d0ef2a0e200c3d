"""Widget values that live in the session and the URL.

Every widget that shapes a view takes its value from, in order: its own state on this page;
what this session chose last (so a value survives a page switch); the URL, for a session just
opened from a link; its default. Each run writes the value back to the URL (defaults left out),
so a copied link reproduces the view.
"""
from __future__ import annotations

import streamlit as st


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


def _from_url(key: str, cast, multi: bool):
    if key not in st.query_params:
        raise KeyError(key)
    return [cast(x) for x in st.query_params.get_all(key)] if multi else cast(st.query_params[key])


def _to_url(key: str, value, default, multi: bool) -> None:
    if value == default or value is None:
        if key in st.query_params:
            del st.query_params[key]
        return
    text = [str(v) for v in value] if multi else ("true" if value is True else "false" if value is False else str(value))
    current = st.query_params.get_all(key) if multi else st.query_params.get(key)
    if current != text:
        st.query_params[key] = text


def bound(draw, key: str, default, *, init: str = "value", options: list | None = None, multi: bool = False,
          cast=str, valid=None, **kwargs):
    """Draw a widget (``st.selectbox``, ``container.toggle``…) whose value lives in the session and the URL.

    Args:
        draw: the widget function, called with ``key``, ``kwargs``, ``options`` when given, and the
            initial value under ``init`` ("value", "default", or "index" into ``options``).
        default: the value when neither this session nor the URL gives one; left out of the URL.
        options: the allowed values; a kept or linked value outside them is ignored.
        multi: the value is a list (multiselect).
        cast: turns one URL string into a value (``int``, ``flag``…).
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
    _to_url(key, value, default, multi)
    return value


def choose(label: str, options: list, key: str, default=None, container=st, cast=int, **kwargs):
    """A selectbox of ``options`` whose choice lives in the session and the URL."""
    default = default if default in options else options[0]
    return bound(container.selectbox, key, default, init="index", options=options, cast=cast, label=label, **kwargs)
