"""Explanations on the built-in paragraphs (``models.corpus.PARAGRAPHS``): the corpus as shipped, and the known heads
keeping their names on prose, fitted on one half's paragraphs and read on the other's: SmolLM2's previous-token head
L16 H0 and its induction head L18 H6 (on paragraphs said twice, text with repeats), MiniLM's previous-token head
L0 H2."""
import re

from analysis.explanations import explain_heads
from models.corpus import PARAGRAPHS, paragraph_halves


def test_the_paragraphs_are_prose_of_every_kind_in_two_halves():
    assert len(PARAGRAPHS) >= 120 and len(set(PARAGRAPHS)) == len(PARAGRAPHS)
    words = [len(p.split()) for p in PARAGRAPHS]
    assert min(words) >= 60 and max(words) <= 150
    assert sum('"' in p for p in PARAGRAPHS) >= 15  # dialogue
    assert sum(p.count(";") >= 3 or ":" in p for p in PARAGRAPHS) >= 15  # lists and instructions
    names = re.findall(r"\b(Mara|Leo|Priya|Tom|Anna|Greta|Sofia|Marcus|Felix|Jo|Sam)\b", " ".join(PARAGRAPHS))
    assert len(names) >= 150  # names recur within and across paragraphs, as in real text
    fit, held = paragraph_halves()
    assert len(fit) + len(held) == len(PARAGRAPHS) and not set(fit) & set(held)


def _first_rule(frame, layer: int, head: int) -> tuple[str, float]:
    row = frame.set_index(["layer", "head"]).loc[(layer, head)]
    return row["rule"].split(" or ")[0], row["weights"][0]


def test_smollm2s_known_heads_keep_their_names_on_paragraphs(smollm2):
    fit, held = paragraph_halves()
    frame = explain_heads(smollm2, [f"{p} {p}" for p in fit[:6]], [f"{p} {p}" for p in held[:6]], replicates=100)
    rule, weight = _first_rule(frame, 16, 0)
    assert rule == "previous token" and weight > 0.7
    row = frame.set_index(["layer", "head"]).loc[(16, 0)]
    assert row["score"] > 0.9 and row["lift"] > 10 and row["iou"] > 0.7
    rule, weight = _first_rule(frame, 18, 6)
    assert rule == "induction" and weight > 0.5


def test_minilms_previous_token_head_keeps_its_name_on_paragraphs(scratch_model):
    fit, held = paragraph_halves()
    frame = explain_heads(scratch_model, fit[:12], held[:12], replicates=100)
    rule, weight = _first_rule(frame, 0, 2)
    assert rule == "previous token" and weight > 0.9
    assert frame.set_index(["layer", "head"]).loc[(0, 2), "iou"] > 0.8
