"""Rules held to account: how much of each head a rule explains (``scores``), each head's program of rules fitted on
one text (``programs``) and read on another (``heads``), and what a model loses when heads are replaced by their rules
(``replace``)."""
from .heads import (
    COLUMNS,
    EXPLAINED,
    EXPLAINED_LIFT,
    corpus_halves,
    explain_attentions,
    explain_corpus,
    explain_heads,
    explained,
    explained_share,
    held_out_of,
    read_on,
)
from .programs import Program
from .replace import replace_heads, replacement_counts, replacement_curve
from .scores import misses, rule_scores

__all__ = ["COLUMNS", "EXPLAINED", "EXPLAINED_LIFT", "corpus_halves", "explain_attentions", "explain_corpus",
           "explain_heads", "explained", "explained_share", "held_out_of", "misses", "replace_heads",
           "replacement_counts", "replacement_curve",
           "Program", "read_on", "rule_scores"]
