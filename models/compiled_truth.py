"""What Tracr compiled a RASP program into, read from the compiler: each head's ``Select`` (keys, queries,
comparison) and what its ``Aggregate`` reads, each feed-forward's ``Map`` or ``SequenceMap``, and the true edges
(which block reads which block's output through the residual stream, and as what: a head's query, key or value, a
feed-forward's input, the output).

A block is found by what it writes: the residual stream's directions are named by the values they hold
(``sort_1:3``, ``frac_prevs``), so the head or feed-forward whose output weights reach a value's directions is the
one that computes it. Names: ``embed`` (the tokens and the positions), ``L1 H0``, ``L0 MLP``, ``output``.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from .result import head_label

EMBED, OUTPUT = "embed", "output"
BASE = ("tokens", "indices", "one")  # what the embeddings write


def assembled(program, vocab, max_seq_len: int, causal: bool, bos: str, pad: str):
    """Tracr's compiled model of ``program`` and the ground truth (a dict, JSON as it is)."""
    from tracr.compiler import compiling, rasp_to_graph

    try:
        model = compiling.compile_rasp_to_model(program, vocab=set(vocab), max_seq_len=max_seq_len, causal=causal,
                                                compiler_bos=bos, compiler_pad=pad)
    except (NotImplementedError, ValueError, KeyError) as err:
        from .errors import HeadLensError

        raise HeadLensError(f"Tracr could not compile this program: {str(err).strip().splitlines()[-1]}") from err
    graph = rasp_to_graph.extract_rasp_graph(program).graph
    return model, truth(model, graph, program)


def _writers(model) -> dict[str, list[str]]:
    """Each value's name, the blocks whose output weights reach its directions."""
    labels, cfg = model.residual_labels, model.model_config
    found = defaultdict(list)
    for i in range(cfg.num_layers):
        at = f"transformer/layer_{i}/"
        out = np.asarray(model.params[at + "attn/linear"]["w"])                     # (H * ks, D)
        for h in range(cfg.num_heads):
            for d in np.flatnonzero(np.abs(out[h * cfg.key_size:(h + 1) * cfg.key_size]).sum(0) > 0):
                found[_name(labels[d])].append(block_name(i, h))
        for d in np.flatnonzero(np.abs(np.asarray(model.params[at + "mlp/linear_2"]["w"])).sum(0) > 0):
            found[_name(labels[d])].append(block_name(i))
    return {name: sorted(set(blocks), key=_order) for name, blocks in found.items()}


def _name(label: str) -> str:
    return label.split(":", 1)[0]


def block_name(layer: int, head: int | None = None) -> str:
    """A block's name: a head's ``head_label`` ("L1 H0"), a feed-forward's "L0 MLP"."""
    return f"L{layer} MLP" if head is None else head_label(layer, head)


def block_at(name: str) -> tuple[int, int | None]:
    """``(layer, head)`` of a block's name (``block_name``); head None for a feed-forward."""
    layer, part = name[1:].split(" ", 1)
    return int(layer), None if part == "MLP" else int(part[1:])


def _order(block: str) -> tuple:
    if block in (EMBED, OUTPUT):
        return (-1 if block == EMBED else 10**6, 0)
    layer, head = block_at(block)
    return (layer, -1 if head is None else head)


def _select(selector, named) -> tuple[list, list, str]:
    """A selector's keys' and queries' SOps and how it reads: "Select(tokens, tokens, LT)", "A & B"."""
    from tracr.rasp import rasp

    if isinstance(selector, rasp.Select):
        return [selector.keys], [selector.queries], \
            f"Select({named(selector.keys)}, {named(selector.queries)}, {selector.predicate.name})"
    parts = [_select(c, named) for c in selector.children]
    joined = {"SelectorAnd": " & ", "SelectorOr": " | "}.get(type(selector).__name__)
    said = joined.join(s for _, _, s in parts) if joined else f"not {parts[0][2]}"
    return [k for p in parts for k in p[0]], [q for p in parts for q in p[1]], said


def truth(model, graph, program) -> dict:
    """The ground truth of a compiled ``program`` (``graph``: Tracr's graph of it): ``blocks`` (one row per
    expression the compiler placed: where, what, in words) and ``edges`` (sender, receiver, input), and the
    ``output``'s name and encoding."""
    from tracr.compiler import nodes
    from tracr.rasp import rasp

    writers = _writers(model)
    blocks, edges = [], set()
    named = _stable_names(graph)

    def sources(sop) -> list[str]:
        """The blocks whose output ``sop`` is (the embeddings for the tokens and the positions)."""
        if sop.label in BASE or isinstance(sop, (rasp.TokensType, rasp.IndicesType)):
            return [EMBED]
        if sop.label in writers:
            return [writers[sop.label][-1]]
        return [s for child in sop.children if isinstance(child, rasp.SOp) for s in sources(child)] or [EMBED]

    for node in graph.nodes.values():
        expr = node[nodes.EXPR]
        if not isinstance(expr, rasp.SOp) or expr.label in BASE or expr.label not in writers:
            continue
        where = writers[expr.label]
        row = {"label": named(expr), "expression": type(expr).__name__, "encoding": rasp.get_encoding(expr).value,
               "blocks": where, "select": None, "reads": None}
        if isinstance(expr, (rasp.Aggregate, rasp.SelectorWidth)):
            keys, queries, said = _select(expr.selector, named)
            head = next(b for b in writers.get(f"{expr.label}_selector_width_attn_output", where) if "H" in b)
            row["select"] = said
            row["comparisons"] = sorted({s.predicate.name for s in _selects(expr.selector)})
            row["keys"], row["queries"] = sorted({named(k) for k in keys}), sorted({named(q) for q in queries})
            for sop, part in [*((k, "k") for k in keys), *((q, "q") for q in queries)]:
                edges.update((s, head, part) for s in sources(sop))
            if isinstance(expr, rasp.Aggregate):
                row["reads"] = named(expr.sop)
                edges.update((s, head, "v") for s in sources(expr.sop))
                row["says"] = f"{said}, aggregating {named(expr.sop)}"
            else:  # the head attends to the BOS as much as to the selected keys; a feed-forward counts them
                edges.add((EMBED, head, "v"))
                mlp = next(b for b in where if b.endswith("MLP"))
                edges.add((head, mlp, "mlp"))
                row["blocks"] = [head, mlp]
                row["says"] = f"SelectorWidth({said})"
        else:
            inputs = [c for c in expr.children if isinstance(c, rasp.SOp)]
            row["reads"] = ", ".join(named(c) for c in inputs)
            row["says"] = f"{type(expr).__name__}({row['reads']})"
            for block in where:
                edges.update((s, block, "mlp") for c in inputs for s in sources(c))
        blocks.append(row)
    sink = named(program)
    edges.update((s, OUTPUT, "output") for s in sources(program))
    numerical = rasp.is_numerical(program)
    return {"output": {"label": sink, "numerical": numerical, "value": program.label},
            "blocks": sorted(blocks, key=lambda r: _order(r["blocks"][0])),
            "edges": [{"sender": s, "receiver": r, "input": i}
                      for s, r, i in sorted(edges, key=lambda e: (_order(e[1]), _order(e[0]), e[2]))]}


def _stable_names(graph):
    """An expression's name as the program gave it ("length", "sort"), numbered in the order the expressions were
    made where two share one: Tracr's labels add a counter of every expression made in the process, so that the
    same program compiled twice would name its values differently."""
    from tracr.compiler import nodes

    exprs = sorted((n[nodes.EXPR] for n in graph.nodes.values()), key=lambda e: e.unique_id)
    by_name = defaultdict(list)
    for e in exprs:
        by_name[e.name].append(e.label)
    table = {label: name if len(labels) == 1 else f"{name}_{k}"
             for name, labels in by_name.items() for k, label in enumerate(labels, start=1)}
    return lambda expr: table.get(expr.label, expr.label)


def _selects(selector) -> list:
    from tracr.rasp import rasp

    if isinstance(selector, rasp.Select):
        return [selector]
    return [s for c in selector.children for s in _selects(c)]


def selections(program, inputs) -> dict[str, list[np.ndarray]]:
    """Each head's Select evaluated by Tracr's own RASP evaluator, not by the compiled weights: for each
    ``Aggregate`` and ``SelectorWidth`` of ``program`` (by the truth's stable ``label``), a bool ``(n, n)`` matrix
    ``[query, key]`` for each of ``inputs`` (lists of the vocabulary's values, no BOS)."""
    from tracr.compiler import nodes, rasp_to_graph
    from tracr.rasp import rasp

    graph = rasp_to_graph.extract_rasp_graph(program).graph
    named = _stable_names(graph)
    return {named(expr): [np.asarray(rasp.evaluate(expr.selector, list(xs)), dtype=bool).reshape(len(xs), len(xs))
                          for xs in inputs]
            for expr in (n[nodes.EXPR] for n in graph.nodes.values())
            if isinstance(expr, (rasp.Aggregate, rasp.SelectorWidth))}
