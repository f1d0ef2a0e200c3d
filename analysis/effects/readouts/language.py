"""A language model's readout: its next token."""
from __future__ import annotations

import torch

from models import HeadLensError
from models.run import device_of

from ...defaults import FIRST_TASK, FIRST_TASK_NAME, PAIRS
from .. import parts as P
from ..inputs import answer_token, token_text
from ..metrics import TokenLogits, TokenProbs, Toward
from .base import Asks, Candidate, Readout


class NextToken(Readout):
    """A language model's next token: the logit difference of two tokens at the last position (a task's also the
    probability difference, or greater-than's mass)."""

    name, metric, title, gives = "next_token", "logit_diff", "logit difference", "token"
    needs = "is read from a language model's next-token logits"
    metrics = {"logit_diff": "logit difference: logit(answer) − logit(distractor)",
               "prob_diff": "probability difference: p(answer) − p(distractor)",
               "greater_than": "greater-than mass: p(years after YY) − p(years up to YY)"}
    on_text = "loss"
    first_task = (FIRST_TASK, FIRST_TASK_NAME)
    tasks = "next_token"
    tasks_help = ("Indirect object: 17 templates in both name orders (Wang et al. 2022). Facts: a landmark's city, a "
                  "capital, a language. Greater-than: \"The war lasted from the year 1729 to the year 17\" (Hanna "
                  "et al. 2023). Induction: random words repeated. Or a CSV of your own pairs.")
    pairs_help = ("Indirect object (Wang et al. 2022): the name that did not give the drink; the corrupted prompt "
                  "swaps who gave it. A fact: one landmark's city against another's. Induction: a sequence seen "
                  "once, then again, the corrupted prompt with another token in the first copy.")
    csv_example = ("clean,corrupted,answer,distractor\n"
                   "\"When Mary and John went to the store, John gave a drink to\","
                   "\"When Mary and John went to the store, Mary gave a drink to\", Mary, John\n"
                   "The Eiffel Tower is located in the city of,The Colosseum is located in the city of, Paris, Rome\n")
    csv_note = "the answer and the distractor are one token each (with their leading space)."
    roles_note = " (indirect object: a name mover looks from END at IO)"
    asks = Asks("Answer", "Distractor",
                "The token the clean prompt should predict: each prompt's likely next tokens and every token of the "
                "prompts, as the tokenizer reads them (a leading space is part of a token).",
                "The token the corrupted prompt favours: the page explains logit(answer) − logit(distractor).",
                key="")

    def options(self, clean, corrupted, predicted=None):
        """Token id -> ``Candidate``: each prompt's most likely next tokens (``predicted``), then every token of the
        prompts (a token named twice keeps its first place)."""
        out: dict[int, Candidate] = {}
        for what, text in (("clean", clean), ("corrupted", corrupted)):
            for rank, (token, p) in enumerate(predicted(text) if predicted else (), start=1):
                out.setdefault(token, Candidate(what, rank, p))
        for what, text in (("clean", clean), ("corrupted", corrupted)):
            for token in self.model.tokenizer(text, add_special_tokens=False)["input_ids"]:
                out.setdefault(int(token), Candidate(what))
        return out

    def option_label(self, option, note):
        return f"“{token_text(self.model, option)}” · id {option}" + (f" · {note}" if str(note) else "")

    def against(self, options, answer):
        """The corrupted prompt's likeliest next token other than ``answer``, else the first other option."""
        rest = [t for t in options if t != answer]
        return next((t for t in rest if options[t].prompt == "corrupted" and options[t].predicted), rest[0])

    def builtin_pairs(self):
        """Indirect objects, a fact and a repeated sequence, each a next token against another."""
        return dict(PAIRS)

    def pair(self, ids, answer, distractor):
        a, d = self.read(ids, answer, distractor)
        return (Toward(P.direction(self.stack, a, d)), token_text(self.model, a),
                token_text(self.model, d))

    def alone(self, ids, answer):
        """``logit(answer)`` itself."""
        a = answer_token(self.model, answer)
        return Toward(P.direction(self.stack, a, None)), token_text(self.model, a)

    def task_metric(self, task, metric):
        device = device_of(self.stack)
        if metric == "greater_than":
            if not all(p.above and p.below for p in task.pairs):
                raise HeadLensError("The greater-than metric reads the years after and up to a pair's YY: choose "
                                    "the greater_than task, or the logit or probability difference.")
            width = max(len(p.above) + len(p.below) for p in task.pairs)
            tokens = [list(p.above + p.below) + [0] * (width - len(p.above) - len(p.below)) for p in task.pairs]
            weights = [[1.0] * len(p.above) + [-1.0] * len(p.below)
                       + [0.0] * (width - len(p.above) - len(p.below)) for p in task.pairs]
        else:
            tokens = [[p.answer, p.distractor] for p in task.pairs]
            weights = [[1.0, -1.0]] * len(task.pairs)
        kind = TokenLogits if metric == "logit_diff" else TokenProbs
        return kind(torch.tensor(tokens, device=device), torch.tensor(weights, device=device))
