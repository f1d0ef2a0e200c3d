"""Generate: SmolLM2 continues a sentence greedily, token for token as transformers' generate does;
then every page shows prompt and continuation with the generated tokens marked, and the picker shows
what a generated token looked at."""
import numpy as np
import torch
import transformers as tf

from analysis.attention.views import GENERATED_MARK
from models.files import resolve_model_dir
from tests.conftest import COLD_RUN_S, ROOT, decode, figures

PROMPT = "The capital of France is"
PAGES = sorted(f"app_pages/{p.name}" for p in (ROOT / "app_pages").glob("*.py") if p.name != "__init__.py")


def test_greedy_generation_equals_transformers_generate(smollm2):
    ids = smollm2.tokenizer(PROMPT)["input_ids"]
    ours = list(smollm2.generate_ids(ids, max_new_tokens=20))
    hf = tf.LlamaForCausalLM.from_pretrained(resolve_model_dir("HuggingFaceTB/SmolLM2-135M-Instruct")[0]).eval()
    theirs = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)[0, len(ids):].tolist()
    assert ours == theirs
    assert "".join(smollm2.generate(PROMPT, max_new_tokens=20)) == smollm2.tokenizer.decode(theirs)
    warm = ["".join(smollm2.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=s)) for s in (0, 0, 1)]
    assert warm[0] == warm[1] != warm[2]  # drawn, reproducibly for a seed


def test_continue_marks_the_generated_tokens_on_every_page(new_app, smollm2):
    # the pages that read a corpus read the sidebar's sentence: this test is about the continuation
    at = new_app({"model": "smollm2_scratch", "text": PROMPT, "corpus": "sidebar", "prune_on": "sidebar",
                  "qk_corpus": "sidebar", "task_pairs": "10", "circuit_method": "eap"}, page="app_pages/generate.py",
                 timeout=COLD_RUN_S)
    at.slider(key="gen_tokens").set_value(8).run()
    at.button(key="gen_go").click().run()
    assert not at.exception, at.exception
    continuation = "".join(smollm2.generate(PROMPT, max_new_tokens=8))
    assert at.code[0].value == continuation and continuation.startswith(" Paris")
    # the picker: what the first generated token looked at, layer 0, mean of heads
    att = smollm2.attend(PROMPT + continuation)
    n_prompt = len(smollm2.tokenizer(PROMPT)["input_ids"])
    query = at.selectbox(key="gen_query").value
    assert query == n_prompt and at.selectbox(key="gen_query").options[0].endswith(GENERATED_MARK + "Paris")
    shading = figures(at)[0]
    shown = np.concatenate([decode(t["z"]).ravel() for t in shading["data"]])
    np.testing.assert_allclose(shown, att.weights[0, :, query].mean(0), atol=1e-5)
    # every page now reads the prompt with its continuation, generated tokens marked
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception and not at.error, (page, at.exception)
    at.switch_page("app_pages/explore.py").run()
    labels = figures(at)[0]["layout"]["yaxis"]["labelalias"].values()
    marked = [label for label in labels if label.startswith(GENERATED_MARK)]
    assert len(marked) == len(att.tokens) - n_prompt


def test_generation_is_for_decoders(new_app):
    at = new_app(page="app_pages/generate.py")
    assert "Generation is for decoders" in at.info[0].value
