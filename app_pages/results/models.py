"""Which model a page shows (``ModelRef``), and the model itself: one instance per model and device for every
session, only ever read; a model trained in this session is this session's own."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from models import VOCABULARY, AttentionModel, HeadLensError, load_model
from models.catalog import CATALOG, bundled
from models.compiled import BUILT_IN as PROGRAMS, Program, compiled
from models.rasp_text import Typed, compile_typed, parse_rasp, read_vocab



def _choices(models) -> dict[str, str]:
    return {k: f"{b.title} · {'transformers' if engine == 'transformers' else 'from-scratch engine'}"
            for b in models for k, engine in b.engines().items()}


SPEAKING = tuple(b for b in CATALOG if VOCABULARY in b.offers)  # the bundled language models: a vocabulary to write


TYPED = "compiled_typed"  # a RASP program typed in the sidebar (``models.rasp_text``), compiled by Tracr
COMPILED = {**{f"compiled_{name}": p.title for name, p in PROGRAMS.items()},  # RASP programs compiled by Tracr
            TYPED: "Compiled · your own RASP program"}


MODELS = {  # the sidebar's choices: each bundled model on each engine (models.catalog), the untrained encoder
    **_choices(b for b in CATALOG if b not in SPEAKING),
    "untrained": "Untrained encoder · from scratch, seed 0",
    **_choices(SPEAKING),
    "custom": "Custom model · transformers",
    "custom_scratch": "Custom model · from-scratch engine",
    **COMPILED,
}


CUSTOM = {"custom", "custom_scratch"}  # a model id or folder typed in the sidebar, on either engine


TRAINED = {
    "trained": "Your trained decoder · this session",
    "trained_start": "Your trained decoder at step 0 · this session",
}


TRANSFORMERS = {b.key for b in CATALOG}  # the bundled models on the transformers engine


SCRATCH = {"untrained", "custom_scratch", *(b.scratch_key for b in CATALOG), *TRAINED, *COMPILED}  # our engine


LLM = {k for b in SPEAKING for k in b.engines()}  # the bundled decoder LLMs, on either engine


DECODERS = " or ".join(b.title for b in SPEAKING)  # their names, for a sentence


def offers_of(ref: "ModelRef") -> frozenset[str]:
    """What a bundled model offers beyond attention (``models.catalog``), known before it is loaded, whose slow parts
    the server prepares; nothing for another model, whose pages compute what it offers in the session."""
    found = bundled(ref.choice)
    return frozenset() if found is None else found.offers


@dataclass(frozen=True)
class ModelRef:
    """A model as the sidebar names it: what a cache key needs to find it again."""

    choice: str                # a key of MODELS or TRAINED
    folder: str = ""           # CUSTOM: the model id or folder typed in the sidebar; TYPED: the program (JSON)
    run: str = ""              # "trained", "trained_start": the id of this session's training
    device: str = "auto"
    download: bool = False     # CUSTOM: fetch the model id from the Hub when it is not in the local cache

    @property
    def is_scratch(self) -> bool:
        """It runs on the from-scratch engine."""
        return self.choice in SCRATCH

    def editable(self) -> "ModelRef | None":
        """The same weights as a model whose runs take edits, head masks and pruning (the from-scratch engine): itself
        when it runs there, a bundled model's from-scratch choice; None for a custom model on the transformers engine
        (the sidebar's "custom_scratch" opens it there)."""
        if self.is_scratch:
            return self
        model = bundled(self.choice)
        return None if model is None else ModelRef(model.scratch_key, device=self.device)

    @property
    def analysed(self) -> "ModelRef":
        """The model every analysis of this choice runs on: ``editable`` where there is one, so that a transformers
        session reads the one instance of a bundled model that every session shares (its results are the same
        numbers, under the same ``cache_key``); itself otherwise."""
        return self.editable() or self

    @property
    def cache_key(self) -> tuple:
        """What a result computed from this model is kept under (``shared.key_of``): a bundled model's weights,
        whichever engine runs them (both give the same numbers), so that both engines read one result; any
        other model (custom, untrained, trained in a session) as itself."""
        model = bundled(self.choice)
        if model is None or self.choice == "untrained":
            return ("model", self.choice, self.folder, self.run, self.device, self.download)
        return ("weights", model.key, self.device)

    @property
    def title(self) -> str:
        """The model's name without its engine: "all-MiniLM-L6-v2", "the compiled sort"."""
        if self.choice == TYPED:
            return "your compiled program"
        if self.choice in COMPILED:
            return f"the compiled {self.program.name}"
        return {**MODELS, **TRAINED}[self.choice].split(" · ")[0]

    @property
    def program(self):
        """The compiled program it names (``models.compiled.BUILT_IN``'s, or one typed: ``typed``), or None."""
        if self.choice == TYPED:
            t = self.typed
            return Program("your program", lambda: parse_rasp(t.text), t.vocab, t.max_seq_len, "your program's output",
                           t.causal)
        return PROGRAMS.get(self.choice.removeprefix("compiled_")) if self.choice in COMPILED else None

    @property
    def typed(self) -> Typed:
        """The program typed in the sidebar (``TYPED``), its vocabulary read (a sentence for none)."""
        spec = json.loads(self.folder or "{}")
        return Typed(spec.get("text", ""), read_vocab(spec.get("vocab", "")), int(spec.get("length", 0)),
                     bool(spec.get("causal")))


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


def cached_model(ref: ModelRef) -> AttentionModel:
    """The model behind ``ref``: shared by every session, or this session's trained decoder."""
    if ref.choice in TRAINED:
        return trained_model(ref.choice, ref.run)
    return shared_model(ref.choice, ref.folder, ref.device)


@st.cache_resource(max_entries=4, show_spinner=False)
def shared_model(choice: str, folder: str, device: str) -> AttentionModel:
    if choice in CUSTOM:
        if not folder:
            raise HeadLensError("Type a model id from the local Hugging Face cache, or the path of a model folder.")
        return load_model(folder, device=device, backend="scratch" if choice == "custom_scratch" else "transformers")
    if choice == TYPED:
        return compile_typed(ModelRef(choice, folder).typed, device=device)
    if choice in COMPILED:
        return compiled(choice.removeprefix("compiled_"), device=device)
    model = bundled(choice)
    return load_model(None if model is None else model.name, backend="transformers" if choice in TRANSFORMERS
                      else "scratch", device=device, untrained=choice == "untrained")


def trained_model(choice: str, job_id: str):
    """The model behind the sidebar's "trained" choices, for this session only."""
    job = st.session_state.get("trained_job")
    if job is None or job.id != job_id:
        raise HeadLensError("No trained model in this session: train one on the Train page first.")
    return job.model(at_start=choice == "trained_start")


def current_job():
    return st.session_state.get("train_job")


def trained_job():
    """This session's last finished training: the one the other pages open."""
    job = current_job()
    if job is not None and job.finished:
        st.session_state["trained_job"] = job
    return st.session_state.get("trained_job")
