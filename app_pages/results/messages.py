"""Text a user typed, shown back literally; errors as one sentence."""
from __future__ import annotations

import re

import streamlit as st

_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=%^@/,;?\"'])")
_AUTOLINK = re.compile(r"(?i)(https?|ftp|www|mailto|xmpp)(?=\\[:.])|(?=\\@)")


def plain(text: str) -> str:
    """``text`` for an element that renders Markdown (alerts, captions), so that it shows literally.

    Every punctuation mark is backslash-escaped; web and mail addresses, which Markdown links
    even when escaped, get a word joiner (invisible) after their scheme and before their "@".
    """
    return _AUTOLINK.sub("\\g<0>\u2060", _MARKDOWN.sub(r"\\\1", text))


def markdown_table(rows: list[dict]) -> str:
    """``rows`` (each a column name -> its text) as a Markdown table, every cell shown literally: lighter on a page
    than a data grid, for a few rows read at a glance."""
    if not rows:
        return ""
    names = list(rows[0])
    lines = ["| " + " | ".join(map(plain, names)) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(plain(str(r[n])) for n in names) + " |" for r in rows]
    return "\n".join(lines)


def stop_with(err: Exception) -> None:
    """Show ``err`` as its sentence and end this run; the session goes on."""
    st.error(plain(str(err)))
    st.stop()


def short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
