"""Shared fixtures: the bundled model, and tiny random models of each family saved to temp folders.

Nothing is downloaded: tokenizers are the bundled MiniLM's WordPiece, or byte-level BPE and
Unigram vocabularies trained here on a few sentences.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A server's warm-up computes a bundled decoder's corpus results in the background once it loads; the tests
# that open one page at a time would share their cores with it. The tests of the warm-up switch it on.
os.environ.setdefault("HEADLENS_WARM_UP", "0")
# A server's own work runs niced so that its sessions come first; here it would give way to the other worker's
# tests instead, which are no sessions of its: SmolLM2's preparation, which the cold server's test and a class's
# load wait for, took 17 minutes behind them.
os.environ.setdefault("HEADLENS_BACKGROUND_NICE", "0")

import functools
import inspect

import hypothesis
import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") != "1":
    # the workers share the cores: one thread each, and in what they start (servers, kernels), whose threads would
    # otherwise wait on one another for a core the other worker holds
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

from models import load_model
from models.files import default_model_dir

# property tests (tests/test_properties.py): on CI the same examples every run, a failing one printed to replay;
# under scripts/mutants (HYPOTHESIS_PROFILE=fail-fast) the same, and a failing example ends the test unshrunk
hypothesis.settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis.settings.register_profile("fail-fast", derandomize=True, phases=[
    hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate], database=None)
if os.environ.get("HYPOTHESIS_PROFILE") or os.environ.get("CI"):
    hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")

CORPUS = [
    "Which do you like better, coffee or tea?",
    "The cat sat on the mat because it was warm.",
    "Hello world! Attention heads look at different words.",
    "She gave her brother a book about the stars.",
    "Please close the door when you leave the room.",
] * 8

ROOT = Path(__file__).resolve().parent.parent
# AppTest's seconds for each run of a page that computes a bundled decoder's results cold: a card read from every
# other page's results, a circuit's edges and curve (one to two minutes on two idle cores, more on a shared machine)
COLD_RUN_S = 600

SENTENCES = ["Which do you like better, coffee or tea?", "The cat sat on the mat.", "Hi"]


@pytest.fixture(scope="session")
def minilm_dir():
    return default_model_dir()


@pytest.fixture(scope="session")
def hf_model():
    return load_model()


@pytest.fixture(scope="session")
def scratch_model():
    return load_model(backend="scratch")


@pytest.fixture(scope="session")
def smollm2():
    """The bundled SmolLM2-135M-Instruct on the from-scratch engine (equal to transformers: test_smollm2.py)."""
    return load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="scratch")


def _bpe_vocab(size: int = 320):
    """A byte-level BPE of ``size`` tokens over the built-in corpus: its vocabulary and merges."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=size, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    spec = json.loads(bpe._tokenizer.to_str())["model"]
    return spec["vocab"], [tuple(m) for m in spec["merges"]]


def _unigram_vocab():
    from tokenizers import SentencePieceUnigramTokenizer

    uni = SentencePieceUnigramTokenizer()
    uni.train_from_iterator(CORPUS, vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"],
                            unk_token="<unk>", show_progress=False)
    return [tuple(v) for v in json.loads(uni._tokenizer.to_str())["model"]["vocab"]]


def build_tiny(family: str, folder, minilm_dir):
    """Save a tiny random model of ``family`` with a tokenizer of its kind into ``folder``."""
    import transformers as tf

    torch.manual_seed(0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    wordpiece = tf.AutoTokenizer.from_pretrained(minilm_dir)
    if family in ("bert", "albert", "electra", "distilbert"):
        tok, vocab = wordpiece, wordpiece.vocab_size
        if family == "bert":
            model = tf.BertModel(tf.BertConfig(vocab_size=vocab, max_position_embeddings=64, **small))
        elif family == "albert":
            model = tf.AlbertModel(tf.AlbertConfig(vocab_size=vocab, embedding_size=16,
                                                   max_position_embeddings=64, **small))
        elif family == "electra":
            model = tf.ElectraModel(tf.ElectraConfig(vocab_size=vocab, embedding_size=16,
                                                     max_position_embeddings=64, **small))
        else:
            model = tf.DistilBertModel(tf.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4,
                                                           hidden_dim=37, max_position_embeddings=64))
    elif family in ("roberta", "gpt2", "bart", "bloom"):
        vocab, merges = _bpe_vocab()
        if family == "roberta":
            tok = tf.RobertaTokenizer(vocab=vocab, merges=merges)
            model = tf.RobertaModel(tf.RobertaConfig(vocab_size=len(vocab), max_position_embeddings=66,
                                                     pad_token_id=1, bos_token_id=0, eos_token_id=2, **small))
        elif family in ("gpt2", "bloom"):  # BLOOM's ALiBi: a decoder the from-scratch engine does not implement
            tok = tf.GPT2Tokenizer(vocab=vocab, merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
            model = tf.GPT2Model(tf.GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=2, n_head=4,
                                               n_positions=64, bos_token_id=0, eos_token_id=2)) if family == "gpt2" \
                else tf.BloomModel(tf.BloomConfig(vocab_size=len(vocab), hidden_size=32, n_layer=2, n_head=4,
                                                  bos_token_id=0, eos_token_id=2))
        else:
            tok = tf.BartTokenizer(vocab=vocab, merges=merges)
            model = tf.BartModel(tf.BartConfig(
                vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
                pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2))
    elif family == "t5":
        tok = tf.T5Tokenizer(vocab=_unigram_vocab(), extra_ids=0)
        model = tf.T5Model(tf.T5Config(vocab_size=tok.vocab_size, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                       num_decoder_layers=2, num_heads=4, pad_token_id=0, eos_token_id=1,
                                       decoder_start_token_id=0))
    else:
        raise ValueError(family)
    model.eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build_words_gpt2(folder, texts: list[str]):
    """Save a tiny random GPT-2 in ``folder`` whose byte-level BPE, trained on ``texts``, holds each of their words
    whole (a causal tokenizer whose tokens a test can work out by hand)."""
    import transformers as tf
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(texts) * 4, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "</s>", "<unk>"], show_progress=False)
    spec = json.loads(bpe._tokenizer.to_str())["model"]
    tok = tf.GPT2Tokenizer(vocab=spec["vocab"], merges=[tuple(m) for m in spec["merges"]], unk_token="<unk>",
                           bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    tf.GPT2Model(tf.GPT2Config(vocab_size=len(spec["vocab"]), n_embd=16, n_layer=2, n_head=2, n_positions=64,
                               bos_token_id=0, eos_token_id=1)).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, minilm_dir):
    """``tiny("gpt2")`` -> folder of a saved tiny GPT-2; each family is built once per run. ``tiny("bloom")`` is a
    decoder the from-scratch engine does not implement."""
    built = {}

    def make(family: str):
        if family not in built:
            built[family] = build_tiny(family, tmp_path_factory.mktemp(f"tiny-{family}"), minilm_dir)
        return built[family]

    return make


def first_load(path, fresh) -> tuple[Path, list]:
    """A first conversion of the GGUF file at ``path``: ``(folder, progress)``. Into the run's own cache while it
    holds no conversion of the file (the run's one conversion, which every later load reads); else, or when another
    process made it meanwhile, into ``fresh``, an empty folder that HEADLENS_CACHE then names."""
    from models.gguf import gguf_folder

    for cache in (None, fresh):  # the run's cache gives no progress when the file was converted there already
        if cache is not None:
            os.environ["HEADLENS_CACHE"] = str(cache)
        seen = []
        folder = gguf_folder(path, progress=lambda done, total: seen.append((done, total)))
        if seen:
            return folder, seen
    raise AssertionError(f"{path.name} was not converted in an empty cache")


@pytest.fixture(scope="module")
def local_ray():
    """Ray, shut down after the module's tests (which start a local instance)."""
    import ray

    yield ray
    ray.shutdown()


# --- tiers: each test marked by what it uses (pytest.ini names the markers) ------------------------

TIERS = {  # marker: the fixtures that put a test in it
    "browser": {"server", "browser", "page", "qk_page"},  # a Streamlit server and Chromium
    "load": {"load_server"},                                # many sessions on a server for a minute or more
    "app": {"app", "new_app", "warm"},                      # the app's pages in AppTest
    "bundled": {"smollm2", "converted", "gemma_cache", "prepared"},  # a bundled decoder LLM (SmolLM2, Gemma 3)
    "slow": {"induction_run", "local_ray"},                 # a training run to induction heads, a Ray cluster
}
BUNDLED = ("SmolLM2-135M", "gemma-3-270m", '"smollm2', '"gemma3')  # a test that opens one by name


COLD = "tests/test_app_cold.py"  # the test that makes the run's one preparation
# the restart reads that preparation back and opens pages over it: right after the cold server, whose pages left in
# the caches what they compute beside the preparation
RESTART = "tests/test_warm_up.py::test_a_restart_"
# then Gemma 3's first load, whose conversion the run's later loads of it read (``first_load``)
GEMMA_FIRST = "tests/test_gemma3_bundled.py"


# The modules each group holds, as the classification below finds them (it checks this table against them): the
# workers' scheduler, which sees test ids and no fixtures, reads it
GROUPS = {**dict.fromkeys([
    "tests/test_app_circuits.py", "tests/test_app_cold.py", "tests/test_app_effects.py", "tests/test_app_generate.py",
    "tests/test_app_head.py", "tests/test_app_llm.py", "tests/test_app_roles.py", "tests/test_app_tasks.py",
    "tests/test_app_value_norms.py", "tests/test_card_once.py", "tests/test_gemma3.py", "tests/test_gemma3_bundled.py",
    "tests/test_load_llm.py", "tests/test_warm_up.py"], "prepared"), **dict.fromkeys([
    "tests/test_browser.py", "tests/test_browser_card.py", "tests/test_browser_circuits.py",
    "tests/test_browser_hard.py", "tests/test_browser_layout.py", "tests/test_browser_llm.py",
    "tests/test_browser_long.py", "tests/test_browser_pruning.py", "tests/test_browser_qk.py",
    "tests/test_browser_train.py", "tests/test_browser_why.py"], "browser")}


def pytest_xdist_make_scheduler(config, log):
    """Whole groups to one worker: a module of ``GROUPS`` goes with its group, any other module as a unit of its
    own. (pytest-xdist's ``loadgroup`` names a test's group in its id, which pytest 9 no longer lets it change.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return GROUPS.get(module, module)

    return Groups(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark each test by the fixtures it uses (and a bundled decoder it names); a test with none of those marks
    is ``fast``: tiny models built here and the bundled MiniLM, the loop to run while working.

    The run's two workers (``-n 2``, ``pytest_xdist_make_scheduler``) each take whole modules: the modules whose
    tests read a bundled decoder's results in this process (AppTest, the results' caches) are one group, so one
    worker makes the run's one preparation and every test that reads it finds it in its caches. The tests of the
    shared server are another group, so that one server computes what they open; any other module goes anywhere.
    ``GROUPS`` must name what this finds."""
    groups = {}  # a module's file -> "prepared" or "browser"
    reads_results = {}  # a module's file -> whether it imports the app's results (read once a module)
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        marks = {mark for mark, fixtures in TIERS.items() if used & fixtures} | {m.name for m in item.iter_markers()
                                                                                 if m.name in TIERS}
        if "bundled" not in marks and hasattr(item, "function"):
            try:
                source = inspect.getsource(item.function)
            except (OSError, TypeError):
                source = ""
            if any(name in source for name in BUNDLED):
                marks.add("bundled")
        for mark in sorted(marks) or ["fast"]:
            item.add_marker(mark)
        module = item.nodeid.split("::")[0]
        if module not in reads_results:
            reads_results[module] = "app_pages" in (item.module and inspect.getsource(item.module) or "")
        if "prepared" in used or "bundled" in marks and "browser" not in marks and (
                "app" in marks or reads_results[module]):
            groups[module] = "prepared"
        elif "server" in used:
            groups.setdefault(module, "browser")
    modules = {item.nodeid.split("::")[0] for item in items}
    wrong = sorted(m for m in modules if groups.get(m) != GROUPS.get(m))
    if wrong:
        raise pytest.UsageError("conftest.GROUPS does not say where these modules' tests go: " + ", ".join(
            f"{m} (its tests: {groups.get(m) or 'no group'}; GROUPS: {GROUPS.get(m) or 'no group'})" for m in wrong))
    # the cold server first: it makes the run's one preparation, whose results every test after it finds in the
    # caches (as a server's sessions do) instead of computing them again; the restart second; Gemma 3's first load
    # third, whose conversion the group's later tests of Gemma 3 read
    items.sort(key=lambda item: 0 if item.nodeid.startswith(COLD) else 1 if item.nodeid.startswith(RESTART) else
               2 if item.nodeid.startswith(GEMMA_FIRST) else 3)



# --- the app -----------------------------------------------------------------------------------

def decode(arr) -> "np.ndarray":
    """A plotly array from a figure's JSON: a plain list, or {"dtype", "bdata", "shape"}."""
    import base64

    import numpy as np

    if isinstance(arr, dict) and "bdata" in arr:
        out = np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"]))
        shape = arr.get("shape")
        if isinstance(shape, str):
            shape = [int(x) for x in shape.split(",")]
        return out.reshape(shape) if shape else out
    return np.asarray(arr, dtype=float)


def shown(markdown: str) -> str:
    """What a person reads in an alert whose text went through ``plain()``: escapes and joiners gone."""
    import re

    return re.sub(r"\\(.)", r"\1", markdown).replace("\u2060", "")


def figures(at) -> list[dict]:
    """Every plotly figure on the page, as the JSON the browser receives."""
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def block_max(w, cells: int = 128):
    """What a heatmap draws of ``w`` (n x n): the largest weight in each block of ceil(n / cells) tokens."""
    import numpy as np

    n = w.shape[0]
    step = -(-n // cells)
    padded = np.full((-(-n // step) * step,) * 2, -np.inf, dtype=w.dtype)
    padded[:n, :n] = w
    m = padded.shape[0] // step
    return padded.reshape(m, step, m, step).max(axis=(1, 3))


def title_text(fig: dict) -> str:
    """A figure's title on one line: a long title is drawn as lines joined by <br> where spaces were."""
    return fig["layout"]["title"]["text"].replace("<br>", " ")


def heatmaps(fig: dict) -> list[dict]:
    return [t for t in fig["data"] if t["type"] == "heatmap"]


def tick_text(fig: dict, axis: str = "xaxis") -> list[str]:
    """The label each category of an axis shows (plotly draws as many of them as fit); in a grid,
    of the first such axis that draws labels (the heads share their axes)."""
    ax = next(a for k, a in sorted(fig["layout"].items(), key=lambda kv: len(kv[0]))
              if k.startswith(axis) and "labelalias" in a)
    return [ax["labelalias"][cat] for cat in ax["categoryarray"]]


class _RecordingMediaManager:
    """Remembers the media manager an AppTest run creates, to read back what a download serves."""

    last = None

    @classmethod
    def install(cls, monkeypatch):
        import streamlit.testing.v1.app_test as app_test
        from streamlit.runtime.media_file_manager import MediaFileManager

        class Recording(MediaFileManager):
            def __init__(self, storage):
                super().__init__(storage)
                cls.last = self

        monkeypatch.setattr(app_test, "MediaFileManager", Recording)


def downloads(at) -> dict[str, bytes]:
    """label -> the bytes each download button on the page would send."""
    mgr = _RecordingMediaManager.last
    out = {}
    for button in at.get("download_button"):
        p = button.proto
        url = mgr.execute_deferred(p.deferred_file_id) if p.deferred_file_id else p.url
        out[p.label] = mgr._storage.get_file(url.rsplit("/", 1)[-1]).content
    return out


@functools.cache
def components_scanned_once() -> None:
    """Each new AppTest reads the metadata of every installed package for Streamlit components (0.2 to 1 s on two
    cores, a few hundred times a run); the packages are the same all run, so this process reads them once and each
    AppTest is given a copy of what was found."""
    from streamlit.components.v2 import manifest_scanner

    found = tuple(manifest_scanner.scan_component_manifests())
    manifest_scanner.scan_component_manifests = lambda max_workers=None: list(found)


@pytest.fixture
def new_app(monkeypatch):
    """``new_app(query_params=None, page=None)`` -> a fresh session of the app after its first run."""
    from streamlit.testing.v1 import AppTest

    _RecordingMediaManager.install(monkeypatch)
    components_scanned_once()

    def make(query_params: dict | None = None, page: str | None = None, timeout: float = 120):
        """Open ``page`` with ``query_params`` as a shared link does, each run given ``timeout`` seconds. (Across a
        page switch the browser carries bound values in the URL, which AppTest does not simulate.)"""
        at = AppTest.from_file(ROOT / "headlens.py", default_timeout=timeout)
        if page:
            at.switch_page(page)
        for k, v in (query_params or {}).items():
            at.query_params[k] = v
        at.run()
        assert not at.exception, at.exception
        return at

    return make


@pytest.fixture
def app(new_app):
    """A fresh session of the app on its default page, Explore."""
    return new_app()


# --- the app in a real browser (one server and one Chromium for every browser test) ----------------

@pytest.fixture(scope="session")
def server():
    from harness.browser import streamlit_server

    with streamlit_server() as (url, proc):
        yield url


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """SmolLM2's preparation from nothing into one results folder, once per run (``tests.prepared``): started for
    the first test given it, which finds a cold server; ``prepared.finished()`` for the folder, filled."""
    from tests.prepared import Preparation, cleared

    yield Preparation(tmp_path_factory.mktemp("results")).start()
    cleared()


@pytest.fixture
def load_server():
    """``load_server(env=None)``: a server of its own for a load run, as a context manager of ``(url, process)``."""
    from harness.browser import streamlit_server

    return streamlit_server


@pytest.fixture(scope="session")
def browser():
    from harness.browser import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, server):
    """A new browser session on Explore; a dialog opening (an alert from injected markup) fails the test."""
    from harness.browser import PLOT

    context = browser.new_context(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
    page = context.new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs
    page.goto(server + "/")
    page.wait_for_selector(PLOT, timeout=120_000)
    yield page
    assert not dialogs, f"a dialog opened: {dialogs}"
    context.close()
