"""Long prompts on SmolLM2: a layer's heatmaps of a 2,048- or 4,096-token prompt against transformers' SDPA
forward pass over the same prompt, switching layer or head, bytes per view and memory.

    python -m bench.bench_long [--tokens 4096 2048] [--prompts 5] [--layers 0 15 29] [--device cpu]

For each of ``--prompts`` new prompts (the built-in corpus shuffled, so nothing is cached), in one
process and back to back:

- theirs: transformers' SmolLM2 (``LlamaForCausalLM``, SDPA attention, no weights) over the whole
  prompt, as a language model runs it (logits at every position); and its ``LlamaModel`` alone,
  without the unembedding, for a stricter comparison;
- HeadLens, Explore's first view of layer L from nothing: ``attend_long`` (tokenizing, the sink measured on
  the first queries), the forward pass up to L, every head of L pooled to 128 x 128 blocks with its
  figures, the zoom's exact 128 x 128 weights, and both plotly figures serialised as the app sends
  them. Each layer of ``--layers`` starts from a new ``LongAttention``.

Then, on a prompt run to the top: switching to another layer (its grid, figures and figure) and to
another head (its zoom). Ratios are medians over prompts, each measured in the same process.

    python -m bench.bench_long --roles [--tokens 4096 2048] [--prompts 3]

Head roles over a long text (``analysis.roles.long.profile_document``) instead: each prompt from nothing
(the forward pass runs as the profile climbs) against transformers' SDPA forward over it, and the
resident set above what the prompt holds once run to the top, while every layer is measured.

Memory is measured first, before transformers' model is loaded: the process's resident set, sampled
every 5 ms, above what it held with our model loaded and run once (its first forward pass allocates
about 340 MB once, whatever the text), while two prompts are opened at the top layer and kept, as
two sessions of a server would, then switched to another layer and zoomed.
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import threading
import time

import torch

from bench.common import machine, sync

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Peak:
    """The largest resident set while the block runs, sampled in a thread."""

    def __enter__(self):
        self.peak, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def prompt(model, n_tokens: int, seed: int) -> str:
    """A new text of at least ``n_tokens`` tokens: the built-in corpus's sentences, shuffled by ``seed``."""
    from models.corpus import CORPUS

    rng = random.Random(seed)
    sentences: list[str] = []
    while True:
        batch = list(CORPUS)
        rng.shuffle(batch)
        sentences += batch
        text = " ".join(sentences)
        if len(model.tokenizer(text)["input_ids"]) >= n_tokens:
            break
    words = text.split()
    low, high = 1, len(words)
    while low < high:  # the fewest words that make n_tokens
        mid = (low + high) // 2
        low, high = (mid + 1, high) if len(model.tokenizer(" ".join(words[:mid]))["input_ids"]) < n_tokens else (low, mid)
    return " ".join(words[:low])


def first_view(model, text: str, layer: int, device: str):
    """Explore's work from a new prompt to layer ``layer``'s figures: seconds, bytes sent, the prompt."""
    from analysis import long_view, zoom_window
    from viz import head_grid, head_heatmap

    sync(device)
    start = time.perf_counter()
    att = model.attend_long(text)
    v = long_view(att, hide_special=False)
    g = v.grid(layer, list(range(att.n_heads)))
    fig = head_grid(g.weights, v.labels, v.labels, list(range(att.n_heads)), starts=(g.q_starts, g.k_starts),
                    hidden=g.hidden, title=f"Layer {layer}")
    window = zoom_window(len(v), len(v) - 128)
    zoom = head_heatmap(v.exact(layer, 0, window, window), v.labels[window[0]:window[1]],
                        v.labels[window[0]:window[1]], max_cells=None, visible=v.visible(window, window))
    sent = len(fig.to_json()) + len(zoom.to_json())
    sync(device)
    return time.perf_counter() - start, sent, att


def switch(att, layer: int, head: int, device: str) -> tuple[float, float]:
    """Seconds to show another layer of a prompt run that far, and another head's zoom."""
    from analysis import long_view, zoom_window
    from viz import head_grid, head_heatmap

    v = long_view(att)
    sync(device)
    start = time.perf_counter()
    g = v.grid(layer, list(range(att.n_heads)))
    head_grid(g.weights, v.labels, v.labels, list(range(att.n_heads)), starts=(g.q_starts, g.k_starts),
              hidden=g.hidden).to_json()
    sync(device)
    middle = time.perf_counter()
    window = zoom_window(len(v), len(v) // 2)
    head_heatmap(v.exact(layer, head, window, window), v.labels[window[0]:window[1]], v.labels[window[0]:window[1]],
                 max_cells=None).to_json()
    sync(device)
    return middle - start, time.perf_counter() - middle


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 2048])
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 15, 29])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--roles", action="store_true", help="Head roles over long texts instead")
    ap.add_argument("--climb", action="store_true", help="any layer after a first view, as the app climbs")
    a = ap.parse_args()
    if a.roles:
        roles(a)
        return
    if a.climb:
        climbed(a)
        return

    from models import load_model

    import transformers

    from models.gguf import bundled_file, gguf_folder

    scratch = load_model(NAME, backend="scratch", device=a.device)
    scratch.attend("Which do you like better, coffee or tea?")  # the first forward pass's one-time allocations
    print(f"# Long prompts, SmolLM2-135M-Instruct, on {machine(a.device)}")
    print("\n## Memory: two prompts open at the top layer, each switched to another layer and zoomed")
    from models.memory import release_memory

    for n in a.tokens:
        gc.collect()
        release_memory()
        base = rss()
        with Peak() as peak:
            opened = [first_view(scratch, prompt(scratch, n, seed=7 * n + k), scratch.n_layers - 1, a.device)[2]
                      for k in range(2)]
            for k, att in enumerate(opened):
                switch(att, 11 + k, 3 + k, a.device)
        held = sum(att.nbytes for att in opened)
        print(f"{n:,} tokens: at most {(peak.peak - base) / 2**20:,.0f} MiB above the loaded model; "
              f"{(rss() - base) / 2**20:,.0f} MiB after, of which the two prompts hold {held / 2**20:,.0f} MiB")
        opened = None
    gc.collect()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(gguf_folder(bundled_file(NAME)), attn_implementation="sdpa",
                                                               torch_dtype=torch.float32).to(a.device).eval()
    for n in a.tokens:
        rows = {layer: [] for layer in a.layers}
        full, body, layer_switch, head_switch, sent = [], [], [], [], []
        for p in range(a.prompts):
            text = prompt(scratch, n, seed=1000 * n + p)
            ids = {k: v.to(a.device) for k, v in theirs_inputs(scratch, text).items()}
            with torch.inference_mode():
                sync(a.device)
                t = time.perf_counter()
                theirs(**ids)
                sync(a.device)
                full.append(time.perf_counter() - t)
                t = time.perf_counter()
                theirs.model(**ids)
                sync(a.device)
                body.append(time.perf_counter() - t)
            gc.collect()
            att = None
            for layer in a.layers:
                att = None
                gc.collect()
                seconds, size, att = first_view(scratch, text, layer, a.device)
                rows[layer].append(seconds)
                sent.append(size)
            att.run_to(att.n_layers - 1)
            s_layer, s_head = switch(att, (p * 7 + 3) % att.n_layers, (p + 1) % att.n_heads, a.device)
            layer_switch.append(s_layer)
            head_switch.append(s_head)
            att = None
            gc.collect()
        sdpa, sdpa_body = statistics.median(full), statistics.median(body)
        print(f"\n## {n:,} tokens, median of {a.prompts} new prompts")
        print(f"transformers SDPA forward, LlamaForCausalLM (logits at every position): {sdpa:.2f} s; "
              f"LlamaModel alone: {sdpa_body:.2f} s")
        print("Explore's first view of layer   HeadLens s   / CausalLM forward   / LlamaModel forward")
        for layer, times in rows.items():
            ratios = [t / f for t, f in zip(times, full)]
            ratios_body = [t / f for t, f in zip(times, body)]
            print(f"  layer {layer:<24} {statistics.median(times):6.2f}   {statistics.median(ratios):17.2f}"
                  f"   {statistics.median(ratios_body):19.2f}")
        print(f"switch to another layer (run already): {statistics.median(layer_switch):.2f} s (worst "
              f"{max(layer_switch):.2f}); another head's zoom: {statistics.median(head_switch):.2f} s")
        print(f"sent per view (grid + zoom, plotly JSON): {statistics.median(sent) / 1e6:.2f} MB (largest "
              f"{max(sent) / 1e6:.2f})")


def roles(a) -> None:
    """Head roles over long texts: seconds from nothing and per layer, and memory above the prompt run."""
    import transformers

    from analysis.roles.long import profile_document
    from analysis.roles.measure import load_spacy
    from models import load_model
    from models.gguf import bundled_file, gguf_folder
    from models.memory import release_memory

    scratch = load_model(NAME, backend="scratch", device=a.device)
    scratch.attend("Which do you like better, coffee or tea?")
    nlp = load_spacy()
    nlp("A first sentence parsed.")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(gguf_folder(bundled_file(NAME)), attn_implementation="sdpa",
                                                               torch_dtype=torch.float32).to(a.device).eval()
    print(f"# Head roles over a long text, SmolLM2-135M-Instruct, on {machine(a.device)}")
    for n in a.tokens:
        seconds, ratios, memory, sentences = [], [], [], []
        for p in range(a.prompts):
            text = prompt(scratch, n, seed=5000 + 100 * n + p)
            with torch.inference_mode():
                t = time.perf_counter()
                theirs(**{k: v.to(a.device) for k, v in theirs_inputs(scratch, text).items()})
                sdpa = time.perf_counter() - t
            gc.collect()
            release_memory()
            t = time.perf_counter()
            profile = profile_document(scratch.attend_long(text), nlp)
            seconds.append(time.perf_counter() - t)
            ratios.append(seconds[-1] / sdpa)
            sentences.append(len(profile.sentences))
            att = scratch.attend_long(text)     # memory: the prompt run to the top first, then the profile alone
            att.run_to(att.n_layers - 1)
            profile = None
            gc.collect()
            release_memory()
            base = rss()
            with Peak() as peak:
                profile = profile_document(att, nlp)
            memory.append(peak.peak - base)
            att = profile = None
        print(f"{n:,} tokens ({statistics.median(sentences):.0f} sentences), median of {a.prompts}: "
              f"{statistics.median(seconds):.1f} s from nothing, {statistics.median(ratios):.1f} x transformers' "
              f"SDPA forward; at most {max(memory) / 2**20:,.0f} MiB above the prompt run to the top")


def climbed(a) -> None:
    """The app's climb (``app_pages.results.long.climb``) after a first view of layer 0: how long until every layer
    is run, and then a switch to each of ``--layers`` (its grid, figures and figure, as ``switch``), against the same
    switch without the climb (the layers below run then)."""
    from app_pages.results.long import climb
    from models import load_model

    scratch = load_model(NAME, backend="scratch", device=a.device)
    scratch.attend("Which do you like better, coffee or tea?")
    print(f"# A long prompt climbed to the top after its first view, SmolLM2-135M-Instruct, on {machine(a.device)}")
    for n in a.tokens:
        runs, after, before = [], {layer: [] for layer in a.layers}, {layer: [] for layer in a.layers}
        for p in range(a.prompts):
            text = prompt(scratch, n, seed=7000 + 100 * n + p)
            seconds, _, att = first_view(scratch, text, 0, a.device)
            start = time.perf_counter()
            climb(att)
            while att.layers_done < att.n_layers:
                time.sleep(0.05)
            runs.append(time.perf_counter() - start)
            for layer in a.layers:
                after[layer].append(switch(att, layer, 0, a.device)[0])
            att = None
            gc.collect()
            for layer in a.layers:  # without the climb: a new prompt, its first view, then this layer
                _, _, att = first_view(scratch, text, 0, a.device)
                before[layer].append(switch(att, layer, 0, a.device)[0])
                att = None
                gc.collect()
        print(f"\n## {n:,} tokens, median of {a.prompts} new prompts: the climb to the top after a first view of "
              f"layer 0 takes {statistics.median(runs):.1f} s")
        print("switch from layer 0 to    climbed s   not climbed s   (aim: within 3 s once climbed)")
        for layer in a.layers:
            climbed_s, not_climbed_s = statistics.median(after[layer]), statistics.median(before[layer])
            print(f"  layer {layer:<18} {climbed_s:9.2f}   {not_climbed_s:13.2f}")


def theirs_inputs(model, text: str) -> dict:
    return dict(model.tokenizer(text, return_tensors="pt"))


if __name__ == "__main__":
    main()
