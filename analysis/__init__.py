"""Metrics and display transforms over attention; numpy, pandas and torch, no UI. A package per question:
``attention`` (views), ``roles`` (what heads do), ``explanations``, ``effects`` (which heads make a prediction, on
each kind of model its readout), ``tasks``, ``circuits``, ``qk_attribution`` (why a head attends where it does),
``pruning`` (whether a head matters), ``cards`` (a head's card and the atlas), ``profiles`` (corpora and Ray);
``defaults`` and ``stats`` shared."""
from .roles.detector import DETECTORS, head_detector
from .defaults import PAIRS
from .effects import logit_attribution, patch_heads, patch_residual
from .effects.vocabulary import copying_scores, head_vocabulary
from .effects.routes import flow_graph, prediction_flow, strongest_route
from .attention.flow import FLOW_MAX_TOKENS, agreement, flow, raw_attention, rollout, token_ablation
from .roles.foci import FOCI, FOCUS_NAMES, content_attention, focus_shares, received, sentiment_lexicon, word_classes
from .pruning.ablation import ablate, head_mask, heads_marked, neighbour_agreement
from .pruning.importance import head_importance
from .pruning.curves import pruning_curve
from .attention.long import Grid, LongView, Survey, long_view, reach, survey, zoom_window
from .roles.labels import RANKING_MEASURES, THRESHOLDS, label_heads, label_measure, strongest_head
from .qk_attribution.pictures import QK, qk_embedding, qk_heads, qk_vectors
from .roles.rules import RULES, Reading, Rule, rule_named
from .explanations import (EXPLAINED, EXPLAINED_LIFT, explain_heads, explained, explained_share, replace_heads,
                           replacement_curve, rule_scores)
from .roles.measure import PROFILE_COLUMNS, HeadMeasures, HeadProfiler, focus_tokens, measure_heads, profile_heads
from .attention.similarity import head_similarity, similar_heads
from .attention.views import (View, head_stats, make_view, merge_weights, renormalise_rows, special_share, token_label,
                              word_spans)

__all__ = ["DETECTORS", "head_detector", "PAIRS", "logit_attribution", "patch_heads", "patch_residual",
           "copying_scores", "head_vocabulary", "flow_graph", "prediction_flow", "strongest_route",
           "FLOW_MAX_TOKENS", "agreement", "flow", "raw_attention", "rollout", "token_ablation",
           "FOCI", "FOCUS_NAMES", "content_attention", "focus_shares", "received", "sentiment_lexicon", "word_classes",
           "ablate", "head_importance", "head_mask", "heads_marked", "neighbour_agreement", "pruning_curve",
           "Grid", "LongView", "Survey", "long_view", "reach", "survey", "zoom_window",
           "RANKING_MEASURES", "THRESHOLDS", "label_heads", "label_measure", "strongest_head",
           "QK", "qk_embedding", "qk_heads", "qk_vectors",
           "RULES", "Reading", "Rule", "rule_named", "rule_scores",
           "EXPLAINED", "EXPLAINED_LIFT", "explain_heads", "explained", "explained_share", "replace_heads",
           "replacement_curve",
           "PROFILE_COLUMNS", "HeadMeasures", "HeadProfiler", "focus_tokens", "measure_heads", "profile_heads",
           "head_similarity", "similar_heads",
           "View", "head_stats", "make_view", "merge_weights", "renormalise_rows", "special_share", "token_label",
           "word_spans"]
