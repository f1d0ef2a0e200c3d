"""Opening a head's card: from a button beside a chosen head, or from a click on a head a chart draws."""
from __future__ import annotations

from urllib.parse import urlencode

import streamlit as st

from models import head_label

from ..results.card import telling
from ..results.models import ModelRef
from .state import click_head, fresh_click, head_of, open_page

HEAD_PAGE = "app_pages/head.py"


CARRIED = ("model", "custom_model", "device", "text")  # what a card's link keeps of the page's address


def card_url(layer: int, head: int) -> str:
    """The address of ``(layer, head)``'s card of the sidebar's model, relative to the page's, with the sidebar's
    model and text as the page's address holds them."""
    kept = {k: st.query_params[k] for k in CARRIED if k in st.query_params}
    return "head?" + urlencode({**kept, "head": f"{layer}.{head}"})


def open_card(layer: int, head: int, choice: str | None = None) -> None:
    """Open ``(layer, head)``'s card (of the sidebar's model, or of ``choice``) when the next run starts."""
    values = {"head": (int(layer), int(head))}
    if choice is not None:
        values["model"] = choice
    open_page(HEAD_PAGE, **values)


def card_button(layer: int, head: int, key: str, container=st, choice: str | None = None, label: str | None = None):
    """A button that opens ``(layer, head)``'s card."""
    container.button(label or f"{head_label(layer, head)}'s card", key=key, icon=":material/badge:",
                     on_click=open_card, args=(layer, head, choice), help="Everything HeadLens measures of this head, "
                     "on one page.")


def start_here(ref: ModelRef, causal: bool, heads_off: tuple, container=st) -> None:
    """The home page's one click to a card: the model's most telling head (``results.card.telling``), named once the
    detector or the profile it is read from is ready; until then the Head page finds it."""
    found = telling(ref, causal, heads_off, compute=False)
    if found is None:
        container.page_link(HEAD_PAGE, label="Start with one head: the model's most telling one, on its card",
                            icon=":material/badge:")
        return
    layer, head, role = found
    card_button(layer, head, "home-card", container, label=f"Start with one head: {head_label(layer, head)}, {role}")


def click_picks_head(event, key: str, figure, n_heads: int | None, *, picker: str | None = None,
                     choice: str | None = None) -> None:
    """A fresh click on a head (``point_picks_head``), if ``event`` holds one."""
    point = fresh_click(event, key)
    if point is not None:
        point_picks_head(point, figure, n_heads, picker=picker, choice=choice)


def point_picks_head(point: dict, figure, n_heads: int | None, *, picker: str | None = None,
                     choice: str | None = None) -> None:
    """What a click on a head does, on every page: where the page shows one head (``picker``, the key of its head
    picker: Effects) the head is picked there; everywhere else its card opens (of ``choice``'s model, else the
    sidebar's). The head is the one a point of a grid's "heads" trace names (one a head, in order, ``n_heads`` a
    row), or a point whose ``customdata`` is ``[layer, head]``; a point that names none does nothing."""
    head = head_of(point, figure, n_heads)
    if head is None:
        return
    if picker is not None:
        click_head(picker, head)
    else:
        open_card(*head, choice)
        st.rerun()
