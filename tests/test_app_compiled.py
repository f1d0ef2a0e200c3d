"""A compiled program in the app (``models.compiled``): the sidebar offers the built-in programs, reads inputs of
the program's tokens, and every page opens on one; a page that reads English says why it does not apply."""
import numpy as np
import pytest

from app_pages.ui.page import PAGES
from models.compiled import BUILT_IN, compiled
from tests.conftest import decode, figures, heatmaps

pytestmark = pytest.mark.app

LANGUAGE = {"foci", "roles", "atlas", "queries_keys", "pruning"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The built-in programs compiled into this module's own cache (``HEADLENS_CACHE``, read when one compiles)."""
    import os

    folder, before = tmp_path_factory.mktemp("cache"), os.environ.get("HEADLENS_CACHE")
    os.environ["HEADLENS_CACHE"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("HEADLENS_CACHE", None)
    else:
        os.environ["HEADLENS_CACHE"] = before


def test_every_page_opens_on_a_compiled_program_and_those_reading_english_say_why_not(cache, new_app):
    sort = BUILT_IN["sort"]
    for page in PAGES:
        at = new_app({"model": "compiled_sort"}, page=page.file, timeout=300)
        assert not at.error, (page.name, [e.value for e in at.error])
        info = " ".join(i.value for i in at.info)
        if page.name in LANGUAGE:
            assert f"reads {page.language}; the compiled sort reads its own tokens (1-5, at most 5)" in info, info
            assert sort.about in info
        if page.name == "generate":
            assert "it is a compiled program, with no next token to predict" in info, info
    assert at.sidebar.selectbox[0].value == "compiled_sort"
    assert at.sidebar.selectbox[0].format_func("compiled_sort") == "Compiled · sort · tokens 1-5 · length 5"


def test_explore_draws_the_programs_attention_on_its_tokens_and_a_bad_token_gets_a_sentence(cache, new_app):
    at = new_app({"model": "compiled_sort"})
    text = BUILT_IN["sort"].example
    box = next(t for t in at.sidebar.text_area if t.key.endswith("tokens_compiled_sort"))
    assert box.value == text and len(text.split()) == 4
    model = compiled("sort", device="cpu")
    want = model.attend(text)
    drawn = [decode(h["z"]) for f in figures(at) for h in heatmaps(f)]
    # it opens on the layer of the head the output is read from (L2 H0, the Aggregate), not on L0's empty head
    assert at.selectbox(key="layer").value == 2
    assert drawn and any(d.shape == want.weights.shape[-2:] and np.allclose(d, want.weights[2, 0], atol=1e-6)
                         for d in drawn)
    box.input("3 9").run()
    assert not at.exception
    said = [e.value.replace("\\", "") for e in at.error]  # escaped as markdown: nothing a user types is rendered
    assert any("'9' is not a token of this compiled program: it reads 1, 2, 3, 4, 5" in e for e in said), said


def test_effects_and_circuits_find_the_head_the_compiler_put_the_output_in(cache, new_app):
    """sort's output is an Aggregate in one head (the truth's): Effects' best head on its first built-in pair, and
    Circuits' one-token task, whose top edges keep the whole difference."""
    from models.compiled import ground_truth

    truth = ground_truth(compiled("sort", device="cpu"))
    output = truth.blocks[truth.blocks["label"] == truth.output["label"]].iloc[0]
    at = new_app({"model": "compiled_sort"}, page="app_pages/effects.py", timeout=300)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Clean"] == "+1.00" and metrics["Best head"] == output["block"], metrics
    at = new_app({"model": "compiled_sort"}, page="app_pages/circuits.py", timeout=300)
    assert at.selectbox[0].label == "Task" and at.selectbox[0].value == "one_token"
    title = figures(at)[0]["layout"]["title"]["text"]
    assert title.startswith("The top 10 edges") and "faithfulness 100%" in title, title
    # the compiler's true edges beside the scores: the head that writes the output ranks first and the circuit of
    # 10 edges holds it; the positions L2 H0 queries with (both inputs share them) score 0
    assert "The compiled truth" in [h.value for h in at.subheader]
    edges = next(d.value for d in at.dataframe if "in_circuit" in d.value.columns)
    assert len(edges) == len(truth.edges) and edges.iloc[0][["sender", "receiver"]].tolist() == [output["block"],
                                                                                                  "output"]
    assert edges.iloc[0]["rank"] == 1 and edges.iloc[0]["in_circuit"]
    queried = edges[(edges["sender"] == "input") & (edges["receiver"] == f"{output['block']}.q")]
    assert len(queried) == 1 and queried.iloc[0]["score"] == 0
    said = " ".join(c.value for c in at.caption).replace("\\", "")  # escaped as markdown
    assert f"The compiler's {len(truth.edges)} true edges: the circuit of 10 edges holds " \
           f"{int(edges['in_circuit'].sum())}." in said, said
    assert "as Wang et al. class GPT-2 small's; that is a language model's task." in said  # no IOI to choose here


def test_a_compiled_heads_card_shows_what_the_compiler_put_in_it_beside_what_headlens_found(cache, new_app):
    """sort's L1 H0 counts the smaller keys (a SelectorWidth of a Select over a value mixing each token with its
    position, LT): its explanation names the tokens' LT and earlier copies, the comparison the compiler placed. The
    card opens on L2 H0, the output's Aggregate: a sort's rank, named. A program typed to count the tokens of the
    query's parity compares a value no rule reads: the card says so."""
    at = new_app({"model": "compiled_sort", "head": "1.0"}, page="app_pages/head.py", timeout=300)
    assert not at.error and not at.exception
    code = [c.value for c in at.code]
    assert code == ["SelectorWidth(Select(sequence_map, sequence_map, LT))",
                    "Select(tokens, tokens, LT) or duplicate"], code
    assert "names the comparison the compiler placed" in at.success[0].value
    assert "On your input" in [h.value for h in at.subheader]
    assert figures(at)[0]["layout"]["title"]["text"].startswith("L1 H0 on your input")
    said = " ".join(c.value for c in at.caption).replace("\\", "")  # escaped as markdown
    assert "Attends to the BOS (0.50), the keys whose token is less than its own" in said, said
    assert "True edges: it reads its queries from L0 MLP, its keys from L0 MLP, its values from the tokens and " \
           "positions; it feeds L1 MLP." in said, said
    at = new_app({"model": "compiled_sort"}, page="app_pages/head.py", timeout=300)
    assert at.title[0].value.startswith("L2 H0")  # the output's Aggregate: the token whose stable rank is its position
    assert [c.value for c in at.code] == ["Select(target_pos, indices, EQ), aggregating tokens", "stable rank"]
    assert "names the comparison the compiler placed" in at.success[0].value
    at = new_app({"model": "compiled_typed"}, page="app_pages/head.py", timeout=300)
    program = next(t for t in at.sidebar.text_area if t.key.endswith("rasp_program"))
    program.input("parity = map(x % 2, tokens)\nalike = selector_width(select(parity, parity, ==))").run()
    assert not at.exception and at.title[0].value.startswith("L1 H0")  # the keys of the query's parity
    assert [c.value for c in at.code][0] == "SelectorWidth(Select(parity, parity, EQ))"
    assert "compares a value the program computes" in at.warning[0].value and not at.success


def test_a_rasp_program_typed_in_the_sidebar_compiles_and_opens_as_any_compiled_program(cache, new_app):
    """The sidebar's RASP box opens on sort_unique, typed: Explore draws its heads on its tokens. Python typed there
    gets a sentence pointing at the place and the session goes on; a histogram typed next compiles to one head,
    whose card says what it was compiled to and names its Select."""
    from models.rasp_text import Typed, compile_typed, read_vocab

    at = new_app({"model": "compiled_typed"})
    program = next(t for t in at.sidebar.text_area if t.key.endswith("rasp_program"))
    assert "selector_width(smaller)" in program.value
    inputs = next(t for t in at.sidebar.text_area if t.key.endswith("tokens_compiled_typed"))
    want = compile_typed(Typed(program.value, read_vocab("1 2 3 4 5"), 5), device="cpu").attend(inputs.value)
    drawn = [decode(h["z"]) for f in figures(at) for h in heatmaps(f)]
    assert any(np.allclose(d, want.weights[1, 0], atol=1e-6) for d in drawn if d.shape == want.weights.shape[-2:])
    program.input("x = __import__('os').system('ls')").run()
    assert not at.exception
    said = [e.value.replace("\\", "") for e in at.error]  # escaped as markdown
    assert any(e.startswith("Line 1, column 15: '(' is not RASP here") for e in said), said
    program.input("hist = selector_width(select(tokens, tokens, ==))").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.sidebar.caption[-1].value.endswith("· 1 layers × 1 heads"), at.sidebar.caption[-1].value
    at.switch_page("app_pages/head.py").run()
    assert not at.exception and [c.value for c in at.code] == ["SelectorWidth(Select(tokens, tokens, EQ))",
                                                               "Select(tokens, tokens, EQ)"]
