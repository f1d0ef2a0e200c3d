"""The sidebar's models and a page's model loaded under a spinner, its error said as a sentence."""
from __future__ import annotations

import json

import streamlit as st

from models import AttentionModel, HeadLensError
from models.catalog import bundled

from ..results.messages import stop_with
from ..results.models import CUSTOM, LLM, MODELS, TRAINED, TYPED, ModelRef, cached_model, check_custom_folder
from ..results.threads import in_background
from ..results.models import trained_job


def model_names() -> dict[str, str]:
    """The sidebar's models: the bundled ones, and this session's trained decoder once there is one."""
    return {**MODELS, **TRAINED} if trained_job() is not None else dict(MODELS)


def ref_for(choice: str, device: str) -> ModelRef:
    """``choice`` with what this session gives it: the custom folder, or the trained run's id."""
    if choice in TRAINED:
        job = st.session_state.get("trained_job")
        return ModelRef(choice, run=job.id if job is not None else "", device=device)
    if choice in CUSTOM:
        return ModelRef(choice, folder=(st.session_state.get("custom_model") or "").strip(), device=device,
                        download=bool(st.session_state.get("custom_download")))
    if choice == TYPED:  # the program as typed, what the sidebar's RASP box holds
        ss = st.session_state
        return ModelRef(choice, folder=json.dumps({"text": ss.get("rasp_program", EXAMPLE), "vocab": ss.get(
            "rasp_vocab", EXAMPLE_VOCAB), "length": ss.get("rasp_length", EXAMPLE_LENGTH),
            "causal": bool(ss.get("rasp_causal"))}), device=device)
    return ModelRef(choice, device=device)


EXAMPLE = """# sort, each token once (Tracr's make_sort_unique)
smaller = select(tokens, tokens, <)
target_pos = selector_width(smaller)
sort = aggregate(select(target_pos, indices, ==), tokens)"""
EXAMPLE_VOCAB, EXAMPLE_LENGTH = "1 2 3 4 5", 5  # what the sidebar's RASP box opens on


_READ: set[str] = set()  # the bundled GGUF models this server has found read into their folders


def read_once(model, slot) -> None:
    """A bundled GGUF model's file read into its folder, with a progress bar the first time on a machine."""
    if model.name is None or model.name in _READ:
        return
    from models.files import resolve_model_dir

    with slot.container():
        bar = st.progress(0.0, text=f"{model.title} {model.first_load}…")
        resolve_model_dir(model.name, progress=lambda done, total: bar.progress(
            min(done / max(total, 1), 1.0), text=f"Reading {model.title}'s GGUF file (once per machine): tensor "
                                                 f"{done} of {total}"))
        bar.empty()
    _READ.add(model.name)


def fetched(name: str, slot) -> None:
    """``name`` fetched from the Hub when it is neither a folder nor in the local cache, with a progress bar."""
    from models.files import resolve_model_dir

    try:
        resolve_model_dir(name)
        return
    except HeadLensError:
        pass
    from models.download import download

    with slot.container():
        bar = st.progress(0.0, text=f"Downloading {name}…")
        download(name, progress=lambda done, total: bar.progress(
            min(done / max(total, 1), 1.0), text=f"Downloading {name}… {done / 2**20:,.1f} of {total / 2**20:,.1f} MiB"))
        bar.empty()


def model_for(ref: ModelRef, container=st) -> AttentionModel:
    """The cached model, with a spinner while it loads and its error as a sentence."""
    if in_background():
        return cached_model(ref)
    slot = container.empty()  # keeps the elements after it in place, spinner or not
    try:
        if ref.choice in CUSTOM:
            check_custom_folder(ref.folder)  # before the cache, which may hold it from before
            if ref.download:
                fetched(ref.folder, slot)
        model = bundled(ref.choice)
        if ref.choice in LLM:
            read_once(model, slot)
        with slot, st.spinner(f"Loading the model… ({model.title} {model.first_load})" if ref.choice in LLM
                              else "Compiling your program with Tracr… (seconds, once per program)"
                              if ref.choice == TYPED else "Loading the model…"):
            model = cached_model(ref)
    except HeadLensError as err:
        stop_with(err)
    slot.empty()
    return model
