"""Opening a model folder on the from-scratch engine: the stack its config.json's model_type names, wrapped as a
``ScratchModel``, or as a ``DecoderModel`` for a language model."""
from __future__ import annotations

from pathlib import Path

import torch

from .errors import HeadLensError
from .files import load_tokenizer
from .language import DecoderModel
from .limits import check_parameter_count
from .scratch import ScratchModel
from .stacks import architectures, for_model_type


def open_scratch(folder: Path, config: dict, display: str, device: torch.device, *, untrained: bool = False,
                 seed: int = 0) -> ScratchModel:
    """The model in ``folder`` (its config.json already checked) on the architecture its model_type names."""
    model_type = config.get("model_type")
    cls = for_model_type(model_type)
    if cls is None:
        names = [c.description for c in architectures()]
        runs = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        raise HeadLensError(f"The from-scratch engine implements {runs}; this model is '{model_type}'. "
                            "Choose the transformers engine for it.")
    stack_config = cls.config_class.from_dict(config)
    check_parameter_count(lambda: cls(stack_config), display)
    # the tokenizer after the checks: a refused model should cost nothing (reading it took 270 MiB on 16 cores)
    tokenizer = load_tokenizer(folder)
    if untrained:
        stack, display = cls.untrained(stack_config, seed), f"{display} (untrained, seed {seed})"
    else:
        if not (folder / "model.safetensors").is_file():
            raise HeadLensError(f"The from-scratch engine reads model.safetensors, which {folder} lacks.")
        stack = cls.from_pretrained(folder)
    # a stack may name its own (a compiled program's reads its vocabulary and decodes its output)
    model_class = getattr(stack, "model_class", None) or (DecoderModel if stack.language_model else ScratchModel)
    return model_class(stack.eval().requires_grad_(False).to(device), tokenizer, display, device)  # read, not trained
