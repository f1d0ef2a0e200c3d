"""A card is put together once (``analysis.cards.build.assemble``): on the Head page each part is the shared result its
page reads, from Python each is computed. Each card's parts of every one of SmolLM2's built-in pairs are checked
here against transformers' own run of the same weights with hooks on its modules: every head's direct logit
attribution (its slice of o_proj's input times its columns, through the final norm frozen at the run's scale, along
the answer's unembedding row less the distractor's) and heads' recovered shares (transformers' corrupted run with a
head's slice of o_proj's input taken from the clean run): the strongest and two fixed heads of each pair, and every
head of the first pair, 270 corrupted runs batched."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

from analysis.cards import build as cards
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


def hooked(hf, ids: list[int], patches: list[tuple] = (), rows: int = 1) -> dict:
    """transformers' run of ``ids`` repeated in ``rows`` rows: each layer's o_proj input (every head's z side by side)
    and the last layer's output at the last token (row 0), kept, and the last token's logits; each of ``patches``,
    ``(row, layer, head, z)``, puts ``z``'s slice of that head into its layer's o_proj input in that row."""
    H = hf.config.num_attention_heads
    Dh = hf.config.hidden_size // H
    got, handles = {"z": {}}, []
    for i, layer in enumerate(hf.model.layers):
        def pre(m, args, i=i):
            z = args[0].clone()
            for row, at, head, clean in patches:
                if at == i:
                    z[row, :, head * Dh:(head + 1) * Dh] = clean[0, :, head * Dh:(head + 1) * Dh]
            got["z"][i] = z
            return (z,)
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(pre))
    handles.append(hf.model.norm.register_forward_pre_hook(lambda m, a: got.__setitem__("last", a[0][0, -1])))
    try:
        with torch.inference_mode():
            got["logits"] = hf(torch.tensor([ids] * rows), logits_to_keep=1).logits[:, -1]
    finally:
        for h in handles:
            h.remove()
    return got


@pytest.fixture(scope="module")
def transformers_smollm2():
    path = bundled_file(NAME)  # transformers' own reading of the bundled GGUF file, eager attention
    return tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                   attn_implementation="eager").eval()


@pytest.mark.parametrize("name", list(PAIRS))
def test_the_page_and_python_cards_give_a_pairs_parts_as_transformers_hooked(smollm2, transformers_smollm2,
                                                                             background, name):
    ref = ModelRef("smollm2")
    pair = PAIRS[name]
    cards_parts = {"page": page.FromPages(ref).pair(pair), "python": cards.Computed(smollm2, []).pair(pair)}
    hf, tok = transformers_smollm2, smollm2.tokenizer
    a, d = answer_token(smollm2, pair.answer), answer_token(smollm2, pair.distractor, "distractor")
    clean, corrupted = (hooked(hf, tok(t)["input_ids"]) for t in (pair.clean, pair.corrupted))

    def ld(logits) -> np.ndarray:
        return (logits[:, a] - logits[:, d]).double().numpy()

    H, L = hf.config.num_attention_heads, hf.config.num_hidden_layers
    Dh = hf.config.hidden_size // H
    x = clean["last"]
    scale = hf.model.norm.weight / torch.sqrt(x.pow(2).mean() + hf.model.norm.variance_epsilon)
    direction = (hf.lm_head.weight[a] - hf.lm_head.weight[d]) * scale
    with torch.no_grad():
        want = np.array([[float(hf.model.layers[layer].self_attn.o_proj.weight[:, h * Dh:(h + 1) * Dh]
                                @ clean["z"][layer][0, -1, h * Dh:(h + 1) * Dh] @ direction)
                          for h in range(H)] for layer in range(L)])
    # float32 through 30 layers of transformers and of ours: a head's part of a logit difference of 6 agrees to 6e-6,
    # a recovered share to 2e-6 here; each is held to 1e-4
    for which, (attribution, heads) in cards_parts.items():
        got = attribution["attribution"].to_numpy().reshape(want.shape)
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=which)
        assert attribution.attrs["logit_diff"] == pytest.approx(float(ld(clean["logits"])[0]), abs=1e-4)
    span = float(ld(clean["logits"])[0] - ld(corrupted["logits"])[0])
    recovered = cards_parts["page"][1].set_index(["layer", "head"])["recovered"]
    strongest = recovered.abs().sort_values(ascending=False).index[:3].tolist()
    heads = [(l, h) for l in range(L) for h in range(H)] if name == next(iter(PAIRS)) else \
        [*strongest, (0, 0), (15, 4)]
    ids = tok(pair.corrupted)["input_ids"]
    shares = {}
    for start in range(0, len(heads), 90):  # 90 heads a run, each in a row of its own
        chunk = heads[start:start + 90]
        patched = hooked(hf, ids, [(row, l, h, clean["z"][l]) for row, (l, h) in enumerate(chunk)], len(chunk))
        shares.update(zip(chunk, (ld(patched["logits"]) - ld(corrupted["logits"])[0]) / span))
    for which, (_, frame) in cards_parts.items():
        got = frame.set_index(["layer", "head"])["recovered"]
        np.testing.assert_allclose(got.loc[heads].to_numpy(), [shares[k] for k in heads], atol=1e-4, err_msg=which)
    assert abs(recovered.loc[strongest[0]]) > 0.1  # the comparison is of a head that matters
