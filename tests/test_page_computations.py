"""What the pages show, computed below them: head names and masks, the pruning point's comparison,
importance by role, the nearest heads, ranked sentences, and the architectures the engine finds."""
import numpy as np
import pandas as pd
import pytest

from analysis import head_mask, heads_marked, similar_heads
from analysis.pruning.importance import importance_by_role, most_important_with_a_later_layer
from analysis.pruning.curves import point_comparison
from analysis.roles.labels import strongest
from models import HeadLensError, head_label, load_model
from models.stacks import architectures, for_model_type
from models.stacks.bert import BertEncoder
from models.stacks.decoder import Decoder
from models.stacks.llama import Llama
from models.stacks.gemma3 import Gemma3


class Sizes:
    n_layers, n_heads = 2, 3


def test_a_head_is_written_one_way():
    assert head_label(3, 11) == "L3 H11"
    assert head_label(np.int64(0), np.int64(2)) == "L0 H2"  # as frames hold them


def test_masks_and_marks_name_exactly_the_heads_given():
    marked = heads_marked(2, 3, [(0, 2), (1, 0)])
    assert marked.tolist() == [[False, False, True], [True, False, False]]
    mask = head_mask(Sizes, [(0, 2), (1, 0)])
    assert mask.dtype == np.float32 and mask.tolist() == [[1, 1, 0], [0, 1, 1]]
    assert head_mask(Sizes, []) is None


def test_the_pruning_point_compares_each_order_with_its_own_full_model():
    summary = pd.DataFrame({
        "order": ["importance", "importance", "random", "random"],
        "n_pruned": [0, 7, 0, 7],
        "fidelity": [1.0, 0.95, 1.0, 0.80],
        "agreement": [1.0, 0.9, 1.0, 0.6],
        "forward_s": [2.0, 1.5, 4.0, 3.0],
    })
    point = point_comparison(summary, 7).set_index("order")
    assert point.loc["importance", "fidelity"] == 0.95 and point.loc["random", "agreement"] == 0.6
    assert point.loc["importance", "speed"] == pytest.approx(0.75)   # 1.5 s of 2.0 s
    assert point.loc["random", "speed"] == pytest.approx(0.75)       # 3.0 s of its own 4.0 s
    assert list(point.columns) == ["fidelity", "agreement", "forward_s", "speed"]


def test_importance_by_role_averages_each_role_most_important_first():
    frame = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "importance": [0.1, 0.3, 0.8, 0.0]})
    table = importance_by_role(frame, ["broad", "broad", "previous token", "broad"])
    assert table["role"].tolist() == ["previous token", "broad"]
    assert table["mean"].tolist() == pytest.approx([0.8, 0.4 / 3])
    assert table["max"].tolist() == [0.8, 0.3] and table["heads"].tolist() == [1, 3]


def test_the_head_switched_off_first_has_a_layer_after_it():
    frame = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "importance": [0.1, 0.3, 0.9, 0.0]})
    assert most_important_with_a_later_layer(frame) == (0, 1)  # L1 H0 is larger but has no layer after it
    one_layer = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "importance": [0.7, 0.2]})
    assert most_important_with_a_later_layer(one_layer) == (0, 0)


def test_similar_heads_are_the_nearest_row_entries_without_the_head_itself():
    rng = np.random.default_rng(0)
    a = rng.random((6, 6))
    similarity = (a + a.T) / 2
    np.fill_diagonal(similarity, 0)
    near = similar_heads(similarity, 1, 0, n_heads=3, k=3)       # head index 3
    want = [i for i in np.argsort(similarity[3]) if i != 3][:3]
    assert list(zip(near["layer"], near["head"])) == [divmod(i, 3) for i in want]
    np.testing.assert_allclose(near["divergence"], similarity[3, want])


def test_strongest_puts_nan_last_either_way():
    values = np.array([0.2, np.nan, 0.9, 0.5])
    assert strongest(values).tolist() == [2, 3, 0, 1]
    assert strongest(values, higher=False).tolist() == [0, 3, 2, 1]


def test_the_engine_finds_its_architectures_by_model_type(tmp_path):
    assert for_model_type("bert") is BertEncoder and for_model_type("headlens_decoder") is Decoder
    assert for_model_type("bloom") is None and for_model_type("gpt2").description == "GPT-2 decoders"
    assert {BertEncoder, Decoder, Llama} <= set(architectures()) and for_model_type("qwen2") is Llama
    (tmp_path / "config.json").write_text('{"model_type": "bloom", "n_layer": 2}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert for_model_type("gemma3_text") is Gemma3 and for_model_type("tracr").__name__ == "TracrStack"
    with pytest.raises(HeadLensError, match=r"implements BERT encoders, RoBERTa encoders, DistilBERT encoders, "
                                            r"transformers compiled from RASP programs, the decoders HeadLens trains, Gemma 2 decoders, Gemma 3 decoders \(text\), "
                                            r"GPT-2 decoders, GPT-NeoX decoders \(Pythia\), Llama-family decoders "
                                            r"\(Llama, Mistral, Qwen2\), OLMo-2 decoders, Phi-3 decoders and Qwen3 "
                                            r"decoders; this model is 'bloom'"):
        load_model(tmp_path, backend="scratch")
