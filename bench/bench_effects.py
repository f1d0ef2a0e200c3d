"""Activation patching on SmolLM2: our batched patching against one transformers forward pass per head.

    python -m bench.bench_effects [--device cpu|cuda] [--pairs N]

For each built-in pair, timed back to back in one process: every head's output patched at every
position by ``analysis.patch_heads`` (all the heads of a layer in one batch, each copy recomputing only
the layers above its edit), and the same 270 patches as transformers' LlamaForCausalLM (its default SDPA
attention) run once per head with a forward pre-hook on ``o_proj``. Aim: HeadLens / theirs <= 0.25.

Then, on 16-token pairs, per-position patching of every head (aim: <= 60 s), once where the prompts
differ late (positions before the difference cost nothing) and once where they differ at the first token
(every position runs); the residual stream by position; and attribution patching (one forward and one
backward pass): its time and how well it ranks the heads exact patching finds, over the built-in pairs.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr

from analysis.defaults import PAIRS

from analysis.effects import patch_heads, patch_residual
from bench.common import machine, timed
from models import load_model
from models.files import resolve_model_dir

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
SIXTEEN = {  # 16 tokens each; the first differs late, the second at its first token
    "late": ("When Mary and John went to the big store, John gave a cold drink to",
             "When Mary and John went to the big store, Mary gave a cold drink to", " Mary", " John"),
    "first": ("John and Mary went to the big store together, and John gave a drink to",
              "Mary and John went to the big store together, and John gave a drink to", " Mary", " John"),
}


def hooked_sweep(hf, tok, pair, device) -> np.ndarray:
    """Every head patched by one transformers forward pass each: the recovered share per head."""
    cfg = hf.config
    H, Dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    ids = {k: torch.tensor([tok(getattr(pair, k))["input_ids"]], device=device) for k in ("clean", "corrupted")}
    a, d = (answer_token_ids(tok, t) for t in (pair.answer, pair.distractor))
    caught = {}
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda m, args, i=i: caught.__setitem__(i, args[0].clone())) for i, layer in enumerate(hf.model.layers)]
    with torch.inference_mode():
        clean = hf(ids["clean"]).logits[0, -1]
        for h in handles:
            h.remove()
        corrupted = hf(ids["corrupted"]).logits[0, -1]
        lo, hi = float(corrupted[a] - corrupted[d]), float(clean[a] - clean[d])
        out = np.empty((cfg.num_hidden_layers, H))
        for layer in range(cfg.num_hidden_layers):
            for head in range(H):
                def put(m, args, layer=layer, head=head):
                    z = args[0].clone()
                    z[..., head * Dh:(head + 1) * Dh] = caught[layer][..., head * Dh:(head + 1) * Dh]
                    return (z,)

                handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(put)
                logits = hf(ids["corrupted"]).logits[0, -1]
                handle.remove()
                out[layer, head] = (float(logits[a] - logits[d]) - lo) / (hi - lo)
    return out


def answer_token_ids(tok, text: str) -> int:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, text
    return ids[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pairs", type=int, default=len(PAIRS), help="how many built-in pairs to time")
    args = parser.parse_args()
    import transformers as tf

    model = load_model(NAME, backend="scratch", device=args.device)
    folder, _ = resolve_model_dir(NAME)
    hf = tf.LlamaForCausalLM.from_pretrained(folder).eval().to(args.device)
    tok = model.tokenizer
    print(f"SmolLM2-135M-Instruct, {model.n_layers} x {model.n_heads} heads · {machine(args.device)}")
    pairs = list(PAIRS.values())[:args.pairs]
    patch_heads(model, pairs[0].clean, pairs[0].corrupted, pairs[0].answer, pairs[0].distractor)  # warm up
    ratios, exact, estimated = [], [], []
    print(f"{'pair':<40} {'tokens':>6} {'scratch s':>7} {'theirs s':>8} {'ratio':>6} {'max diff':>8}")
    for i, pair in enumerate(pairs):
        run_scratch = lambda: patch_heads(model, pair.clean, pair.corrupted, pair.answer, pair.distractor)  # noqa: E731
        run_theirs = lambda: hooked_sweep(hf, tok, pair, args.device)  # noqa: E731
        if i % 2:
            t_theirs, theirs = timed(run_theirs, args.device)
            t_scratch, scratch = timed(run_scratch, args.device)
        else:
            t_scratch, scratch = timed(run_scratch, args.device)
            t_theirs, theirs = timed(run_theirs, args.device)
        scratch = scratch["recovered"].to_numpy().reshape(theirs.shape)
        ratios.append(t_scratch / t_theirs)
        n = len(tok(pair.clean)["input_ids"])
        print(f"{pair.name:<40} {n:>6} {t_scratch:>7.2f} {t_theirs:>8.2f} {t_scratch / t_theirs:>6.3f} "
              f"{np.abs(scratch - theirs).max():>8.1e}")
        t_est, est = timed(lambda: patch_heads(model, pair.clean, pair.corrupted, pair.answer, pair.distractor,
                                               method="attribution"), args.device)
        exact.append(scratch.reshape(-1))
        estimated.append(est["recovered"].to_numpy())
        top = set(np.argsort(-np.abs(scratch.reshape(-1)))[:10])
        overlap = len(top & set(np.argsort(-np.abs(estimated[-1]))[:10]))
        print(f"    attribution patching {t_est:.2f} s: Pearson {pearsonr(exact[-1], estimated[-1])[0]:.3f}, "
              f"Spearman {spearmanr(exact[-1], estimated[-1])[0]:.3f}, top-10 heads shared {overlap}/10")
    print(f"every head, every position: median HeadLens / theirs {np.median(ratios):.3f} (aim <= 0.25)")
    every_exact, every_est = np.concatenate(exact), np.concatenate(estimated)
    print(f"attribution patching against exact over {len(pairs)} pairs x 270 heads: Pearson "
          f"{pearsonr(every_exact, every_est)[0]:.3f}, Spearman {spearmanr(every_exact, every_est)[0]:.3f}")
    for what, (clean, corrupted, a, d) in SIXTEEN.items():
        assert len(tok(clean)["input_ids"]) == len(tok(corrupted)["input_ids"]) == 16, what
        t_pos, frame = timed(lambda: patch_heads(model, clean, corrupted, a, d, per_position=True), args.device)
        t_res, _ = timed(lambda: patch_residual(model, clean, corrupted, a, d), args.device)
        t_est, _ = timed(lambda: patch_heads(model, clean, corrupted, a, d, per_position=True, method="attribution"),
                         args.device)
        first = next(i for i, (x, y) in enumerate(zip(tok(clean)["input_ids"], tok(corrupted)["input_ids"])) if x != y)
        print(f"16 tokens, prompts differ from token {first}: per-position patching of every head {t_pos:.1f} s "
              f"(aim <= 60), residual stream by position {t_res:.1f} s, attribution patching per position "
              f"{t_est:.2f} s")


if __name__ == "__main__":
    main()
