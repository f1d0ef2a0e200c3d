"""A head's card and the atlas on a tiny decoder with a hand-set previous-token head and a copy of it, and on
MiniLM: each figure against the function that computes it on its own page, top examples against ``attend``,
what a head writes against ``head_results``, and "heads like it" ranking the copy first."""
import re

import numpy as np
import pandas as pd
import pytest
import torch

from analysis import head_detector, head_importance, measure_heads
from analysis.cards.atlas import atlas_frame, head_map, heads_like
from analysis.cards.build import card_parts, head_card
from analysis.roles.detector import LENGTH, SENTENCES, SEQUENCES, detector_labels
from analysis.cards.card import corpus_writes
from analysis.effects.vocabulary import copying_scores
from models import EMBEDDING, HeadLensError, load_model
from analysis.effects import parts as P
from models.corpus import CORPUS, corpus_sample
from models.stacks.decoder import Decoder, DecoderConfig
from models.vocab import word_tokenizer

TEXTS = list(CORPUS[:24])
POSITIONS = 64


@pytest.fixture(scope="module")
def hand_set(tmp_path_factory):
    """A two-layer decoder whose layer 0 head 0 attends to the previous token by hand (positions one-hot, its keys
    shifted one place), head 1 a copy of head 0's weights, layer 1 random."""
    words = sorted({w for text in CORPUS for w in re.findall(r"\w+|[^\w\s]", text.lower())})
    tokenizer = word_tokenizer(words, lowercase=True, max_len=POSITIONS)
    E, Dh = 2 * POSITIONS, POSITIONS
    stack = Decoder.untrained(DecoderConfig(vocab_size=len(tokenizer), max_len=POSITIONS, n_layers=2, n_heads=2,
                                            d_model=E), seed=1)
    with torch.no_grad():
        stack.tok_emb.weight[:, :POSITIONS] = 0               # tokens live in the upper half, positions in the lower
        stack.pos_emb.weight.zero_()
        stack.pos_emb.weight[:, :POSITIONS] = 4 * torch.eye(POSITIONS)
        attn = stack.layers[0].attn
        w = attn.in_proj_weight                                # (3E, E): queries, keys, values
        shift = torch.diag(torch.ones(POSITIONS - 1), -1)      # key j -> e_(j+1): query i meets key i - 1
        w[:E].zero_()
        w[E:2 * E].zero_()
        w[:Dh, :POSITIONS] = 3 * torch.eye(POSITIONS)
        w[E:E + Dh, :POSITIONS] = 3 * shift
        for part in range(3):                                  # head 1: a copy of head 0
            w[part * E + Dh:part * E + 2 * Dh] = w[part * E:part * E + Dh]
        attn.out_proj.weight[:, Dh:] = attn.out_proj.weight[:, :Dh]
    folder = tmp_path_factory.mktemp("hand-set")
    stack.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model = load_model(folder, backend="scratch")
    return model, card_parts(model, sentences=TEXTS, pairs={}, task=None)


def test_a_hand_set_previous_token_head_is_named_so_and_its_examples_are_previous_token_pairs(hand_set):
    model, parts = hand_set
    card = head_card(model, 0, 0, parts=parts)
    assert card.role == "previous token" and card.detector_role == "previous token"
    assert len(card.top) == 10 and (card.top["key"] == card.top["query"] - 1).all()
    for r in card.top.itertuples():  # each weight is attend's on that sentence
        assert r.text == TEXTS[r.sentence]
        assert r.weight == pytest.approx(float(model.attend(r.text).weights[0, 0, r.query, r.key]), abs=1e-6)
    assert "previous token" in card.summary() and "L0 H0" in card.summary()


def test_a_head_no_repeat_shows_opens_on_its_strongest_sentence(hand_set):
    """A decoder's previous-token head has no repeat to show: its card shows it on the corpus sentence where it is
    most concentrated, and says which tokens and how much."""
    model, parts = hand_set
    card = head_card(model, 0, 0, parts=parts)
    text, why = card.showcase("Which do you like better, coffee or tea?")
    best = card.top.iloc[0]
    assert text == TEXTS[best["sentence"]] and f"“{best['query_token']}” → “{best['key_token']}”" in why
    assert f"{best['weight']:.0%}" in why


def test_heads_like_it_rank_a_copy_of_its_weights_first(hand_set):
    model, parts = hand_set
    like = head_card(model, 0, 0, parts=parts).like
    assert (like.iloc[0]["layer"], like.iloc[0]["head"]) == (0, 1)
    assert like.iloc[0]["distance"] == pytest.approx(0.0, abs=1e-6) and like.iloc[1]["distance"] > 0.1
    assert (0, 0) not in set(zip(like["layer"], like["head"]))


def test_every_figure_on_the_card_is_its_own_pages_function(hand_set):
    model, parts = hand_set
    layer, head = 1, 1
    card = head_card(model, layer, head, parts=parts)
    profile = measure_heads(model.attend(TEXTS)).frame().set_index(["layer", "head"]).loc[(layer, head)]
    for column in ("entropy", "distance", "cls", "prev_token", "label"):
        assert card.measures[column] == pytest.approx(profile[column]) if column != "label" else \
            card.measures[column] == profile[column]
    detected = head_detector(model, sentences=corpus_sample(SENTENCES), n_sequences=SEQUENCES, length=LENGTH)
    row = detected.assign(label=detector_labels(detected)).set_index(["layer", "head"]).loc[(layer, head)]
    assert card.detector["induction"] == pytest.approx(row["induction"])
    assert card.detector_role == row["label"]
    copying = copying_scores(model).set_index(["layer", "head"]).loc[(layer, head)]
    assert card.copying["copying"] == pytest.approx(copying["copying"])
    imp = head_importance(model, corpus_sample(24), method="gradient", ablation="zero", measure="loss")
    assert card.importance["importance"] == pytest.approx(imp.set_index(["layer", "head"]).loc[(layer, head), "importance"])
    assert card.importance["rank"] == 1 + int((imp["importance"] > card.importance["importance"]).sum())


def test_what_a_head_writes_is_the_norm_of_its_result_at_that_token(hand_set):
    model, parts = hand_set
    writes = corpus_writes(model, TEXTS[:5], batch_size=2)  # a padded batch gives each sentence its own values
    for s, text in enumerate(TEXTS[:5]):
        ids = torch.tensor(model.tokenizer(text)["input_ids"])
        t = P.trace(model, ids)
        norms = torch.stack([P.head_results(model.stack, t, q).norm(dim=-1) for q in range(len(ids))], -1)
        np.testing.assert_allclose(writes.norm[s], norms.max(-1).values.numpy(), rtol=1e-5)
        np.testing.assert_array_equal(writes.query[s], norms.argmax(-1).numpy())
    np.testing.assert_allclose(parts.writes.norm[:5], writes.norm, rtol=1e-5)


def test_the_atlas_points_are_the_role_grid_and_the_detectors(hand_set):
    _, parts = hand_set
    frame = atlas_frame(parts)
    merged = frame.merge(parts.profile, on=["layer", "head"], suffixes=("", "_grid"))
    assert (merged["role"] == merged["label"]).all()
    np.testing.assert_allclose(merged["entropy"], merged["entropy_grid"])
    merged = frame.merge(parts.detector, on=["layer", "head"], suffixes=("", "_detector"))
    np.testing.assert_allclose(merged["induction"], merged["induction_detector"])
    assert (merged["detector_role"] == merged["label"]).all()
    np.testing.assert_allclose(frame["peak"], np.nanmean(parts.peaks.weight, axis=0).reshape(-1))


def test_a_map_of_two_measures_keeps_every_distance_between_heads(hand_set):
    _, parts = hand_set
    frame = atlas_frame(parts)
    mapped = head_map(frame, ["entropy", "distance"])
    z = frame[["entropy", "distance"]].to_numpy()
    z = (z - z.mean(0)) / z.std(0)
    xy = mapped[["x", "y"]].to_numpy()
    far = lambda a: np.linalg.norm(a[:, None] - a[None], axis=-1)  # noqa: E731
    np.testing.assert_allclose(far(xy), far(z), atol=1e-9)
    assert sum(mapped.attrs["explained"]) == pytest.approx(1.0)


def test_an_encoders_card_reads_its_seed_foci_and_a_head_it_lacks_gets_a_sentence(hf_model):
    parts = card_parts(hf_model, sentences=TEXTS)
    card = head_card(hf_model, 2, 5, parts=parts)
    assert card.offers == {EMBEDDING} and card.detector is None and card.writes is None
    from analysis.defaults import ENCODER_PAIRS
    from analysis.effects import patch_heads

    pair = next(iter(ENCODER_PAIRS.values()))  # an encoder's pairs: the seed sentence with a focus changed
    want = patch_heads(hf_model, pair.clean, pair.corrupted, pair.answer, pair.distractor).set_index(["layer", "head"])
    assert card.pairs.iloc[0]["recovered"] == pytest.approx(want.loc[(2, 5), "recovered"], abs=1e-9)
    profile = measure_heads(hf_model.attend(TEXTS)).frame().set_index(["layer", "head"]).loc[(2, 5)]
    assert card.measures["object_lift_lo"] == pytest.approx(profile["object_lift_lo"])
    first = card.top.iloc[0]
    assert first["weight"] == pytest.approx(float(hf_model.attend(first["text"]).weights[2, 5, first["query"],
                                                                                         first["key"]]), abs=1e-6)
    assert not hf_model.attend(first["text"]).special[[first["query"], first["key"]]].any()
    with pytest.raises(HeadLensError, match="6 layers of 12 heads"):
        head_card(hf_model, 6, 0, parts=parts)


def test_heads_like_it_across_models_use_the_measures_both_have(hand_set, hf_model):
    _, parts = hand_set
    theirs = atlas_frame(card_parts(hf_model, sentences=TEXTS))
    like = heads_like(atlas_frame(parts), 0, 0, {"MiniLM": theirs}, model="tiny")
    assert list(like["model"].unique()) == ["tiny", "MiniLM"] and len(like) == 3 + 5  # every other tiny head
    assert "induction" not in like.attrs["columns"] and "entropy" in like.attrs["columns"]
    assert isinstance(like, pd.DataFrame)


def test_a_snippet_is_the_sentence_as_written_with_its_query_and_key_marked(hf_model):
    """Each token's own characters of the text, a space only where the text has one, the special tokens named;
    a word's pieces join again, a query on itself carries both marks, and a long sentence is cut around both."""
    from analysis.cards.card import snippet

    att = hf_model.attend("The ambassador's unbelievably long speech.")
    pieces = att.tokens  # [CLS] the ambassador ' s un ##bel ##ie ##va ##bly long speech . [SEP]
    query, key = pieces.index("speech"), pieces.index("ambassador")
    assert snippet(att, query, key) == "[CLS] The [ambassador]'s unbelievably long «speech». [SEP]"
    inside = pieces.index("un") + 1
    assert snippet(att, inside, inside, width=20) == f"[CLS] The ambassador's un«[{pieces[inside][2:]}]»" + \
        "".join(p[2:] for p in pieces[inside + 1:pieces.index("long")]) + " long speech. [SEP]"
    assert snippet(att, query, None, width=1) == "… long «speech». …"
