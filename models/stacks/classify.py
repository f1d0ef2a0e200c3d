"""Sequence classifiers: a ``...ForSequenceClassification`` folder's head on the final hidden states, read from its
files beside the stack it sits on, and its class labels (``config.id2label``).

Each family's head, as transformers computes it: BERT's pooler (a dense layer and tanh on ``[CLS]``) then a linear
classifier; RoBERTa's dense layer and tanh on ``<s>``, then its output projection; DistilBERT's pre-classifier and
ReLU on ``[CLS]``, then its classifier; a decoder's score, one linear map of its last token's final hidden state.
Only the decoder's is linear in the hidden state it reads: a direct attribution reads it along a class's row; the
others say why they have none.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import HeadLensError

KIND = "ForSequenceClassification"


def labels_of(config: dict) -> tuple[str, ...] | None:
    """A classifier's labels in class order (``id2label``; ``LABEL_k`` where it names none), or None for a config.json
    that is not a sequence classifier's."""
    if not any(str(a).endswith(KIND) for a in config.get("architectures") or ()):
        return None
    names = {str(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    n = config.get("num_labels") or len(names) or 2
    return tuple(names.get(str(k), f"LABEL_{k}") for k in range(int(n)))


class ClassifierHead(nn.Module):
    """A head on the final hidden states ``(..., n, E)`` reading one token (``at``: 0, the first; -1, the last): its
    class ``logits``, its ``linear_rows`` where it is linear in that token's hidden state, else why not."""

    at = 0
    readouts = ("class_label",)  # what the stack it sits on is read as (``Stack.readouts``)
    file_names: dict[str, str] = {}  # our parameter -> the file's name, less any prefix the file puts first
    why_not_linear: str | None = None

    def __init__(self, hidden: int, labels: tuple[str, ...]):
        super().__init__()
        self.labels = labels

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``(..., classes)``: the class logits of final hidden states ``h`` ``(..., n, E)``."""
        raise NotImplementedError

    def linear_rows(self) -> torch.Tensor | None:
        """``(classes, E)`` with ``logits == h[at] @ rows.T`` (a bias aside), or None where the head is not linear."""
        return None

    def read(self, weights: dict[str, torch.Tensor], folder) -> "ClassifierHead":
        """Itself with its weights from the file's ``weights``, wherever a prefix puts them; a sentence naming what
        is missing."""
        state = {}
        for ours, theirs in self.file_names.items():
            found = [v for k, v in weights.items() if k == theirs or k.endswith("." + theirs)]
            if len(found) != 1:
                raise HeadLensError(f"The classifier in {folder} lacks its {theirs}: these are not a "
                                    f"{type(self).__doc__.split(':')[0]}'s weights.")
            state[ours] = found[0]
        self.load_state_dict(state, assign=True)
        return self


def _not_linear(what: str) -> str:
    return (f"The classifier's head passes {what}, which is not linear: its logits do not split into each writer's "
            "direct part. Patching and attribution patching read them.")


class PoolerHead(ClassifierHead):
    """BERT's head: the pooler's dense layer and tanh on ``[CLS]``, then the classifier."""

    file_names = {"pool.weight": "pooler.dense.weight", "pool.bias": "pooler.dense.bias",
                  "out.weight": "classifier.weight", "out.bias": "classifier.bias"}
    why_not_linear = _not_linear("the pooler's dense layer and tanh")
    activation = staticmethod(torch.tanh)

    def __init__(self, hidden, labels):
        super().__init__(hidden, labels)
        self.pool, self.out = nn.Linear(hidden, hidden), nn.Linear(hidden, len(labels))

    def logits(self, h):
        return self.out(self.activation(self.pool(h[..., self.at, :])))


class DenseHead(PoolerHead):
    """RoBERTa's head: a dense layer and tanh on ``<s>``, then its output projection."""

    file_names = {"pool.weight": "classifier.dense.weight", "pool.bias": "classifier.dense.bias",
                  "out.weight": "classifier.out_proj.weight", "out.bias": "classifier.out_proj.bias"}
    why_not_linear = _not_linear("a dense layer and tanh")


class PreClassifierHead(PoolerHead):
    """DistilBERT's head: the pre-classifier and ReLU on ``[CLS]``, then the classifier."""

    file_names = {"pool.weight": "pre_classifier.weight", "pool.bias": "pre_classifier.bias",
                  "out.weight": "classifier.weight", "out.bias": "classifier.bias"}
    why_not_linear = _not_linear("the pre-classifier and ReLU")
    activation = staticmethod(torch.relu)


class ScoreHead(ClassifierHead):
    """A decoder's head: the score, one linear map of the last token's final hidden state."""

    at = -1
    file_names = {"score.weight": "score.weight"}

    def __init__(self, hidden, labels):
        super().__init__(hidden, labels)
        self.score = nn.Linear(hidden, len(labels), bias=False)

    def logits(self, h):
        return self.score(h[..., self.at, :])

    def linear_rows(self):
        return self.score.weight


ENCODER_HEADS = {"bert": PoolerHead, "roberta": DenseHead, "distilbert": PreClassifierHead}


def classifier_head(stack, config: dict, folder) -> ClassifierHead | None:
    """The classifier head a sequence classifier's ``config`` names for ``stack`` (built on the meta device, its
    weights not yet read), its weights to ``read``; a decoder's language-model head goes, which its files do not
    hold. None for any other config."""
    labels = labels_of(config)
    if labels is None:
        return None
    if stack.causal:
        kind = ScoreHead
        if "lm_head" in stack._modules:
            del stack.lm_head
        stack.language_model = False  # it reads classes, not next tokens
    elif config.get("model_type") in ENCODER_HEADS:
        kind = ENCODER_HEADS[config["model_type"]]
    else:
        raise HeadLensError(f"The from-scratch engine reads the sequence classifiers of BERT, RoBERTa, DistilBERT and "
                            f"decoders; this one is '{config.get('model_type')}'.")
    return kind(stack.hidden_size, labels)
