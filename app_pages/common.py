"""What every page shares: the sidebar's settings, cached models and results, pickers, exports.

Every widget that shapes a view takes its value from, in order: its own state on this page;
what this session chose last (so a value survives a page switch); the URL, for a session just
opened from a link; its default. Each run writes the values back to the URL (defaults left out),
so a copied link reproduces the view. Models are cached for all sessions and never changed by
one; results are cached by everything that determines them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import streamlit as st
import torch

from analysis import RANKING_MEASURES, View, head_similarity, make_view, measure_heads
from analysis.export import attention_json, attention_npz, head_csv
from models import Attention, AttentionModel, HeadLensError, load_model
from viz.export import figure_html, figure_image

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EXAMPLES: dict[str, str] = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
DEFAULT_TEXT = next(iter(EXAMPLES.values()))
MAX_CHARS = 20_000
MAX_SENTENCES = 24
PROFILE_BYTES = 512 * 2**20  # attention weights one head-role profile may hold

MODELS = {
    "minilm": "all-MiniLM-L6-v2 · transformers",
    "scratch": "all-MiniLM-L6-v2 · from-scratch engine",
    "untrained": "Untrained encoder · from scratch, seed 0",
    "custom": "Custom model (id or folder) · transformers",
}
SCRATCH = {"scratch", "untrained"}  # the choices that run our engine: head masks and causal apply


def check_custom_folder(name: str) -> None:
    """Where ``HEADLENS_MODELS_DIR`` is set (a server for a class), custom model folders must lie under it.

    Model ids still come from the server's Hugging Face cache; any other folder is refused
    without saying whether it exists.
    """
    root = os.environ.get("HEADLENS_MODELS_DIR")
    path = Path(name).expanduser()
    if not root or not (path.is_absolute() or path.exists() or name.startswith((".", "~"))):
        return
    if not path.resolve().is_relative_to(Path(root).expanduser().resolve()):
        raise HeadLensError(f"This server loads model folders from {root} only; give a folder there, "
                            "or a model id from its Hugging Face cache.")


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_model(choice: str, custom: str, device: str) -> AttentionModel:
    """One instance per (model, device) for every session; it is only ever read."""
    if choice == "custom":
        if not custom.strip():
            raise HeadLensError("Type a model id from the local Hugging Face cache, or the path of a model folder.")
        return load_model(custom.strip(), device=device)
    return load_model(backend="transformers" if choice == "minilm" else "scratch", device=device,
                      untrained=choice == "untrained")


def head_mask(model: AttentionModel, heads_off: tuple[str, ...]) -> np.ndarray | None:
    """``(layers, heads)`` 0/1 from "layer.head" names; None when every head is on."""
    if not heads_off:
        return None
    mask = np.ones((model.n_layers, model.n_heads), dtype=np.float32)
    for item in heads_off:
        layer, head = map(int, item.split("."))
        mask[layer, head] = 0
    return mask


@st.cache_data(max_entries=64, max_size="1GiB", show_spinner=False)
def cached_attention(choice: str, custom: str, device: str, text: str, causal: bool,
                     heads_off: tuple[str, ...]) -> Attention:
    model = cached_model(choice, custom, device)
    return model.attend(text, head_mask=head_mask(model, heads_off), causal=causal)


class ProfileCache:
    """The last few head-role profiles, for every session: (frame, per-sentence measures, attentions).

    st.cache_data cannot drive a progress bar from inside a cached function, so profiles are
    kept here and computed outside it. Values are only ever read; the frame is copied on the way out.
    """

    def __init__(self, max_entries: int = 4):
        self.max_entries, self._items, self._lock = max_entries, OrderedDict(), threading.Lock()
        self._computing: dict = {}  # key -> lock held by the session computing that profile

    def computing(self, key) -> threading.Lock:
        """The lock to hold while computing ``key``, so that sessions asking at once compute it once."""
        with self._lock:
            return self._computing.setdefault(key, threading.Lock())

    def get(self, key):
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            frame, per_sentence, attentions = self._items[key]
        return frame.copy(), per_sentence, attentions

    def put(self, key, value) -> None:
        with self._lock:
            self._items[key] = value
            self._computing.pop(key, None)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)


@st.cache_resource
def profile_cache() -> ProfileCache:
    return ProfileCache()


def profile(s: "Settings", sentences: list[str]):
    """Head roles over ``sentences`` for the sidebar's model, with a progress bar while it runs.

    Returns the per-head frame, per-sentence measures (``(sentences, layers, heads)`` each, and
    ``"similarity"``: the heads' Jensen-Shannon divergences), and the attentions.
    """
    key = (s.choice, s.custom, s.device, s.causal, s.heads_off,
           hashlib.sha256("\n".join(sentences).encode("utf-8", "surrogatepass")).hexdigest())
    cache = profile_cache()
    cached = cache.get(key)
    if cached is not None:
        return cached
    model = model_for(s.choice, s.custom, s.device)
    lock = cache.computing(key)
    if not lock.acquire(blocking=False):
        with st.spinner("Another session is profiling the same sentences; its result will be shown here…"):
            lock.acquire()
    try:
        cached = cache.get(key)
        return cached if cached is not None else _compute_profile(model, s, sentences, key)
    finally:
        lock.release()


def _compute_profile(model: AttentionModel, s: "Settings", sentences: list[str], key):
    try:
        sentences = within_budget(model, sentences)
    except HeadLensError as err:
        stop_with(err)
    bar = st.progress(0.0, text=f"Profiling {len(sentences)} sentences…")
    try:
        attentions = model.attend(sentences, head_mask=head_mask(model, s.heads_off), causal=s.causal,
                                  progress=lambda done, total: bar.progress(
                                      done / total, text=f"Profiling… {done} of {total} sentences"))
    except HeadLensError as err:
        stop_with(err)
    bar.progress(1.0, text="Measuring every head…")
    measures = measure_heads(attentions)
    per_sentence = {name: measures.per_sentence(name) for name in RANKING_MEASURES}
    per_sentence["similarity"] = head_similarity(attentions)
    bar.empty()
    value = (measures.frame(), per_sentence, attentions)
    profile_cache().put(key, value)
    return value[0].copy(), per_sentence, attentions


def within_budget(model: AttentionModel, sentences: list[str]) -> list[str]:
    """The first sentences whose attention weights fit ``PROFILE_BYTES``, with a note when some are left out."""
    sizes = np.cumsum([n * n * model.bytes_per_token_pair for n in model.token_counts(sentences)])
    keep = max(1, int(np.searchsorted(sizes, PROFILE_BYTES, side="right")))
    if keep < len(sentences):
        st.warning(f"Profiling the first {keep:,} of {len(sentences):,} sentences: their attention weights "
                   f"fill the {PROFILE_BYTES // 2**20} MiB a profile may hold.")
    return sentences[:keep]


def readable(line: str) -> bool:
    """Whether a line has a character to read: not only spaces, control or invisible characters."""
    return any(ch.isprintable() and not ch.isspace() for ch in line)


def sentences_of(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if readable(line)]


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=%^@/,;?\"'])")
_AUTOLINK = re.compile(r"(?i)(https?|ftp|www|mailto|xmpp)(?=\\[:.])|(?=\\@)")


def plain(text: str) -> str:
    """``text`` for an element that renders Markdown (alerts, captions), so that it shows literally.

    Every punctuation mark is backslash-escaped; web and mail addresses, which Markdown links
    even when escaped, get a word joiner (invisible) after their scheme and before their "@".
    """
    return _AUTOLINK.sub("\\g<0>\u2060", _MARKDOWN.sub(r"\\\1", text))


@dataclass(frozen=True)
class Settings:
    choice: str
    custom: str
    device: str
    sentences: list[str]
    hide_special: bool
    merge_words: bool
    shared_scale: bool
    causal: bool
    heads_off: tuple[str, ...]


def stop_with(err: Exception) -> None:
    st.error(plain(str(err)))
    st.stop()


def model_for(choice: str, custom: str, device: str, container=st) -> AttentionModel:
    slot = container.empty()  # keeps the elements after it in place, spinner or not
    try:
        if choice == "custom":
            check_custom_folder(custom.strip())  # before the cache, which may hold it from before
        with slot, st.spinner("Loading the model…"):
            model = cached_model(choice, custom, device)
    except HeadLensError as err:
        stop_with(err)
    slot.empty()
    return model


def _load_example() -> None:
    name = st.session_state.get("example")
    if name in EXAMPLES:
        remember("text", EXAMPLES[name])
        st.session_state.pop("text", None)  # the text box starts again, from the example


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def sidebar() -> None:
    """The controls every page shares; their values live in session state and the URL."""
    sb = st.sidebar
    choice = bound(sb.selectbox, "model", "minilm", init="index", options=list(MODELS), label="Model",
                   format_func=MODELS.get)
    if choice == "custom":
        bound(sb.text_input, "custom_model", "", label="Model id or folder",
              placeholder="bert-base-uncased or /path/to/model",
              help="A model already in the local Hugging Face cache, or a folder with config.json and "
                   "model.safetensors. Nothing is downloaded.")
    devices = ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    device = bound(sb.selectbox, "device", "auto", init="index", options=devices, label="Device")
    sb.selectbox("Examples", list(EXAMPLES), index=None, placeholder="Load an example…", key="example",
                 on_change=_load_example)
    bound(sb.text_area, "text", DEFAULT_TEXT, valid=lambda t: len(t) <= MAX_CHARS, label="Sentences, one per line",
          height=140, max_chars=MAX_CHARS, help="Press Ctrl+Enter to apply.")
    sb.subheader("View options")
    bound(sb.toggle, "hide_special", False, cast=_flag, label="Hide special tokens",
          help="Drop [CLS], [SEP], <s>… and renormalise each row.")
    bound(sb.toggle, "merge_words", False, cast=_flag, label="Merge subwords into words",
          help="Sum over a word's pieces as keys, average over them as queries (Clark et al., 2019).")
    bound(sb.toggle, "shared_scale", True, cast=_flag, label="One colour scale for all heads")
    scratch = choice in SCRATCH
    bound(sb.toggle, "causal", False, cast=_flag, label="Causal mask", disabled=not scratch,
          help="Each token sees only earlier ones; the from-scratch engine only.")
    model = model_for(choice, st.session_state.get("custom_model", ""), device, container=sb)
    if scratch:
        names = [f"{l}.{h}" for l in range(model.n_layers) for h in range(model.n_heads)]
        bound(sb.multiselect, "heads_off", [], init="default", options=names, multi=True, label="Switch heads off",
              placeholder="layer.head",
              help="Head masking, from-scratch engine only; later layers then see the model without those heads.")
    sb.caption(f"Running on **{model.device}** · {model.n_layers} layers × {model.n_heads} heads")


def settings() -> Settings:
    """The sidebar's current values, read from session state (the sidebar has already run)."""
    ss = st.session_state
    text = ss.get("text") or ""
    sentences = sentences_of(text)
    if not sentences:
        if text.strip():
            st.warning("None of these lines has anything to read: only spaces, control or invisible characters. "
                       "Type a sentence in the sidebar, then press Ctrl+Enter.")
        else:
            st.info("Type a sentence in the sidebar, one per line, then press Ctrl+Enter.")
        st.stop()
    if len(sentences) > MAX_SENTENCES:
        st.warning(f"Showing the first {MAX_SENTENCES} of {len(sentences)} lines.")
        sentences = sentences[:MAX_SENTENCES]
    choice = ss.get("model", "minilm")
    scratch = choice in SCRATCH
    return Settings(choice, ss.get("custom_model", "") or "", ss.get("device", "auto"), sentences,
                    bool(ss.get("hide_special")), bool(ss.get("merge_words")), bool(ss.get("shared_scale", True)),
                    scratch and bool(ss.get("causal")), tuple(ss.get("heads_off") or ()) if scratch else ())


def attention(s: Settings, text: str, choice: str | None = None, key: str = "component", container=st) -> Attention:
    """The attention of ``text``; for an encoder-decoder model, the part picked under ``key``."""
    choice = choice or s.choice
    scratch = choice in SCRATCH
    model_for(choice, s.custom, s.device)
    # One slot, present on every run, holds the spinner and then the truncation note: elements
    # below it keep their place, so the chart updates in place instead of being drawn anew.
    slot = container.empty()
    try:
        with slot, st.spinner("Computing attention…"):
            att = cached_attention(choice, s.custom, s.device, text, s.causal and scratch,
                                   s.heads_off if scratch else ())
    except HeadLensError as err:
        stop_with(err)
    if att.truncated:
        slot.warning(f"This text has {att.n_tokens_original} tokens; the model reads at most "
                     f"{len(att.tokens)}, so it was cut there.")
    else:
        slot.empty()
    if att.decoder is None:
        return att
    parts = {"encoder": att, "decoder": att.decoder, "cross": att.cross}
    names = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention",
             "cross": "Cross-attention (decoder → encoder)"}
    return parts[choose("Attention", list(parts), key, container=container, cast=str, format_func=names.get)]


def view(s: Settings, att: Attention) -> View:
    return make_view(att, hide_special=s.hide_special, merge_words=s.merge_words)


def remember(key: str, value) -> None:
    """Keep a view choice for the session, so a page opened later starts from it."""
    st.session_state.setdefault("_kept", {})[key] = value


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
        cast: turns one URL string into a value (``int``, a flag parser…).
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


def short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def pick_sentence(s: Settings, key: str = "sentence", container=st, label: str = "Sentence") -> str:
    i = choose(label, list(range(len(s.sentences))), key, container=container,
               format_func=lambda i: f"{i + 1}. {short(s.sentences[i])}")
    return s.sentences[i]


def pick_layer(n_layers: int, key: str = "layer", container=st) -> int:
    return choose("Layer", list(range(n_layers)), key, container=container)


def pick_head(n_heads: int, key: str = "head", container=st, label: str = "Head") -> int:
    return choose(label, list(range(n_heads)), key, container=container)


def pick_heads(n_heads: int, key: str = "heads", container=st) -> list[int]:
    options = list(range(n_heads))
    heads = bound(container.multiselect, key, options, init="default", options=options, multi=True, cast=int,
                  label="Heads")
    if not heads:
        st.info("Pick at least one head.")
        st.stop()
    return sorted(heads)


def pick_query(v: View, key: str = "query", container=st, allow_all: bool = True) -> int | None:
    options = ([-1] if allow_all else []) + list(range(len(v.query_labels)))
    words = [i for i in range(len(v.query_labels)) if not v.query_special[i]]
    q = choose("Query token", options, key, default=words[0] if words else options[0], container=container,
               format_func=lambda i: "all tokens" if i == -1 else f"{i}: {v.query_labels[i]}")
    return None if q == -1 else q


def title_for(att: Attention, what: str) -> str:
    return f"{what} · {short(att.text, 70)}"


def exports(key: str, fig, att: Attention | None, v: View | None = None, layer: int | None = None,
            head: int | None = None, sig: str = "") -> None:
    """Download buttons: the figure (HTML, and PNG/SVG on request), the attention, one head as CSV.

    ``sig`` names what the figure shows; rendered images are offered only while it is unchanged.
    """
    stem = f"headlens-{key}"
    cols = st.columns(5)
    cols[0].download_button("Figure · HTML", lambda: figure_html(fig), f"{stem}.html", "text/html",
                            key=f"{key}-html", on_click="ignore")
    if att is not None:
        cols[1].download_button("Attention · NPZ", lambda: attention_npz(att), f"{stem}.npz",
                                "application/octet-stream", key=f"{key}-npz", on_click="ignore")
        cols[2].download_button("Attention · JSON", lambda: attention_json(att), f"{stem}.json", "application/json",
                                key=f"{key}-json", on_click="ignore")
    if v is not None and layer is not None and head is not None:
        cols[3].download_button(f"Head {layer}.{head} · CSV", head_csv(v, layer, head),
                                f"{stem}-L{layer}H{head}.csv", "text/csv", key=f"{key}-csv", on_click="ignore")
    stored = st.session_state.get(f"{key}-images")
    images = stored[1] if stored and stored[0] == sig else None
    if cols[4].button("PNG and SVG…", key=f"{key}-render", help="Renders on the server with Chromium; "
                      "the camera in the chart's toolbar saves a PNG too."):
        try:
            with st.spinner("Rendering images…"):
                images = {fmt: figure_image(fig, fmt) for fmt in ("png", "svg")}
            st.session_state[f"{key}-images"] = (sig, images)
        except RuntimeError as err:
            st.warning(plain(str(err)))
    if images:
        a, b, _ = st.columns([1, 1, 3])
        a.download_button("Download PNG", images["png"], f"{stem}.png", "image/png", key=f"{key}-png",
                          on_click="ignore")
        b.download_button("Download SVG", images["svg"], f"{stem}.svg", "image/svg+xml", key=f"{key}-svg",
                          on_click="ignore")


def chart(fig, key: str, **kwargs):
    return st.plotly_chart(fig, key=key, theme=None, config={"displaylogo": False, "toImageButtonOptions": {"scale": 2}},
                           **kwargs)
