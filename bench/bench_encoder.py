"""Our BertEncoder against transformers' BertModel (eager, output_attentions=True), same weights.

    python -m bench.bench_encoder [--device cpu|cuda]

Workloads: 64 sentences of about 20 tokens as one padded batch, and one 512-token text.
Also the peak memory of one 512-token ``attend`` on each engine, each measured in a fresh process.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

from bench.common import machine, ratio

SUBJECTS = ["The old sailor", "My younger sister", "A curious student", "The small grey cat", "Our new neighbour",
            "The tired engineer", "Every careful reader", "That noisy parrot"]
VERBS = ["quietly handed", "proudly showed", "slowly explained", "happily offered"]
OBJECTS = ["a box", "the strange old map", "a long letter about the storm", "the answer to the puzzle"]
TAILS = ["", " to the children", " to her friends near the river at dawn",
         " to everyone in town before the bell rang, because nobody else had seen it"]


def sentences(n: int = 64) -> list[str]:
    """Sentences of 10 to 29 tokens, 19 on average: pasted text varies in length."""
    return [f"{SUBJECTS[i % 8]} {VERBS[i // 8 % 4]} {OBJECTS[i % 4]}{TAILS[(i // 2 + i // 16) % 4]}."
            for i in range(n)]


def long_text(tokenizer, n_tokens: int = 512) -> str:
    words = " ".join(sentences(64)).split()
    text = " ".join(words[: n_tokens])
    ids = tokenizer(text, truncation=True, max_length=n_tokens)["input_ids"]  # the model cuts the rest
    assert len(ids) == n_tokens, len(ids)
    return text


PEAK_SCRIPT = r"""
import json, sys
from models import load_model
from bench.bench_encoder import long_text

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

model = load_model(backend=sys.argv[1], device=sys.argv[2])
text = long_text(model.tokenizer)
model.attend("warm up")
import torch
if model.device.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak resident size to the current one
before = rss("VmRSS:")
res = model.attend(text)
out = {"cpu_peak_bytes": rss("VmHWM:") - before, "result_bytes": res.weights.nbytes}
if model.device.type == "cuda":
    out["gpu_peak_bytes"] = torch.cuda.max_memory_allocated() - base
print(json.dumps(out))
"""


def peak_memory(backend: str, device: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, backend, device], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    import transformers as tf

    from models import BertEncoder
    from models.files import default_model_dir

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    dev = torch.device(args.device)
    folder = default_model_dir()
    tf.utils.logging.disable_progress_bar()
    ref = tf.BertModel.from_pretrained(folder, attn_implementation="eager").to(dev).eval()
    scratch = BertEncoder.from_pretrained(folder).to(dev)
    tok = tf.AutoTokenizer.from_pretrained(folder)
    print(f"BertEncoder vs transformers BertModel (all-MiniLM-L6-v2, eager, output_attentions), {machine(dev)}")
    print(f"{'workload':<28} {'scratch ms':>8} {'theirs ms':>9} {'ratio':>6}")
    for label, texts in [("64 sentences, ~20 tokens", sentences(64)), ("1 text, 512 tokens", [long_text(tok)])]:
        enc = tok(texts, padding=True, truncation=True, max_length=512, return_tensors="pt").to(dev)
        with torch.inference_mode():
            want = ref(**enc, output_attentions=True).attentions
            got = scratch(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).attentions
            real = enc["attention_mask"].bool()  # padded query rows carry no meaning
            assert max((a - b).transpose(1, 2)[real].abs().max().item() for a, b in zip(got, want)) < 1e-4
            r, t_scratch, t_ref = ratio(
                lambda: scratch(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]),
                lambda: ref(**enc, output_attentions=True), dev)
        print(f"{label:<28} {t_scratch * 1e3:8.1f} {t_ref * 1e3:9.1f} {r:6.2f}")
    print("\nPeak memory of one 512-token attend (fresh process, above the loaded model):")
    for backend in ("scratch", "transformers"):
        m = peak_memory(backend, str(dev))
        line = f"  {backend:<13} CPU {m['cpu_peak_bytes'] / 2**20:6.1f} MiB (result {m['result_bytes'] / 2**20:.1f} MiB)"
        if "gpu_peak_bytes" in m:
            line += f", GPU {m['gpu_peak_bytes'] / 2**20:.1f} MiB"
        print(line)


if __name__ == "__main__":
    main()
