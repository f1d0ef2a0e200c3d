"""Hard input through the app (AppTest): a chart of the right attention or a sentence, never a
traceback, and the session keeps working afterwards."""
import numpy as np
import pytest

from app_pages.results.messages import short
from app_pages.ui.settings import MAX_CHARS
from tests.conftest import block_max, decode, figures, heatmaps, shown, tick_text, title_text
from tests.test_hard_inputs import HARD
from viz.figures import safe

APP_HARD = {**HARD, "10000 characters": "word " * 1999 + "end.", "600 tokens": " ".join(["tok"] * 600)}


def assert_still_works(at, hf_model):
    at.text_area(key="text").input("Back to work.").run()
    assert not at.exception and not at.error
    z = decode(heatmaps(figures(at)[0])[0]["z"])
    np.testing.assert_allclose(z, hf_model.attend("Back to work.").weights[0, 0], atol=1e-6)


@pytest.mark.parametrize("name", list(APP_HARD))
def test_hard_text_in_explore(name, app, hf_model):
    text = APP_HARD[name].strip()
    app.text_area(key="text").input(text).run()
    assert not app.exception and not app.error
    ref = hf_model.attend(text)
    (fig,) = figures(app)
    assert title_text(fig) == safe(f"Layer 0 · {short(text, 70)}")
    for h, trace in enumerate(heatmaps(fig)):
        np.testing.assert_allclose(decode(trace["z"]), block_max(ref.weights[0, h]), atol=1e-6)
    if len(ref.tokens) <= 20:
        assert tick_text(fig) == [safe(t) for t in ref.tokens]
    notes = [w.value for w in app.warning]
    if ref.truncated:
        assert notes == [f"This text has {ref.n_tokens_original} tokens; the model reads at most 512, so it was cut there."]
    else:
        assert not notes
    assert_still_works(app, hf_model)


@pytest.mark.parametrize("text", ["\u200b\u200d\u00ad", "\x00\x01\x02", "\u200b\n\x07\n\u00ad"])
def test_nothing_to_read_gets_a_sentence_in_the_app(text, app, hf_model):
    app.text_area(key="text").input(text).run()
    assert not app.exception and not figures(app)
    assert "None of these lines has anything to read" in app.warning[0].value
    assert_still_works(app, hf_model)


def test_unreadable_lines_are_left_out(app, hf_model):
    app.text_area(key="text").input("First line.\n\u200b\u200d\n<b>x</b> &amp;\n\x00").run()
    assert app.selectbox(key="sentence").options == ["1. First line.", "2. <b>x</b> &amp;"]
    app.selectbox(key="sentence").set_value(1).run()
    assert not app.exception
    assert tick_text(figures(app)[0]) == [safe(t) for t in hf_model.attend("<b>x</b> &amp;").tokens]


@pytest.mark.parametrize("page", ["compare", "overview", "tokens", "text", "roles"])
def test_every_page_takes_every_hard_line(page, new_app, hf_model):
    text = "\n".join(APP_HARD.values())
    at = new_app({"text": text, "corpus": "sidebar"}, page=f"app_pages/{page}.py")
    assert not at.exception and not at.error and figures(at)
    if page == "roles":
        assert figures(at)[0]["layout"]["title"]["text"] == f"Roles over {len(APP_HARD)} sentences"
    else:
        for i in range(len(APP_HARD)):
            key = "p1_sentence" if page == "compare" else "sentence"
            at.selectbox(key=key).set_value(i).run()
            assert not at.exception and not at.error and figures(at)
            assert all("<" not in title_text(f) for f in figures(at))


def test_markdown_in_a_model_name_is_shown_as_typed(app, hf_model):
    name = "![x](http://127.0.0.1:9/x.png) **bold** :red[red] <b>b</b>"
    app.selectbox(key="model").set_value("custom").run()
    app.text_input(key="custom_model").input(name).run()
    assert not app.exception
    message = app.error[0].value
    assert f"No model '{name}' was found" in shown(message)
    assert "![" not in message and "**" not in message and ":red[" not in message and "http:" not in message
    app.selectbox(key="model").set_value("minilm").run()
    assert_still_works(app, hf_model)


def test_a_crafted_link_falls_back_to_defaults(new_app, hf_model):
    at = new_app({"model": "evil", "device": "cuda:99", "layer": "99", "head": "-1", "heads": ["x", "3"],
                  "sentence": "7", "hide_special": "maybe", "heads_off": ["0.1"], "text": "x" * (MAX_CHARS + 1)})
    assert not at.exception and not at.error
    assert at.selectbox(key="model").value == "minilm" and at.selectbox(key="layer").value == 0
    assert at.multiselect(key="heads").value == list(range(12))
    z = decode(heatmaps(figures(at)[0])[0]["z"])
    np.testing.assert_allclose(z, hf_model.attend("Which do you like better, coffee or tea?").weights[0, 0], atol=1e-6)


def test_a_long_upload_is_profiled_within_the_memory_budget(new_app, hf_model, monkeypatch):
    import app_pages.results.profiles as c

    lines = [f"Sentence number {i} is about a cat that sat on mat {i}." for i in range(40)]
    sizes = np.cumsum([n * n * hf_model.bytes_per_token_pair for n in hf_model.token_counts(lines)])
    monkeypatch.setattr(c, "PROFILE_BYTES", int(sizes[24]))
    at = new_app({"corpus": "upload"}, page="app_pages/roles.py")
    at.get("file_uploader")[0].upload("long.txt", "\n".join(lines).encode(), "text/plain").run()
    assert not at.exception
    assert "Profiling the first 25 of 40 sentences" in at.warning[0].value
    assert figures(at)[0]["layout"]["title"]["text"] == "Roles over 25 sentences"


def test_a_server_can_keep_custom_models_to_one_folder(new_app, tiny, tmp_path, monkeypatch):
    import shutil

    inside = tmp_path / "models" / "tiny-bert"
    shutil.copytree(tiny("bert"), inside)
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(tmp_path / "models"))
    at = new_app({"model": "custom", "custom_model": str(tiny("bert"))})
    assert not at.exception and "loads model folders from" in shown(at.error[0].value)
    for outside in ("/etc", str(inside / ".." / ".." / "elsewhere"), "~"):
        at.text_input(key="custom_model").input(outside).run()
        assert not at.exception and "loads model folders from" in shown(at.error[0].value)
    at.text_input(key="custom_model").input(str(inside)).run()
    assert not at.exception and not at.error
    assert "2 layers × 4 heads" in at.sidebar.caption[0].value


def test_an_unexpected_error_shows_no_details(app, hf_model, monkeypatch):
    """With the repository's config, a bug shows a generic message: no traceback, no paths."""
    import app_pages.ui.views as c

    def broken(*args, **kwargs):
        raise RuntimeError("secret detail at /srv/private/path")

    with monkeypatch.context() as m:
        m.setattr(c, "make_view", broken)
        app.text_area(key="text").input("This run meets a bug.").run()
        (error,) = app.exception
        assert "secret" not in error.message and "/srv" not in error.message and not error.stack_trace
        assert "redacted" in error.message
    assert_still_works(app, hf_model)


@pytest.mark.parametrize("text", ["", "   ", "\n\t\n"])
def test_empty_text_asks_for_a_sentence(text, app, hf_model):
    app.text_area(key="text").input(text).run()
    assert not app.exception and not figures(app)
    assert app.info[0].value == "Type a sentence in the sidebar, one per line, then press Ctrl+Enter."
    assert_still_works(app, hf_model)
