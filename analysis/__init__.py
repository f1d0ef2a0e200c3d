"""Metrics and display transforms over attention; numpy, pandas and torch, no UI."""
from .detector import DETECTORS, head_detector
from .defaults import PAIRS
from .effects import logit_attribution, patch_heads, patch_residual
from .vocabulary import copying_scores, head_vocabulary
from .routes import flow_graph, prediction_flow, strongest_route
from .flow import FLOW_MAX_TOKENS, agreement, flow, raw_attention, rollout, token_ablation
from .foci import FOCI, FOCUS_NAMES, content_attention, focus_shares, received, sentiment_lexicon, word_classes
from .ablation import ablate, head_mask, heads_marked, neighbour_agreement
from .importance import head_importance
from .pruning import pruning_curve
from .long import Grid, LongView, Survey, long_view, reach, survey, zoom_window
from .labels import RANKING_MEASURES, THRESHOLDS, label_heads, label_measure, strongest_head
from .qk import QK, qk_embedding, qk_heads, qk_vectors
from .rules import RULES, Reading, Rule, rule_named
from .explanations import EXPLAINED, explain_heads, explained_share, replace_heads, replacement_curve, rule_scores
from .roles import PROFILE_COLUMNS, HeadMeasures, HeadProfiler, focus_tokens, measure_heads, profile_heads
from .similarity import head_similarity, similar_heads
from .views import View, head_stats, make_view, merge_weights, renormalise_rows, special_share, token_label, word_spans

__all__ = ["DETECTORS", "head_detector", "PAIRS", "logit_attribution", "patch_heads", "patch_residual",
           "copying_scores", "head_vocabulary", "flow_graph", "prediction_flow", "strongest_route",
           "FLOW_MAX_TOKENS", "agreement", "flow", "raw_attention", "rollout", "token_ablation",
           "FOCI", "FOCUS_NAMES", "content_attention", "focus_shares", "received", "sentiment_lexicon", "word_classes",
           "ablate", "head_importance", "head_mask", "heads_marked", "neighbour_agreement", "pruning_curve",
           "Grid", "LongView", "Survey", "long_view", "reach", "survey", "zoom_window",
           "RANKING_MEASURES", "THRESHOLDS", "label_heads", "label_measure", "strongest_head",
           "QK", "qk_embedding", "qk_heads", "qk_vectors",
           "RULES", "Reading", "Rule", "rule_named", "rule_scores",
           "EXPLAINED", "explain_heads", "explained_share", "replace_heads", "replacement_curve",
           "PROFILE_COLUMNS", "HeadMeasures", "HeadProfiler", "focus_tokens", "measure_heads", "profile_heads",
           "head_similarity", "similar_heads",
           "View", "head_stats", "make_view", "merge_weights", "renormalise_rows", "special_share", "token_label",
           "word_spans"]
