"""Metrics and display transforms over attention; numpy only, no UI."""
from .views import View, head_stats, make_view, merge_weights, renormalise_rows, special_share, token_label, word_spans

__all__ = ["View", "head_stats", "make_view", "merge_weights", "renormalise_rows", "special_share", "token_label",
           "word_spans"]
