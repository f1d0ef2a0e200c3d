"""Circuits: the task, method and edges a page runs (kept in the URL), and what it computes on them once for every
session: every edge's score, the faithfulness curve, one circuit's faithfulness, the heads' attention between roles."""
from __future__ import annotations

from dataclasses import replace

from analysis import circuits as AC
from analysis.effects import own_readout
from analysis.circuits import role_attention
from analysis.circuits import EdgeScores

from .models import ModelRef, cached_model
from .progress import Bar
from .shared import First, Warm, shared
from .tasks import TaskSpec, built_task, first_spec


def first_circuit(ref: ModelRef) -> list[tuple]:
    """What the Circuits page shows first: the indirect-object task's 50 pairs, EAP-IG in 5 steps, on the from-scratch
    engine (an encoder's: the seed's objects changed, its embedding difference)."""
    model = cached_model(ref.analysed)
    spec = first_spec(model)
    return [] if spec is None else [(ref.analysed, spec, own_readout(model).metric, "eap_ig", AC.STEPS)]


@shared("circuit scores", entries=8, waiting="Scoring every edge over the task", warm=Warm(10, first_circuit))
def circuit_scores(ref: ModelRef, spec: TaskSpec, metric: str, method: str, steps: int) -> EdgeScores:
    """Every edge of the model scored over the task's pairs, with a progress bar."""
    model, task = cached_model(ref), built_task(ref, spec)
    how = f"EAP-IG in {steps} steps" if method == "eap_ig" else "EAP"
    bar = Bar(f"Scoring every edge over {len(task)} pairs by {how}")
    scores = AC.edge_scores(model, task, method, steps, metric, batch_pairs=SCORE_BATCH, progress=bar)
    bar.empty()
    return scores


# pairs scored at once: SmolLM2's EAP-IG over 50 pairs held 2.6 GB above the model in batches of 16, 1.6 GB in
# batches of 8, for 5% more time; 6 keeps the preparation within 2.5 GiB (``bench.bench_warm_up``)
SCORE_BATCH = 6
FIRST_PAIRS, FIRST_SIZES = 8, (10, 100, 1000)  # a circuit's first form: EAP over 8 pairs, a curve at 3 sizes


def _first(ref: ModelRef, spec: TaskSpec, metric: str, method: str, steps: int, kinds: tuple):
    return ref, replace(spec, pairs=min(spec.pairs, FIRST_PAIRS)), metric, "eap", 1, kinds, FIRST_SIZES


@shared("circuit curve", entries=8, waiting="Running circuits of every size",
        warm=Warm(10.5, lambda ref: [(*first_circuit(ref)[0], tuple(KINDS))]),
        first=First(_first, f"EAP over {FIRST_PAIRS} of the task's pairs and circuits of {len(FIRST_SIZES)} sizes"))
def circuit_curve(ref: ModelRef, spec: TaskSpec, metric: str, method: str, steps: int, kinds: tuple,
                  sizes: tuple = ()) -> AC.Curve:
    """The faithfulness of the top edges' circuit at each of ``sizes`` (``analysis.circuits.default_sizes`` when
    none are given)."""
    scores = circuit_scores(ref, spec, metric, method, steps)
    bar = Bar("Running the circuit of the top edges at each size, every other edge corrupted")
    curve = AC.faithfulness(cached_model(ref), scores, sizes=list(sizes) or None, kinds=list(kinds), progress=bar)
    bar.empty()
    return curve


@shared("circuit", entries=32, waiting="Running this circuit")
def circuit_at(ref: ModelRef, spec: TaskSpec, metric: str, method: str, steps: int, kinds: tuple,
               edges: int, sizes: tuple = ()) -> AC.Curve:
    """The faithfulness of the top ``edges`` edges' circuit alone: read from the curve of ``sizes`` when it ran
    that size."""
    curve = circuit_curve.peek(ref, spec, metric, method, steps, kinds, *(sizes and (sizes,)))
    if curve is not None and edges in curve.sizes:
        return curve.at(edges)
    scores = circuit_scores(ref, spec, metric, method, steps)
    bar = Bar(f"Running the circuit of the top {edges:,} edges")
    curve = AC.faithfulness(cached_model(ref), scores, sizes=[edges], kinds=list(kinds), progress=bar)
    bar.empty()
    return curve


@shared("role attention", entries=8, waiting="Reading the heads' attention between the task's roles")
def circuit_roles(ref: ModelRef, spec: TaskSpec) -> dict:
    """Every head's attention along each pattern of ``analysis.circuits.heads.PATTERNS``."""
    return role_attention(cached_model(ref), built_task(ref, spec))


KINDS = {"q": "queries", "k": "keys", "v": "values", "mlp": "MLPs", "logits": "logits"}
