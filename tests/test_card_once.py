"""A card is put together once (``analysis.cards.assemble``): on the Head page each part is the shared result its
page reads, from Python each is computed. Each card's parts of SmolLM2's first built-in pair are checked here
against transformers' own run of the same weights with hooks on its modules: every head's direct logit attribution
(its slice of o_proj's input times its columns, through the final norm frozen at the run's scale, along the
answer's unembedding row less the distractor's) and a head's recovered share (transformers' corrupted run with that
head's slice of o_proj's input taken from the clean run)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

from analysis import cards
from analysis.defaults import PAIRS
from analysis.effects import answer_token
from app_pages.results import card as page
from app_pages.results.models import ModelRef
from app_pages.results.threads import here
from models.gguf import bundled_file

pytestmark = pytest.mark.bundled
NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture
def background():
    """Shared results computed as the server's own work: no page to draw a progress bar on."""
    here.background = True
    yield
    here.background = False


def hooked(hf, ids: list[int], patch: tuple | None = None) -> dict:
    """transformers' run of ``ids``: each layer's o_proj input (every head's z side by side) and the last layer's
    output, kept; ``patch`` = (layer, head, z) puts ``z``'s slice of that head into its layer's o_proj input."""
    H = hf.config.num_attention_heads
    Dh = hf.config.hidden_size // H
    got, handles = {"z": {}}, []
    for i, layer in enumerate(hf.model.layers):
        def pre(m, args, i=i):
            z = args[0].clone()
            if patch is not None and patch[0] == i:
                z[..., patch[1] * Dh:(patch[1] + 1) * Dh] = patch[2][..., patch[1] * Dh:(patch[1] + 1) * Dh]
            got["z"][i] = z
            return (z,)
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(pre))
    handles.append(hf.model.norm.register_forward_pre_hook(lambda m, a: got.__setitem__("last", a[0][0, -1])))
    try:
        with torch.inference_mode():
            got["logits"] = hf(torch.tensor([ids])).logits[0, -1]
    finally:
        for h in handles:
            h.remove()
    return got


def test_the_page_and_python_cards_give_a_pairs_parts_as_transformers_hooked(smollm2, background):
    ref = ModelRef("smollm2")
    pair = next(iter(PAIRS.values()))
    cards_parts = {"page": page.FromPages(ref).pair(pair), "python": cards.Computed(smollm2, []).pair(pair)}
    path = bundled_file(NAME)  # transformers' own reading of the bundled GGUF file, eager attention
    hf = tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager").eval()
    tok = smollm2.tokenizer
    a, d = answer_token(smollm2, pair.answer), answer_token(smollm2, pair.distractor, "distractor")
    clean, corrupted = (hooked(hf, tok(t)["input_ids"]) for t in (pair.clean, pair.corrupted))

    def ld(run) -> float:
        return float(run["logits"][a] - run["logits"][d])

    H = hf.config.num_attention_heads
    Dh = hf.config.hidden_size // H
    x = clean["last"]
    scale = hf.model.norm.weight / torch.sqrt(x.pow(2).mean() + hf.model.norm.variance_epsilon)
    direction = (hf.lm_head.weight[a] - hf.lm_head.weight[d]) * scale
    with torch.no_grad():
        want = np.array([[float(hf.model.layers[layer].self_attn.o_proj.weight[:, h * Dh:(h + 1) * Dh]
                                @ clean["z"][layer][0, -1, h * Dh:(h + 1) * Dh] @ direction)
                          for h in range(H)] for layer in range(hf.config.num_hidden_layers)])
    # float32 through 30 layers of transformers and of ours: a head's part of a logit difference of 6 agrees to 6e-6,
    # a recovered share to 2e-6 here; each is held to 1e-4
    for which, (attribution, heads) in cards_parts.items():
        got = attribution["attribution"].to_numpy().reshape(want.shape)
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=which)
        assert attribution.attrs["logit_diff"] == pytest.approx(ld(clean), abs=1e-4)
    span = ld(clean) - ld(corrupted)
    recovered = cards_parts["page"][1].set_index(["layer", "head"])["recovered"]
    strongest = recovered.abs().sort_values(ascending=False).index[:3].tolist()
    for layer, head in [*strongest, (0, 0), (15, 4)]:
        patched = hooked(hf, tok(pair.corrupted)["input_ids"], (layer, head, clean["z"][layer]))
        want_share = (ld(patched) - ld(corrupted)) / span
        for which, (_, heads) in cards_parts.items():
            got = heads.set_index(["layer", "head"]).loc[(layer, head), "recovered"]
            assert got == pytest.approx(want_share, abs=1e-4), (which, layer, head)
    assert abs(recovered.loc[strongest[0]]) > 0.1  # the comparison is of a head that matters
