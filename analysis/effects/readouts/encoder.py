"""An encoder's readouts: its sentence embedding against two probe texts, and a masked-LM encoder's tokens at its
``[MASK]``."""
from __future__ import annotations

import torch

from models import HeadLensError
from models.run import device_of

from ..inputs import probe_text, token_text, two, unit_embeddings
from ..metrics import MASKED_NOT_LINEAR, EmbeddingCosine, MaskedLogits
from .base import Asks, Readout


class SentenceEmbedding(Readout):
    """An encoder's sentence embedding (the mean over its tokens) against two probe texts:
    ``cos(e, answer) − cos(e, distractor)``, each part through the norms above where it was written, frozen."""

    name, metric, title, gives = "embedding", "embedding", "embedding difference", "text"
    needs = "is an encoder's metric: its sentence embedding against two probe texts"
    metrics = {"embedding": "embedding difference: cos(e, answer) − cos(e, distractor)"}
    units, output = "attribution", "embedding"
    compared_note = ", e the sentence's embedding (the mean over its tokens)"
    norm_bias = "the norms' biases"
    parts_note = (" Each part passes the LayerNorms above it, their scales frozen at the prompt's own values, so "
                  "that the parts add up.")

    def clean_help(self, compared):
        return f"{compared}, e the clean prompt's sentence embedding (the mean over its tokens)."

    def read(self, ids, answer, distractor):
        a, d = probe_text(answer, "answer"), probe_text(distractor, "distractor")
        two(a, d, "text")
        return a, d

    def words(self, ids, answer, distractor):
        return self.read(ids, answer, distractor)

    def pair(self, ids, answer, distractor):
        a, d = self.read(ids, answer, distractor)
        return self.probes([(a, d)]), a, d

    def probes(self, pairs) -> EmbeddingCosine:
        """The metric of pairs whose ``(answer, distractor)`` texts are ``pairs``, each text embedded once."""
        texts = sorted({t for pair in pairs for t in pair})
        at = {t: i for i, t in enumerate(texts)}
        units = unit_embeddings(self.model, texts, self.stack)
        return EmbeddingCosine(torch.stack([units[at[a]] - units[at[d]] for a, d in pairs]))

    def compared(self, answer, distractor):
        return f"cos(e, “{answer}”) − cos(e, “{distractor}”)"

    def row(self, row, one_token, ids, bad):
        probes = tuple(row.get(what).strip() if isinstance(row.get(what), str) else "" for what in
                       ("answer", "distractor"))
        if not all(probes):
            return ("its answer or distractor is empty; on an encoder each is a text (a word or a sentence) the "
                    "sentence's embedding is compared with")
        if probes[0] == probes[1]:
            return "its answer and distractor are the same text; give two different ones"
        return -1, -1, probes, ()

    def task_metric(self, task, metric):
        if not all(p.probes for p in task.pairs):
            raise HeadLensError("The embedding difference compares each sentence with its pair's probe texts; "
                                "this task's pairs have none: choose an encoder's task or upload pairs with them"
                                + (" (pairs with a [MASK] take the masked logit difference)." if
                                   all("MASK" in dict(p.roles) for p in task.pairs) else "."))
        return self.probes([p.probes for p in task.pairs])


class MaskedToken(Readout):
    """A masked-LM encoder's two tokens at the clean prompt's one ``[MASK]``: their logit difference there."""

    name, metric, title, gives = "masked_token", "masked_logit_diff", "masked logit difference", "token"
    needs = "reads a masked-LM encoder's logits at each pair's [MASK], on a model opened with its masked-LM head"
    metrics = {"masked_logit_diff": "masked logit difference: logit(answer) − logit(distractor) at the [MASK]"}
    not_linear = MASKED_NOT_LINEAR
    tasks = None  # a masked-LM encoder's own prediction is its sentence embedding: its tasks are that readout's

    @property
    def mask(self) -> str:
        return self.model.tokenizer.mask_token

    @property
    def asks(self):
        return Asks(f"Answer token at {self.mask}", "Distractor token",
                    f"The token the clean prompt should put at its {self.mask}, as the tokenizer reads it: the page "
                    "explains logit(answer) − logit(distractor) there.",
                    f"The token the corrupted prompt favours at its {self.mask}.",
                    f"Type the answer and the distractor: one token each, compared at the {self.mask}.")

    def typed(self, first):
        return "", ""

    def reads(self, clean):
        return bool(self.mask) and self.mask in clean

    def read(self, ids, answer, distractor):
        mask = self.model.tokenizer.mask_token_id
        if list(ids).count(mask) != 1:
            raise HeadLensError(f"The clean prompt has {list(ids).count(mask)} {self.mask} tokens; the masked-LM "
                                "metric reads the logits at one.")
        return super().read(ids, answer, distractor)

    def pair(self, ids, answer, distractor):
        mask = self.model.tokenizer.mask_token_id
        a, d = self.read(ids, answer, distractor)
        metric = MaskedLogits(torch.tensor([[a, d]]), torch.tensor([[1.0, -1.0]]), torch.tensor([list(ids).index(mask)]))
        return metric, token_text(self.model, a), token_text(self.model, d)

    def compared(self, answer, distractor):
        return super().compared(answer, distractor) + f" at {self.mask}"

    def row(self, row, one_token, ids, bad):
        mask = self.model.tokenizer.mask_token_id
        if ids.count(mask) != 1:
            return (f"its clean prompt has {ids.count(mask)} {self.mask} tokens; the masked-LM metric reads the "
                    "logits at one")
        at = ids.index(mask)
        if len(ids) != len(bad) or bad[at] != mask:
            return (f"the corrupted prompt needs as many tokens as the clean one ({len(ids)}) and its {self.mask} "
                    "at the same position")
        read = super().row(row, one_token, ids, bad)
        return read if isinstance(read, str) else (*read[:3], (("MASK", at),))

    def task_metric(self, task, metric):
        if not all("MASK" in dict(p.roles) for p in task.pairs):
            raise HeadLensError("The masked logit difference reads a masked-LM encoder's logits at each pair's "
                                "[MASK]: upload pairs whose clean prompt has one, on a model opened with its "
                                "masked-LM head.")
        device = device_of(self.stack)
        return MaskedLogits(torch.tensor([[p.answer, p.distractor] for p in task.pairs], device=device),
                            torch.tensor([[1.0, -1.0]] * len(task.pairs), device=device),
                            torch.tensor([p.role("MASK") for p in task.pairs], device=device))
