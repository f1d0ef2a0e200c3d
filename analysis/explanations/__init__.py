"""Rules held to account: how much of each head a rule explains (``scores``), each head's best rule fitted on one
text and scored on another (``heads``), and what a model loses when heads are replaced by their rules (``replace``)."""
from .heads import (
    COLUMNS,
    EXPLAINED,
    corpus_halves,
    explain_attentions,
    explain_corpus,
    explain_heads,
    explained_share,
    held_out_of,
)
from .replace import replace_heads, replacement_counts, replacement_curve, rule_pattern
from .scores import misses, rule_scores

__all__ = ["COLUMNS", "EXPLAINED", "corpus_halves", "explain_attentions", "explain_corpus", "explain_heads",
           "explained_share", "held_out_of", "misses", "replace_heads", "replacement_counts", "replacement_curve",
           "rule_pattern", "rule_scores"]
