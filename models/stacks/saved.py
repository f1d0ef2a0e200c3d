"""A stack's weights in files: safetensors under the names its family's files use (``weights.Weights``), with the
config.json that opens it again."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import HeadLensError
from .classify import classifier_head


class Saved:
    """What ``Stack`` reads and writes of its weights (a mixin: ``config_class``, ``weights`` and ``config`` are the
    stack's)."""

    def to_file(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The state dict under the names its files use (``weights``')."""
        return state if self.weights is None else self.weights.write(state, self)

    @classmethod
    def from_file(cls, weights: dict[str, torch.Tensor], config, built=None) -> dict[str, torch.Tensor]:
        """A file's weights under this stack's names (``built``'s: the stack they are for, on the meta device)."""
        if cls.weights is None:
            return weights
        with torch.device("meta"):  # the names and sizes only: nothing is allocated
            return cls.weights.read(weights, built if built is not None else cls(config))

    @classmethod
    def file_shapes(cls, config: dict) -> dict[str, tuple[int, ...]]:
        """The file's name -> shape of every weight of this stack built from ``config`` (a config.json's keys), the
        unembedding's too when it is tied to the embeddings (a file may hold it): what a file must hold."""
        c = cls.config_class.from_dict(config)
        with torch.device("meta"):  # the names and sizes only: nothing is allocated
            stack = cls(c)
        shapes = {name: tuple(t.shape) for name, t in stack.to_file(stack.state_dict()).items()}
        if getattr(c, "tie_word_embeddings", False):
            shapes.setdefault("lm_head.weight", (c.vocab_size, c.hidden_size))
        return shapes

    def save_pretrained(self, folder: str | Path) -> None:
        """``config.json`` and ``model.safetensors``, pruned heads recorded; ``from_pretrained`` opens the folder again."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n", encoding="utf-8")
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.to_file(self.state_dict()).items()}
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | torch.device = "cpu"):
        """Load ``config.json`` and ``model.safetensors`` from ``folder``."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = Path(folder)
        try:
            given = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            config = cls.config_class.from_dict(given)
        except (OSError, ValueError, TypeError) as err:
            if isinstance(err, HeadLensError):
                raise
            raise HeadLensError(f"The model's config.json in {folder} could not be read: {err}") from err
        try:
            weights = load_file(str(folder / "model.safetensors"), device=str(device))
        except (OSError, SafetensorError) as err:
            raise HeadLensError(f"The weights in {folder / 'model.safetensors'} could not be read: {err}") from err
        with torch.device("meta"):
            model = cls(config)
            head = classifier_head(model, given, folder)  # a sequence classifier's, read after the stack's weights
        try:
            model.load_state_dict(cls.from_file(weights, config, model), assign=True)
        except RuntimeError as err:
            pruned = " or the heads its config.json says were pruned" if config.pruned_heads else ""
            raise HeadLensError(f"The weights in {folder} do not fit the sizes in its config.json{pruned}: "
                                f"{str(err).splitlines()[-1].strip()}") from err
        if head is not None:
            model.prediction_head = head.read(weights, folder)
        return model.eval()
