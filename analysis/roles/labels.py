"""A role in words for each head, from its measures over many sentences (``analysis.roles.measure``).

Labels, first match wins (``THRESHOLDS``). Clark et al. call a head positional above 0.5 and
special or punctuation-focused above 0.6; those bars are kept. Their "broad" bar of 3.8 nats
assumes 128-token inputs, where uniform attention has 4.85 nats; on sentences of 10 to 30 tokens
even uniform attention stays below 3.4, so the bar here is on ``entropy_norm`` (0.8). A
syntactic role needs an accuracy of 0.5 and 0.15 over the fixed-offset baseline.

A focus label needs the lower end of the lift's 95% interval at 1.5 or more, over at least 5
sentences with a word of the class: with 95% confidence the head gives those words half as much
again as uniform attention would. The bar comes from the distribution over heads: on the built-in
corpus (335 sentences) with all-MiniLM-L6-v2, the lower bounds of the 288 (head, focus) pairs
have a median of 1.02 (most heads treat a class as uniform attention does), a 90th percentile of
1.49 and a 95th of 1.68; 1.5 keeps the top decile, 23 of 72 heads, and every focus's strongest
head (lower bounds 1.89 to 2.55) clears it with room. Fewer than 5 sentences make an interval
that rests on one or two examples. Focus labels come after the positional ones (a head that
looks at the previous token gives a lift to whatever class precedes) and before syntax, special
tokens and the rest: a head that parks 80% of its weight on [CLS] and spends the rest on the
sentence's objects is an object head, and its ``cls`` column says the rest. A head's other foci
that clear the bar are listed in ``secondary``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .foci import FOCI, FOCUS_NAMES

THRESHOLDS = {"positional": 0.5, "special": 0.6, "punct": 0.6, "broad": 0.8, "focus_lift_lo": 1.5,
              "focus_sentences": 5, "syntax_acc": 0.5, "syntax_margin": 0.15}
FOCUS_LABELS = {f: f"{name} focus" for f, name in FOCUS_NAMES.items()}
def _cleared_foci(r) -> list[str]:
    """The foci whose lift clears the bar with enough sentences behind it, strongest lower bound first."""
    t = THRESHOLDS
    cleared = [f for f in FOCI if r[f"{f}_n"] >= t["focus_sentences"] and r[f"{f}_lift_lo"] >= t["focus_lift_lo"]]
    return sorted(cleared, key=lambda f: -r[f"{f}_lift_lo"])


def label_heads(df: pd.DataFrame, causal: bool = False) -> pd.Series:
    """A role in words for each row of a profile; see THRESHOLDS and the module's docstring.

    ``causal``: a decoder's profile, where the first token is an attention sink rather than [CLS] and
    no query but the last sees the last token."""
    t = THRESHOLDS

    def one(r) -> str:
        if r.prev_token > t["positional"]:
            return "previous token"
        if r.next_token > t["positional"]:
            return "next token"
        if r.self > t["positional"]:
            return "self"
        foci = _cleared_foci(r)
        if foci:
            return FOCUS_LABELS[foci[0]]
        if r.dep_relation and r.dep_acc >= t["syntax_acc"] and r.dep_acc - r.dep_base >= t["syntax_margin"]:
            return f"syntax: {r.dep_relation}"
        if r.sep > t["special"] and not causal:
            return "[SEP] / no-op"
        if r.cls > t["special"]:
            return "first token (sink)" if causal else "[CLS]"
        if max(r.punct, r.final_mark) > t["punct"]:
            return "punctuation"
        if r.entropy_norm > t["broad"]:
            return "broad"
        return "mixed"

    return df.apply(one, axis=1)


def secondary_foci(df: pd.DataFrame) -> pd.Series:
    """The foci a head clears besides its label's, strongest first, comma-separated ("" for none)."""
    def one(r) -> str:
        return ", ".join(FOCUS_NAMES[f] for f in _cleared_foci(r) if FOCUS_LABELS[f] != r.label)

    return df.apply(one, axis=1)


def strongest_head(df: pd.DataFrame, focus: str) -> int | None:
    """The row of the head with the highest lower bound of ``focus``'s lift, labelled or not; None
    when no sentence had a word of that class."""
    ranked = df[df[f"{focus}_n"] > 0].sort_values([f"{focus}_lift_lo", f"{focus}_lift"], ascending=False)
    return None if ranked.empty else int(ranked.index[0])


# The measure that ranks a head's sentences on the page, by the start of its label
LABEL_MEASURE = {"previous token": "prev_token", "next token": "next_token", "self": "self", "[SEP]": "sep",
                 "[CLS]": "cls", "first token": "cls", "punctuation": "final_mark", "broad": "entropy_norm",
                 **{label: f"{f}_lift" for f, label in FOCUS_LABELS.items()}}


RANKING_MEASURES = frozenset({*LABEL_MEASURE.values(), "entropy_norm"})


def label_measure(label: str) -> tuple[str, bool]:
    """The column that ranks a label's heads and sentences, and whether higher is stronger.

    Syntax and mixed heads are ranked by how focused they are: lowest normalised entropy first.
    """
    for prefix, name in LABEL_MEASURE.items():
        if label.startswith(prefix):
            return name, True
    return "entropy_norm", False


def strongest(values: np.ndarray, higher: bool = True) -> np.ndarray:
    """Indices of ``values`` from the strongest to the weakest (highest first when ``higher``), NaN last."""
    filled = np.where(np.isnan(values), -np.inf if higher else np.inf, values)
    order = np.argsort(filled, kind="stable")
    return order[::-1] if higher else order



TELLING_DETECTORS = ("induction", "previous_token", "duplicate_token")  # a decoder's roles, most telling first
TELLING_FOCI = ("object", "relation", "sentence_type", "sentiment")       # an encoder's, the seed's foci


def telling_head(profile: pd.DataFrame | None, detector: pd.DataFrame | None = None) -> tuple[int, int, str] | None:
    """The head that says most of what the model's heads do, a card's first: ``(layer, head, role)``. With the head
    detector's frame (a decoder's), the head labelled with its first role of ``TELLING_DETECTORS`` whose score's lower
    bound is highest (SmolLM2's induction head); else, from a profile, the head labelled with the first of the
    seed's foci (``TELLING_FOCI``) whose lift's lower bound is highest (all-MiniLM-L6-v2's object head). None when no
    head carries one of those labels."""
    if detector is not None:
        for name in TELLING_DETECTORS:
            label = name.replace("_", " ")  # the detector's label (``detector.DETECTOR_LABELS``)
            found = detector[detector["label"] == label]
            if len(found):
                row = found.loc[found[f"{name}_lo"].idxmax()]
                return int(row["layer"]), int(row["head"]), f"the {label} head"
    if profile is not None:
        labels = profile["label"] if "label" in profile else label_heads(profile)
        for focus in TELLING_FOCI:
            found = profile[labels == FOCUS_LABELS[focus]]
            if len(found):
                row = found.loc[found[f"{focus}_lift_lo"].idxmax()]
                return int(row["layer"]), int(row["head"]), f"the {FOCUS_NAMES[focus].lower()} head"
    return None
