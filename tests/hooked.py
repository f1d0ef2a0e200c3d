"""transformers' own models run with hooks, the reference every patching test holds ours to: each head's ``z`` put in
place or tapped at the input of a layer's attention output projection, and a tiny random model saved with its biases
and norms moved away from their start."""
from __future__ import annotations

import torch


def z_hooked(run, layers, out_proj, n_heads: int, patches=(), taps: list | None = None):
    """``run()`` (transformers' forward pass, returning what the metric reads) with ``patches`` ``(row, layer, head,
    clean z (n, H * Dh))`` put into the input of each layer's output projection (``out_proj(layer)``); ``taps``: a
    list given a zero added to each layer's z, for its gradient. Returns ``run()``'s value and each layer's z."""
    zs, handles = [], []
    for i, layer in enumerate(layers):
        def pre(m, args, i=i):
            z = args[0].clone()
            Dh = z.shape[-1] // n_heads
            for row, at, h, clean in patches:
                if at == i:
                    z[row, :, h * Dh:(h + 1) * Dh] = clean[:, h * Dh:(h + 1) * Dh]
            if taps is not None:
                taps.append(torch.zeros_like(z, requires_grad=True))
                z = z + taps[-1]
            zs.append(z.detach())
            return (z,)
        handles.append(out_proj(layer).register_forward_pre_hook(pre))
    try:
        with torch.set_grad_enabled(taps is not None):
            value = run()
    finally:
        for h in handles:
            h.remove()
    return value, zs


def saved_perturbed(hf, folder, model_class):
    """``hf`` (a tiny random transformers model) with its biases and norms moved from their start, so that each takes
    part, saved in ``folder`` and opened again in float64 on transformers' eager attention."""
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(folder)
    return model_class.from_pretrained(folder, attn_implementation="eager").eval().double()


def every_edge_or_none(stack, clean, bad, measure, m_clean: float, m_bad: float, output: str) -> None:
    """A circuit of every edge of ``stack``'s graph is the clean run's metric ``m_clean`` (transformers'), one of no
    edge the corrupted run's ``m_bad``, to 1e-10; the two runs differ; the graph's last node is ``output``."""
    import pytest

    from analysis.circuits import graph as C

    graph, rows = C.graph_of(stack), torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        bad_run = C.run_ids(stack, graph, bad, measure, rows)
        every = C.all_edges(graph).double()
        assert float(C.circuit_values(stack, graph, clean, bad_run, every, measure, rows)) == \
            pytest.approx(float(m_clean), abs=1e-10)
        assert float(C.circuit_values(stack, graph, clean, bad_run, every * 0, measure, rows)) == \
            pytest.approx(float(m_bad), abs=1e-10)
    assert abs(float(m_clean - m_bad)) > 1e-3
    assert graph.receiver_name(len(graph.receivers) - 1) == output
