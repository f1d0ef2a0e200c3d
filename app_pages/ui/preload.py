"""What the server loads as it starts, before any session asks: the modules every page imports, and the models
``HEADLENS_PRELOAD`` names (the sidebar's default, all-MiniLM-L6-v2, unless set) on both engines, with what a
session's first visit starts for them (a bundled decoder's preparation, spaCy's pipeline) and an encoder's profile
over the built-in corpus. A session that asks for a model meanwhile waits for the same load, not a second one.

``HEADLENS_PRELOAD``: app names of bundled models, comma-separated (``smollm2`` for a class on SmolLM2),
``none`` for nothing.
"""
from __future__ import annotations

import logging
import os
import time

from models import EMBEDDING
from models.catalog import CATALOG, bundled
from models.corpus import CORPUS

log = logging.getLogger("headlens")

PRELOAD = "HEADLENS_PRELOAD"
DEFAULT = "minilm"  # the sidebar's default model


def choices(value: str | None = None) -> list[str]:
    """The bundled models' app names ``HEADLENS_PRELOAD`` (or ``value``) names; an unknown name is left out with a
    warning in the server's log."""
    value = os.environ.get(PRELOAD, DEFAULT) if value is None else value
    if value.strip().lower() in ("", "none", "0"):
        return []
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if bundled(n) is None]
    if unknown:
        log.warning("HeadLens: %s=%s names no bundled model (%s); known: %s", PRELOAD, value, ", ".join(unknown),
                    ", ".join(b.key for b in CATALOG))
    return [n for n in names if bundled(n) is not None]


def preload(report: dict, value: str | None = None) -> None:
    """Load what ``value`` (else ``HEADLENS_PRELOAD``) names, saying in ``report`` how far it has got: ``models``,
    ``done`` (those loaded), ``seconds`` once they are (what a page waits for), ``prepared`` once an encoder's
    results its pages open with are computed too, ``error`` if it stopped (a session then computes what is missing
    itself, and says why it cannot)."""
    start = time.perf_counter()
    report.update(models=choices(value), done=[], seconds=None, prepared=None, error=None)
    # the results' functions are called from this thread, which has no session: Streamlit says so at each call
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)
    try:
        import analysis  # noqa: F401 - what every page imports, read here once, not by the first session
        import viz  # noqa: F401

        from ..results.models import ModelRef, cached_model
        from ..results.profiles import corpus_profile
        from ..results.threads import here, lower_priority
        from .warm_up import warm_up

        for name in report["models"]:
            for key in bundled(name).engines():  # a page analyses on the from-scratch engine whichever is shown
                cached_model(ModelRef(key))
            warm_up(ModelRef(name))  # as a session's first visit would: a decoder's preparation, spaCy's pipeline
            if EMBEDDING in bundled(name).offers:  # an encoder's corpus profile: Foci, Head roles, a head's card (its
                # default head) and the atlas open on it (2 s for MiniLM)
                corpus_profile(ModelRef(name), False, (), list(CORPUS))
            report["done"].append(name)
        report["seconds"] = round(time.perf_counter() - start, 2)
        # an encoder's other first results give way to the sessions' pages, as a decoder's preparation does
        here.background = here.steps_aside = True
        lower_priority()
        for name in report["models"]:
            if EMBEDDING in bundled(name).offers:  # measured on its sentence embedding
                encoder_results(ModelRef(name))
    except Exception as err:  # noqa: BLE001
        report["error"] = f"{type(err).__name__}: {err}"
        log.warning("HeadLens's preload stopped: %s", report["error"])
    report["seconds"] = report["seconds"] or round(time.perf_counter() - start, 2)
    report["prepared"] = round(time.perf_counter() - start, 2)
    log.info("HeadLens preloaded %s in %.1f s", ", ".join(report["done"]) or "nothing", report["seconds"])


def encoder_results(ref) -> None:
    """What an encoder's slowest pages open with, computed once for every session (about a minute for MiniLM on
    two cores, giving way to the pages): the first forms of ``encoder_first_forms`` (a few seconds), every head's
    card parts (the Head page, the Atlas; the built-in pairs and the first task, which Effects opens on), then
    ``encoder_steps``."""
    from ..results.card import card_parts

    for result, args in encoder_first_forms(ref):
        result(*args)
    card_parts(ref, importance_too=False, qk_too=False)
    for result, args in encoder_steps(ref):
        result(*args)


def encoder_first_forms(ref) -> list[tuple]:
    """(result, arguments) of the first forms that Pruning, Circuits and Queries & keys show while their full ones
    are computed (``Shared.now``): each head's importance on the first sentences, EAP over a few of the task's pairs,
    every head over an eighth of the corpus, the pruning curves at 3 sizes on those first sentences. A few seconds in
    all for MiniLM, computed first, so that a page opened while
    the rest is computed draws its first form at once rather than computing it."""
    from ..results.circuits import circuit_curve
    from ..results.pruning import curves, importance
    from ..results.qk import pictures

    return [(result, result.first.args(*args)) for result, args in encoder_steps(ref)
            if result in (importance, circuit_curve, pictures, curves)]


def encoder_steps(ref) -> list[tuple]:
    """(result, arguments) of what ``encoder_results`` computes after the card parts, in its order: Pruning's
    importance; Head roles' similarity of every pair of heads, its explanations on the paragraphs (and on the
    sentences, beside them) and the first form of their replacement; the circuit (its edges' scores and
    faithfulness curve) and every head's queries-and-keys picture that Circuits and Queries & keys open on; then
    Pruning's curves. Each is what its page would otherwise compute in a newcomer's session, after drawing a first
    form or beside its first chart."""
    from ..results.card import importance_args
    from ..results.circuits import circuit_curve
    from ..results.explanations import SENTENCES, explanations, replacement
    from ..results.profiles import profile_similarity
    from ..results.pruning import curves, importance
    from ..results.qk import pictures

    def first(result) -> list[tuple]:  # what its declaration says the pages ask for first (``Warm``)
        return [(result, tuple(args)) for args in result.warm.calls(ref)]

    pruning = importance_args(ref)  # a decoder's Warm arguments; an encoder's are its own
    sentences = [(explanations, (ref, False, (), SENTENCES))]  # beside the paragraphs' count
    return [(importance, pruning), *first(profile_similarity), *first(explanations), *sentences, *first(replacement),
            *first(circuit_curve), *first(pictures), (curves, pruning)]
