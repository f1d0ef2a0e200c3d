"""Long prompts in the app, on the bundled SmolLM2 at about 2,048 tokens and at 4,096: Explore's pooled heads,
its zoom (from the URL) and "last queries" mode, the Overview with every head's reach, the cut at 4,096
tokens, and two sessions with 4,096-token prompts within the memory bound. The reference is transformers'
own Llama: its hidden state entering a layer, its projections and rotary positions, one head at a time."""
import functools
import threading

import numpy as np
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from app_pages.results import long as long_results
from models import load_model
from models.long import LongAttention
from harness.texts import prompt
from tests.conftest import COLD_RUN_S, block_max, decode, figures, heatmaps, title_text

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def reference():
    """``weights(text, layer, head)``: one head's every weight, from transformers' SmolLM2 (eager attention)."""
    hf = load_model(NAME, backend="transformers")
    model = hf.model

    @functools.lru_cache(maxsize=2)  # a prompt's tests ask for several layers: one forward pass a prompt
    def hidden_states(text: str) -> tuple:
        with torch.inference_mode():
            return model(**hf.tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states

    def weights(text: str, layer: int, head: int | None = None) -> np.ndarray:
        """``(n, n)`` for ``head``, ``(heads, n, n)`` for every head."""
        with torch.inference_mode():
            hidden = hidden_states(text)[layer]                                        # entering the layer
            block = model.layers[layer]
            h = block.input_layernorm(hidden)
            attn = block.self_attn
            n, d = h.shape[1], attn.head_dim
            q = attn.q_proj(h).view(1, n, -1, d).transpose(1, 2)
            k = attn.k_proj(h).view(1, n, -1, d).transpose(1, 2)
            cos, sin = model.rotary_emb(h, torch.arange(n).view(1, -1))
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            group = q.shape[1] // k.shape[1]
            heads = range(q.shape[1]) if head is None else [head]
            out = []
            for h in heads:
                scores = (q[0, h] @ k[0, h // group].T) * d ** -0.5
                scores.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu_(1), float("-inf"))
                out.append(torch.softmax(scores, dim=-1).numpy())
            return out[0] if head is not None else np.stack(out)

    weights.tokenizer = hf.tokenizer
    return weights


def long_app(new_app, text, page=None, **params):
    # a long prompt's page profiles thousands of tokens: a minute alone on two cores, more beside the other worker
    return new_app({"model": "smollm2_scratch", "text": text, **params}, page=page, timeout=COLD_RUN_S)


def texts(at) -> str:
    return " ".join(str(e.value) for kind in ("caption", "markdown", "warning", "subheader") for e in at.get(kind))


def test_explore_pools_every_head_of_a_2048_token_prompt_and_zooms_from_the_url(new_app, reference, monkeypatch):
    text = prompt(reference.tokenizer, 2048, seed=1)
    at = long_app(new_app, text, layer="3", zoom_head="2", zoom_q="1000", zoom_k="900")
    assert not at.error and not at.warning, [e.value for e in (*at.error, *at.warning)]
    grid, zoom = figures(at)[:2]
    assert "block of 16 queries by 16 keys" in texts(at)
    exact = reference(text, 3, 2)
    n = exact.shape[0]
    assert n == 2048
    z = decode(heatmaps(grid)[2]["z"]).astype(float)
    want = block_max(exact)
    seen = ~np.isnan(z)
    assert not seen[0, 1] and seen[1, 0] and seen.sum() == 128 * 129 // 2  # blocks above the diagonal: never seen
    np.testing.assert_allclose(z[seen], want[seen], atol=1e-4)
    assert "L3 H2, queries 1000–1127, keys 900–1027" in title_text(zoom)
    z = decode(zoom["data"][0]["z"]).astype(float)
    part = exact[1000:1128, 900:1028]
    assert z.shape == (128, 128)
    np.testing.assert_allclose(z[np.isfinite(z)], part[np.isfinite(z)], atol=1e-4)
    assert np.isfinite(z).sum() == (np.arange(1000, 1128)[:, None] >= np.arange(900, 1028)[None, :]).sum()
    # each head's numbers, from every query row
    table = at.dataframe[0].value
    position = np.arange(n)
    np.testing.assert_allclose(table["mean distance (tokens)"][2], (exact * (position[:, None] - position)).sum(-1).mean(),
                               rtol=1e-3)
    np.testing.assert_allclose(table["to the first token (sink)"][2], exact[:, 0].mean(), atol=1e-4)

    # a click on a head's heatmap zooms there; sliders move the zoom, and both live in the URL
    at.slider(key="zoom_q").set_value(1500).run()
    assert at.query_params["zoom_q"] == "1500" and at.query_params["zoom_head"] == "2"
    zoom = figures(at)[1]
    np.testing.assert_allclose(np.nan_to_num(decode(zoom["data"][0]["z"]).astype(float)),
                               exact[1500:1628, 900:1028], atol=1e-4)

    # once the first view is drawn the server runs the prompt to its top layer: a switch then runs no layer
    for climb in list(long_results._climbs.values()):
        climb.join(timeout=300)
    ran = []
    with monkeypatch.context() as patched:
        patched.setattr(LongAttention, "_run_one", lambda self, layer: ran.append(layer))
        at.selectbox(key="layer").set_value(27).run()
    assert not at.error and ran == [], ran
    z = decode(heatmaps(figures(at)[0])[2]["z"]).astype(float)
    top = reference(text, 27, 2)
    np.testing.assert_allclose(z[~np.isnan(z)], block_max(top)[~np.isnan(z)], atol=1e-4)
    at.selectbox(key="layer").set_value(3).run()

    # the last queries, one row each, against every key
    at.toggle(key="last_only").set_value(True).run()
    at.number_input(key="last_k").set_value(24).run()
    grid = figures(at)[0]
    z = decode(heatmaps(grid)[2]["z"]).astype(float)
    assert z.shape == (24, 128) and "last 24 queries" in title_text(grid)
    np.testing.assert_allclose(np.nan_to_num(z), np.maximum.reduceat(exact[-24:], np.arange(0, n, 16), axis=1), atol=1e-4)


def test_a_layer_not_yet_run_shows_the_nearest_ready_one_until_it_comes(new_app, reference, monkeypatch):
    """A long prompt opened at layer 12 before it has run that far: Explore draws the nearest ready layer first
    (layer 0, the embeddings alone), titled as such and said so, and only then runs the layers up to 12; that done,
    the page draws layer 12 itself."""
    from app_pages.ui import long as long_ui

    text = prompt(reference.tokenizer, 1000, seed=6)
    asked = []
    with monkeypatch.context() as held:  # the run up to layer 12 held back: the page as it is drawn before it
        held.setattr(long_ui, "catch_up", lambda att, layer, slot: asked.append(layer))
        at = long_app(new_app, text, layer="12")
    assert not at.exception and not at.error and asked == [12], [e.value for e in at.error]
    grid = figures(at)[0]
    assert "Layer 0 · 1,000 tokens · the nearest ready layer to 12" in title_text(grid)
    z = decode(heatmaps(grid)[2]["z"]).astype(float)
    np.testing.assert_allclose(z[~np.isnan(z)], block_max(reference(text, 0, 2))[~np.isnan(z)], atol=1e-4)
    assert "Layer 12 is on its way: the prompt has run up to layer 0" in texts(at)
    at.run()  # the run no longer held back: the layers up to 12, then the page again
    grid = figures(at)[0]
    assert "Layer 12 · 1,000 tokens" in title_text(grid) and "nearest" not in title_text(grid)
    z = decode(heatmaps(grid)[2]["z"]).astype(float)
    np.testing.assert_allclose(z[~np.isnan(z)], block_max(reference(text, 12, 2))[~np.isnan(z)], atol=1e-4)
    assert "on its way" not in texts(at)


def test_text_and_tokens_read_one_query_row_of_a_2048_token_prompt(new_app, reference):
    text = prompt(reference.tokenizer, 2048, seed=1)  # the prompt of the Explore test: computed once for both
    exact = reference(text, 3, 2)
    at = long_app(new_app, text, page="app_pages/text.py", layer="3", head="2", query="1500", text_from="1300")
    assert not at.error, [e.value for e in at.error]
    shading = figures(at)[0]
    assert "tokens 1300–1699 of 2,048" in title_text(shading)
    shown = np.concatenate([decode(t["z"]).ravel() for t in shading["data"]])
    np.testing.assert_allclose(shown, exact[1500, 1300:1700], atol=1e-4)
    assert any("The ten tokens that get the most weight: " + str(int(np.argmax(exact[1500]))) in c.value
               for c in at.caption)
    at.switch_page("app_pages/tokens.py").run()
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    strongest = table[table["head"] == 2]
    assert list(strongest["key"]) == list(np.argsort(-exact[1500], kind="stable")[:8])
    np.testing.assert_allclose(strongest["weight"], np.sort(exact[1500])[::-1][:8], atol=1e-4)
    assert (strongest["back"] == 1500 - strongest["key"]).all()


def test_across_layers_rolls_one_query_of_a_2048_token_prompt_through_a_window(new_app, reference):
    text = prompt(reference.tokenizer, 2048, seed=1)
    at = long_app(new_app, text, page="app_pages/layers.py", query="1500", window="2-3", layers_from="1300")
    assert not at.error, [e.value for e in at.error]
    assert at.query_params["window"] == "2-3"
    mixed = {layer: reference(text, layer).mean(axis=0) for layer in (2, 3)}
    raw = mixed[3][1500]
    row = 0.5 * raw + 0.5 * np.eye(1, 2048, 1500)[0]          # e_q (0.5 I + 0.5 W3), rows summing to 1
    rolled = 0.5 * row + 0.5 * row @ mixed[2]                 # ... (0.5 I + 0.5 W2)
    raw_fig, rollout_fig = figures(at)[:2]
    assert "tokens 1300–1699 of 2,048" in title_text(rollout_fig)
    for fig, want in ((raw_fig, raw), (rollout_fig, rolled)):
        shown = np.concatenate([decode(t["z"]).ravel() for t in fig["data"]])
        np.testing.assert_allclose(shown, want[1300:1700], atol=1e-4)
    assert any(c.value.startswith(f"Most: {int(np.argmax(rolled))} ") for c in at.caption)


def test_overview_shows_every_head_and_its_reach(new_app, reference):
    text = prompt(reference.tokenizer, 1100, seed=2)
    at = long_app(new_app, text, page="app_pages/overview.py")
    assert not at.error, [e.value for e in at.error]
    thumbnails, reach = figures(at)[:2]
    assert thumbnails["data"][0]["type"] == "image" and len(thumbnails["data"][1]["x"]) == 270
    distance, first = (decode(t["z"]).astype(float) for t in reach["data"])
    assert distance.shape == first.shape == (30, 9)
    for layer, head in ((0, 4), (17, 2), (29, 8)):
        exact = reference(text, layer, head)
        position = np.arange(exact.shape[0])
        np.testing.assert_allclose(distance[layer, head], (exact * (position[:, None] - position)).sum(-1).mean(),
                                   rtol=1e-3)
        np.testing.assert_allclose(first[layer, head], exact[1:, 0].mean(), atol=1e-4)


def test_a_prompt_past_4096_tokens_is_cut_with_a_sentence(new_app, reference):
    text = prompt(reference.tokenizer, 4400, seed=3)
    at = long_app(new_app, text, layer="0")
    assert not at.error and not at.exception
    assert any("reads at most 4,096 here, so it was cut there" in w.value for w in at.warning)
    assert "4,096 tokens" in title_text(figures(at)[0])


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_two_sessions_with_4096_token_prompts_stay_within_the_memory_bound(new_app, reference):
    """Two sessions open two different 4,096-token prompts at the top layer, then switch layer and zoom: the
    server (this process) holds at most 1.5 GB above what it held with the model loaded."""
    first, second = (prompt(reference.tokenizer, 4096, seed=s) for s in (4, 5))
    long_app(new_app, "Which do you like better, coffee or tea?")  # the model loaded, as a server has it
    base, peak, stop = rss(), [0], threading.Event()

    def watch():
        while not stop.wait(0.005):
            peak[0] = max(peak[0], rss())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        a = long_app(new_app, first, layer="29")
        b = long_app(new_app, second, layer="29")
        for at in (a, b):
            assert not at.error, [e.value for e in at.error]
            assert "4,096 tokens" in title_text(figures(at)[0])
        a.selectbox(key="layer").set_value(12).run()
        b.slider(key="zoom_q").set_value(2000).run()
        assert not a.error and not b.error
    finally:
        stop.set()
        watcher.join()
    assert peak[0] - base <= 1.5e9, f"{(peak[0] - base) / 1e9:.2f} GB above the loaded model"


def test_head_roles_and_foci_profile_a_long_text_sentence_by_sentence_in_context(new_app, reference):
    text = prompt(reference.tokenizer, 900, seed=4)
    at = long_app(new_app, text, page="app_pages/roles.py", corpus="document")
    assert not at.error and not at.exception, [e.value for e in at.error]
    n = len(reference.tokenizer(text)["input_ids"])
    assert f"{n} tokens" in texts(at) and "each read after the text before it" in texts(at)
    table = at.dataframe[0].value
    assert len(table) == 270 and table["label"].ne("").all()
    n_sentences = int(title_text(figures(at)[0]).split("Roles over ")[1].split(" ")[0])
    assert n_sentences > 20
    for layer in (0, 13, 29):                          # the first token is a sink here: it never queries
        w = reference(text, layer)[:, 1:]                                          # (heads, queries, keys)
        queries = np.arange(1, w.shape[-1])
        mine = table[table["layer"] == layer].sort_values("head")
        np.testing.assert_allclose(mine["prev_token"], w[:, queries - 1, queries - 1].mean(-1), atol=1e-4)
        np.testing.assert_allclose(mine["cls"], w[..., 0].mean(-1), atol=1e-4)
        np.testing.assert_allclose(mine["entropy_norm"], (-(w * np.log(np.where(w > 0, w, 1))).sum(-1)
                                                          / np.log(np.maximum(queries + 1, 2))).mean(-1), atol=1e-4)
    assert "Where" in texts(at) and len(figures(at)) >= 2                  # a sentence of the text, its queries drawn
    foci = long_app(new_app, text, page="app_pages/foci.py", corpus="document")
    assert not foci.error and not foci.exception, [e.value for e in foci.error]
    assert f"Foci found over {n_sentences:,} sentences" in texts(foci)
