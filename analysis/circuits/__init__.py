"""Circuits over a task: the graph of a language model's nodes and the runs through it (``graph``: EAP, EAP-IG,
exact edge patching, a circuit's run), every edge scored over a task's pairs, circuits of the top edges and their
faithfulness, path patching (``scores``), and what a circuit's heads are (``heads``)."""
from .graph import Graph, graph_of
from .heads import PATTERNS, WANG, circuit_heads, classify, role_attention
from .scores import (BATCH_PAIRS, EDGE_KINDS, METHODS, SIZES, STEPS, TARGET, Curve, EdgeScores, PathPatch,
                     circuit_values, curve_of, default_sizes, edge_scores, exact_edges, faithfulness, path_patching,
                     receiver_index, sender_index)

__all__ = ["Graph", "graph_of", "PATTERNS", "WANG", "circuit_heads", "classify", "role_attention", "BATCH_PAIRS",
           "EDGE_KINDS", "METHODS", "SIZES", "STEPS", "TARGET", "Curve", "EdgeScores", "PathPatch", "circuit_values",
           "curve_of", "default_sizes", "edge_scores", "exact_edges", "faithfulness", "path_patching",
           "receiver_index", "sender_index"]
