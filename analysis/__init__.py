"""Metrics and display transforms over attention; numpy only, no UI."""
from .roles import RANKING_MEASURES, THRESHOLDS, HeadMeasures, head_similarity, label_heads, label_measure, measure_heads, profile_heads
from .views import View, head_stats, make_view, merge_weights, renormalise_rows, special_share, token_label, word_spans

__all__ = ["RANKING_MEASURES", "THRESHOLDS", "HeadMeasures", "View", "label_measure", "measure_heads", "head_similarity", "label_heads", "profile_heads", "head_stats", "make_view", "merge_weights", "renormalise_rows", "special_share", "token_label",
           "word_spans"]
