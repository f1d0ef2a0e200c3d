"""The default model's preload computes what its slowest pages open with (``preload.encoder_steps``), so that a page
opened once the server has prepared draws it at once: the full forms Circuits and Queries & keys ask for first
(``Shared.now``, which shows a first form when the full one is not there), argument for argument, and everything
Head roles computes beside its first chart."""
import streamlit as st

from app_pages.results import shared
from app_pages.results.models import ModelRef
from app_pages.ui import preload
from app_pages.ui.preload import DEFAULT, encoder_first_forms, encoder_steps

FIRST_FORMS = {"app_pages/circuits.py": "circuit curve", "app_pages/queries_keys.py": "queries and keys",
               "app_pages/pruning.py": "importance"}
ROLES = ["similarity", "explanations", "explanations", "replacement"]  # what Head roles computes after its first chart


def steps() -> list[tuple]:
    return encoder_steps(ModelRef(DEFAULT))


def test_the_preload_computes_the_full_forms_circuits_and_queries_and_keys_ask_for_first(new_app, monkeypatch):
    asked = []

    def now(result, *args):  # what the page asks for, and the page stopped there: nothing computed
        asked.append((result.name, args))
        st.stop()

    monkeypatch.setattr(shared.Shared, "now", now)
    for page in FIRST_FORMS:
        new_app(page=page)
    assert [name for name, _ in asked] == list(FIRST_FORMS.values()), asked
    computed = [(result.name, args) for result, args in steps()]
    firsts = [(result.name, args) for result, args in encoder_first_forms(ModelRef(DEFAULT))]
    for name, args in asked:
        assert (name, args) in computed, (name, computed)
        # and the first form it shows meanwhile, computed before anything else
        assert (name, shared.DECLARED[name].first.args(*args)) in firsts, (name, firsts)
    # importance first (Pruning and the card read it), Head roles' next, the curves last (Pruning's first is cheap)
    assert [name for name, _ in computed] == ["importance", *ROLES, "circuit curve", "queries and keys", "curves"]


def test_the_preload_computes_the_first_forms_first_then_the_cards_parts_then_the_full_forms(monkeypatch):
    from app_pages.results import card

    ran = []
    monkeypatch.setattr(shared.Shared, "__call__", lambda result, *args: ran.append((result.name, args)))
    monkeypatch.setattr(card, "card_parts", lambda ref, **how: ran.append(("card parts", ref)))
    ref = ModelRef(DEFAULT)
    preload.encoder_results(ref)
    firsts = [(result.name, args) for result, args in encoder_first_forms(ref)]
    assert ran == [*firsts, ("card parts", ref), *((result.name, args) for result, args in steps())]
    importance, circuit, pictures, curves = (args for _, args in firsts)
    assert len(importance[2]) == 25 and importance[1:2] + importance[3:] == ("mean", "ablation")  # 25 of 100
    assert curves == (*importance, 0.5)  # at 3 sizes, on the same sentences
    assert circuit[1].pairs == 8 and circuit[3:5] == ("eap", 1)  # EAP over 8 of the 50 pairs
    full_pictures = next(args for result, args in steps() if result.name == "queries and keys")
    assert pictures[1] == full_pictures[1][:len(full_pictures[1]) // 8]  # an eighth of the corpus


def test_head_roles_computes_nothing_in_a_session_once_the_preload_has_its_results(new_app, monkeypatch):
    for result, args in steps():
        if result.name in ROLES:
            result(*args)
    in_session, put = [], shared.SharedCache.put

    def counted(cache, key, value):
        in_session.append(key[0])
        put(cache, key, value)

    monkeypatch.setattr(shared.SharedCache, "put", counted)
    at = new_app(page="app_pages/roles.py", timeout=300)
    assert not at.error, [e.value for e in at.error]
    # the sidebar's sentence's attention alone, if an earlier test in this process has not attended it already
    assert set(in_session) <= {"attention"}, in_session


def test_what_the_server_prepares_for_every_bundled_model_fits_each_results_cache_together():
    """A class server preloading every bundled model (``HEADLENS_PRELOAD=minilm,smollm2,gemma3``) keeps what each
    preparation computed: with four profiles kept, the decoders' four pushed out the encoder's corpus profile, and
    Foci and Head roles computed it again for a newcomer."""
    from collections import Counter

    from app_pages import results
    from app_pages.results.profiles import corpus_profile
    from models.catalog import CATALOG
    from models.corpus import CORPUS

    prepared = Counter()
    for b in CATALOG:
        ref = ModelRef(b.key)
        if b.key == DEFAULT:
            calls = [(corpus_profile, (ref, False, (), list(CORPUS))), *encoder_first_forms(ref), *steps()]
        else:
            calls = results.steps(ref)
        for result, args in calls:
            prepared[result.name] += 1
    assert prepared["profile"] >= 5, prepared  # five today: one for the encoder, two for each decoder
    for name, count in prepared.items():
        assert count <= shared.DECLARED[name].cache.max_entries, (name, count)
