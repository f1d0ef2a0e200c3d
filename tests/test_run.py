"""The one run (``models.run``): its edit points against hooks on transformers' own modules (tiny random Llama
with grouped key/value heads, and a sliding window in Mistral), and the rule that every analysis runs a stack
through ``Stack.run_layers`` with edits."""
import ast
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from models import HeadLensError, load_model
from models.run import (POINTS, Edits, Given, editable, language_stack, patching_stack, reading, stack_of,
                        switched_off)
from tests.test_llama import build

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The cat sat on the mat because it was warm."
# transformers' RMSNorm and rotary angles run in float32 inside a float64 model: its logits and ours differ by
# about 2e-5 on these models without any edit, so an edited run is held to 1e-4 of theirs
LOGITS = dict(atol=1e-4, rtol=0)


def near(ours, theirs):
    """Within 1e-5 of the largest value (what float32 inside transformers reaches)."""
    torch.testing.assert_close(ours, theirs, atol=1e-5 * float(theirs.detach().abs().max()), rtol=0)


@pytest.fixture(scope="module", params=["llama", "mistral"])
def decoder(request, tmp_path_factory):
    """(ours on the from-scratch engine, in float64; transformers' CausalLM in float64; token ids)."""
    family, folder, hf, tok = build(request.param, tmp_path_factory.mktemp(f"run-{request.param}"))
    model = load_model(folder, backend="scratch")
    stack = model.stack.double()
    return stack, hf.double(), tok(TEXT, return_tensors="pt")["input_ids"]


def hf_logits(hf, ids, hooks=()):
    handles = [module.register_forward_hook(hook) if kind == "out" else module.register_forward_pre_hook(hook)
               for kind, module, hook in hooks]
    try:
        with torch.no_grad():
            return hf(input_ids=ids).logits
    finally:
        for handle in handles:
            handle.remove()


def ours_logits(stack, ids, edits):
    with torch.no_grad():
        return stack(ids, need_weights=False, edits=edits).logits


def test_a_replaced_pattern_mixes_transformers_values(decoder):
    """Head 3 of layer 1 given a pattern of our own (uniform over the previous two tokens and the first): the run
    equals transformers' with that head's slice of o_proj's input set to the pattern times its value projection's
    output (its key/value head's)."""
    stack, hf, ids = decoder
    n = ids.shape[1]
    layer, head = 1, 3
    pattern = torch.zeros(n, n, dtype=torch.float64)
    for q in range(n):
        keys = sorted({0, max(0, q - 1), max(0, q - 2)})
        pattern[q, keys] = 1 / len(keys)
    cfg = hf.config
    Dh = cfg.hidden_size // cfg.num_attention_heads
    g = head // (cfg.num_attention_heads // cfg.num_key_value_heads)
    seen = {}

    def replace(w):
        w = w.clone()
        w[:, head] = pattern
        return w

    attn = hf.model.layers[layer].self_attn

    def put(module, args):
        z = args[0].clone()
        v = seen["v"][..., g * Dh:(g + 1) * Dh]                                      # (1, n, Dh)
        z[..., head * Dh:(head + 1) * Dh] = pattern @ v
        return (z,)

    hooks = [("out", attn.v_proj, lambda m, a, out: seen.__setitem__("v", out)), ("pre", attn.o_proj, put)]
    ours = ours_logits(stack, ids, Edits({("pattern", layer): replace}))
    theirs = hf_logits(hf, ids, hooks)
    torch.testing.assert_close(ours, theirs, **LOGITS)
    assert (ours - ours_logits(stack, ids, None)).abs().max() > 1e-2  # the pattern changed the run
    # read, not replaced: the pattern is the model's own weights, which transformers' eager attention returns
    got = []
    ours_logits(stack, ids, Edits({("pattern", layer): reading(got)}))
    with torch.no_grad():
        weights = hf(input_ids=ids, output_attentions=True).attentions[layer]
    near(got[0], weights)


def test_the_feed_forward_points_read_and_replace_what_transformers_mlp_reads_and_writes(decoder):
    stack, hf, ids = decoder
    layer = 0
    seen = {}
    hooks = [("out", hf.model.layers[layer].post_attention_layernorm,
              lambda m, a, out: seen.__setitem__("in", a[0])),
             ("out", hf.model.layers[layer].mlp, lambda m, a, out: out * 0.5)]
    theirs = hf_logits(hf, ids, hooks)
    read = []
    ours = ours_logits(stack, ids, Edits({("mlp_in", layer): reading(read), ("mlp_out", layer): lambda m: m * 0.5}))
    torch.testing.assert_close(ours, theirs, **LOGITS)
    near(read[0], seen["in"])
    # an MLP stood in for by what it writes in another run: that run's logits
    writes = []
    ours_logits(stack, ids, Edits({("mlp_out", layer): reading(writes)}))
    given = ours_logits(stack, ids, Edits({("mlp_in", layer): lambda x: Given(writes[0])}))
    torch.testing.assert_close(given, ours_logits(stack, ids, None), atol=0, rtol=0)


def test_head_by_head_the_run_is_the_models_and_each_result_is_its_o_proj_slice(decoder):
    """With ``result`` read, a layer runs head by head: the logits are transformers' (1e-10), and each head's write is
    its slice of o_proj's input times its columns of o_proj's weight."""
    stack, hf, ids = decoder
    layer = 1
    results = []
    ours = ours_logits(stack, ids, Edits({("result", layer): reading(results)}))
    seen = {}
    hooks = [("pre", hf.model.layers[layer].self_attn.o_proj, lambda m, a: seen.__setitem__("z", a[0]))]
    theirs = hf_logits(hf, ids, hooks)
    torch.testing.assert_close(ours, theirs, **LOGITS)
    cfg = hf.config
    Dh = cfg.hidden_size // cfg.num_attention_heads
    w = hf.model.layers[layer].self_attn.o_proj.weight                                   # (E, H * Dh)
    for h in range(cfg.num_attention_heads):
        want = seen["z"][..., h * Dh:(h + 1) * Dh] @ w[:, h * Dh:(h + 1) * Dh].T
        near(results[0][h], want)


def test_a_head_mask_is_edits_and_the_weights_of_a_head_switched_off_are_zero(decoder):
    stack, hf, ids = decoder
    L, H = stack.n_layers, stack.n_heads
    mask = torch.ones(L, H, dtype=torch.float64)
    mask[1, 2] = 0
    with torch.no_grad():
        out = stack(ids, head_mask=mask)
    assert not out.attentions[1][0, 2].any() and out.attentions[1][0, 1].any()
    assert set(stack.switched_off(mask)) == {("z", 1)}  # the layer whose heads are all on takes no edit
    Dh = hf.config.hidden_size // H

    def off(module, args):
        z = args[0].clone()
        z[..., 2 * Dh:3 * Dh] = 0
        return (z,)

    theirs = hf_logits(hf, ids, [("pre", hf.model.layers[1].self_attn.o_proj, off)])
    torch.testing.assert_close(out.logits, theirs, **LOGITS)


# --- one way to run a stack ---------------------------------------------------------------------------------

ABOVE = ["analysis", "app_pages", "viz", "bench", "app.py", "headlens.py"]
CALLS = {  # what runs a stack, or a part of one, other than run_layers
    "a block called": re.compile(r"\.layers\[[^\]]*\]\s*\("),
    "an attention called": re.compile(r"\.attn\s*\("),
    "a block's forward": re.compile(r"\bblock\s*\("),
    "an attention's own forward": re.compile(r"\.attn\.(forward|by_head)\b|\.attention_alone\s*\(|block\.by_head\b"),
}


def sources(places):
    for place in places:
        path = ROOT / place
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def test_nothing_above_models_runs_a_stack_but_through_run_layers():
    found = []
    for path in sources(ABOVE):
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(ROOT)}: {what}" for what, pattern in CALLS.items() if pattern.search(text)]
    assert not found, found


# a layer's own parts, which the stack's path walks (``models.stacks.paths``): its norms, its QK-norms, its rotary
# positions, its projections by head, and the norms' frozen form
LAYER_PARTS = re.compile(r"\.(ln_\w+|attention_norm|post_attention_norm|q_norm|k_norm|rotary|head_projections)\b"
                         r"|models\.stacks\.norms")


def test_nothing_above_models_walks_a_layers_parts_again():
    """How a write reaches a later read (norms frozen at a run's scales, or rebuilt as the model applies them) and
    the query and key a head makes of the stream are the stack's (``Stack.path``, ``query_key_sides``): nothing
    above models/ reads a layer's norms, rotary positions or projections to walk them again."""
    found = [f"{path.relative_to(ROOT)}:{n}: {m.group(0)}" for path in sources(ABOVE)
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for m in LAYER_PARTS.finditer(line)]
    assert not found, found


def test_in_models_only_the_stack_walks_its_layers():
    """A loop over a stack's blocks that runs them is ``Stack.run_layers``'s alone (weights files and pruning
    read the blocks, without running them)."""
    walking = []
    for path in sources(["models"]):
        if path.name == "base.py" and path.parent.name == "stacks":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        local = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "block" \
                    and "block" not in local:
                walking.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                target = ast.unparse(node.func.value)
                if target.endswith("layers"):
                    walking.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not walking, walking


PICKER = {"app_pages/results/models.py", "app_pages/ui/models.py", "app_pages/ui/sidebar.py"}  # the engine picker


def test_the_engine_is_chosen_in_models_and_the_picker_alone():
    """Analyses take any loaded model: only models/ hands it to the from-scratch engine (``models.run.editable``),
    and above models/ only the sidebar's picker says which engine a choice runs on; the tokenizer is called through
    the model's public ``tokenize``."""
    found = []
    for path in sources(["analysis", "app_pages", "viz", "app.py", "headlens.py"]):
        where = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        if where not in PICKER and re.search(r"\.scratch\b", text):
            found.append(f"{where}: .scratch")
        if "._tokenize" in text:
            found.append(f"{where}: ._tokenize")
    assert not found, found


def test_a_run_the_engine_cannot_make_is_refused_with_what_was_asked(tiny):
    """A model the from-scratch engine does not implement (BLOOM) is refused by each way into it, the sentence
    starting with what the caller was doing (or the function's own words); an encoder is refused where a language
    model is needed."""
    bloom = load_model(tiny("bloom"), backend="transformers", device="cpu")
    refused = f" inside the from-scratch engine, which does not implement {bloom.name}'s architecture."
    for call, default in ((editable, "This"), (stack_of, "This"), (patching_stack, "Patching replaces a head's output"),
                          (language_stack, "What a head adds to a prediction is read")):
        for args, what in (((bloom,), default), ((bloom, "Pruning switches heads off"), "Pruning switches heads off")):
            with pytest.raises(HeadLensError) as err:
                call(*args)
            assert str(err.value) == what + refused, call.__name__
    encoder = load_model(tiny("bert"), backend="scratch", device="cpu")
    assert patching_stack(encoder) is stack_of(encoder) is editable(encoder).stack  # an encoder patches and measures
    with pytest.raises(HeadLensError) as err:
        language_stack(encoder, "The logit lens")
    assert str(err.value) == (f"The logit lens on a language model; {encoder.name} is an encoder, not a language "
                              "model. Choose SmolLM2, Gemma 3 or a decoder trained here.")


def test_edits_at_one_point_run_one_after_the_other_and_each_point_is_checked():
    a = Edits({("z", 0): lambda v: v + 1, ("z", 1): lambda v: v * 10})
    b = Edits({("z", 0): lambda v: v * 2, ("resid_pre", 1): lambda v: v - 1})
    both = a.then(b)
    assert both[("z", 0)](3) == 8  # (3 + 1) * 2: this one's edit first, then the other's
    assert both[("z", 1)](3) == 30 and both[("resid_pre", 1)](3) == 2 and len(both) == 3
    assert a[("z", 0)](3) == 4  # the edits chained are a new set: these are as they were
    assert a.then(None) is a and a.then(Edits()) is a
    with pytest.raises(ValueError) as err:
        Edits({("nowhere", 0): abs, ("z", 0): abs, ("elsewhere", 1): abs})
    assert str(err.value) == f"No point is named ['elsewhere', 'nowhere']; the points are {list(POINTS)}."


def test_a_head_switched_off_keeps_the_runs_dtype_whatever_its_mask_and_fill_are_in():
    """``switched_off`` on a float32 run given a float64 mask and fill (a mean read in float64): every head's output
    stays float32, a head off is its fill exactly, a head on as it was; without a fill, a head off is zero."""
    z = torch.linspace(-3, 3, 2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)       # (B, kept, n, Dh)
    mask = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    fill = torch.linspace(0.25, 1.75, 15, dtype=torch.float64).view(3, 5)
    (with_fill,), (without,) = (switched_off([(0, mask, f)]).values() for f in (fill, None))
    expected = z.clone()
    expected[:, 1] = fill[1].to(torch.float32)
    out = with_fill(z)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    expected[:, 1] = 0
    out = without(z)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
