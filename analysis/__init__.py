"""Metrics and display transforms over attention; numpy only, no UI."""
from .flow import FLOW_MAX_TOKENS, agreement, flow, raw_attention, rollout, token_ablation
from .importance import ablate, head_importance, neighbour_agreement, pruning_curve
from .foci import FOCI, FOCUS_NAMES, content_attention, focus_shares, received, sentiment_lexicon, word_classes
from .roles import (PROFILE_COLUMNS, RANKING_MEASURES, THRESHOLDS, HeadMeasures, HeadProfiler, head_similarity, label_heads, label_measure,
                    measure_heads, profile_heads, strongest_head, focus_tokens)
from .views import View, head_stats, make_view, merge_weights, renormalise_rows, special_share, token_label, word_spans

__all__ = ["ablate", "head_importance", "neighbour_agreement", "pruning_curve", "FOCI", "FOCUS_NAMES", "content_attention", "focus_shares", "received", "sentiment_lexicon", "word_classes",
           "focus_tokens",
           "strongest_head", "FLOW_MAX_TOKENS", "agreement", "flow", "raw_attention", "rollout", "token_ablation", "PROFILE_COLUMNS", "RANKING_MEASURES", "THRESHOLDS", "HeadMeasures", "HeadProfiler", "View", "label_measure", "measure_heads", "head_similarity", "label_heads", "profile_heads", "head_stats", "make_view", "merge_weights", "renormalise_rows", "special_share", "token_label",
           "word_spans"]
