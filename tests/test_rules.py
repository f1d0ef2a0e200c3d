"""Rules that say where a head should attend (``analysis.roles.rules``): each rule's keys on hand-worked sentences, in
all-MiniLM-L6-v2's tokens and a tiny GPT-2's, against the tokenizer's own word ids and spaCy's own parse."""
import re

import numpy as np
import pytest

from analysis.roles.measure import load_spacy
from analysis.roles.rules import RULES, Reading, Rule, rule_named
from models import HeadLensError, load_model
from tests.conftest import build_words_gpt2

CAT = "The cat sat on the mat."
# [CLS] the cat sat on the mat . [SEP]
#   0    1   2   3  4   5   6  7   8
WORDS = [None, 1, 2, 3, 4, 5, 6, 7, None]  # each token's word in the hand-worked parse below (0 is unused)


def by_word(keys_of_word: dict[int, list[int]]) -> list[list[int]]:
    """The keys of each token of CAT from the keys of its word (words numbered as in WORDS), specials none."""
    return [[] if w is None else keys_of_word.get(w, []) for w in WORDS]


def test_the_tokens_are_the_tokenizers(hf_model):
    reading = Reading.read(hf_model, CAT)
    assert reading.tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert reading.special.tolist() == [True] + [False] * 7 + [True] and not reading.causal
    assert reading.special.dtype == bool  # read as a mask: ~special, special[keys]


def test_a_text_past_the_models_length_is_read_as_attend_cuts_it(hf_model):
    text = " ".join(["cat", "sat"] * 400)  # 800 words, one token each
    assert len(Reading.read(hf_model, text)) == hf_model.max_tokens == len(hf_model.attend(text).tokens) == 512
    keys = rule_named("previous token").keys(hf_model, text)
    assert len(keys) == 512 and keys[-1] == [510]


def test_a_decoders_text_is_cut_at_its_positions_not_its_tokenizers_length(tiny):
    gpt2 = load_model(tiny("gpt2"))  # 64 positions; its tokenizer's own limit is far larger
    text = " ".join(["The cat sat on the mat."] * 30)
    assert gpt2.tokenizer.model_max_length > 10_000 and len(gpt2.tokenizer(text)["input_ids"]) > 64
    assert len(Reading.read(gpt2, text)) == gpt2.max_tokens == len(gpt2.attend(text).tokens) == 64


def test_a_word_that_holds_no_token_is_named_by_none(hf_model):
    """spaCy splits "gonna" into "gon" and "na"; WordPiece keeps one token, whose first character is in "gon":
    "go"'s auxiliary "na" holds no token, so go's auxiliaries name none; gon's are "'m" ("'", "m")."""
    # [CLS] i ' m gonna go . [SEP]
    assert rule_named("dependents: aux").keys(hf_model, "I'm gonna go.") == [[], [], [], [], [2, 3], [], [], []]


def test_a_rule_of_ones_own_is_kept_to_the_text_and_before_a_causal_query(hf_model, tiny):
    mine = Rule("mine", "positional", "attends to anywhere", lambda r: [[-1, q, q + 1, len(r), len(r) + 3]
                                                                        for q in range(len(r))])
    n = len(Reading.read(hf_model, CAT))
    assert mine.keys(hf_model, CAT) == [[q, q + 1] if q + 1 < n else [q] for q in range(n)]
    gpt2 = load_model(tiny("gpt2"))
    assert mine.keys(gpt2, "The cat sat.") == [[q] for q in range(len(Reading.read(gpt2, "The cat sat.")))]


@pytest.mark.parametrize("name, expected", [
    ("previous token", [[], [0], [1], [2], [3], [4], [5], [6], [7]]),
    ("next token", [[1], [2], [3], [4], [5], [6], [7], [8], []]),
    ("itself", [[q] for q in range(9)]),
    ("2 back", [[], [], [0], [1], [2], [3], [4], [5], [6]]),
    ("3 back", [[], [], [], [0], [1], [2], [3], [4], [5]]),
    ("first token", [[0]] * 9),
    ("last token", [[8]] * 9),
    ("duplicate", [[], [], [], [], [], [1], [], [], []]),              # "the" again at 5
    ("induction", [[], [], [], [], [], [2], [], [], []]),              # what followed the first "the": "cat"
    ("punctuation", [[]] * 8 + [[7]]),                                 # only [SEP] comes after the full stop
    ("final mark", by_word({w: [7] for w in range(1, 8)})),
    ("sentence start", by_word({w: [1] for w in range(1, 8)})),
    # The <-det- cat <-nsubj- sat (root) -prep-> on -pobj-> mat -det-> the; sat -punct-> .
    ("dependency head", by_word({1: [2], 2: [3], 4: [3], 5: [6], 6: [4], 7: [3]})),
    ("dependents: det", by_word({2: [1], 6: [5]})),
    ("dependents: nsubj", by_word({3: [2]})),
    ("dependents: prep", by_word({3: [4]})),
    ("dependents: pobj", by_word({4: [6]})),
    ("dependents: dobj", by_word({})),
    ("root verb", by_word({w: [3] for w in range(1, 8)})),
    ("focus: object", by_word({w: [2, 6] for w in range(1, 8)})),      # the nouns
    ("focus: relation", by_word({w: [3] for w in range(1, 8)})),       # the verb
    ("focus: sentiment", by_word({})),
    ("previous token or first token", [[0], [0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7]]),
])
def test_each_rule_on_a_hand_worked_sentence(hf_model, name, expected):
    assert rule_named(name).keys(hf_model, CAT) == expected


TWO = 'Embeddings help. She said "no."'
PASSIVE = "The dog was seen by Tom."  # [CLS] the dog was seen by tom . [SEP]: "dog" is spaCy's nsubjpass
# [CLS] em ##bed ##ding ##s help .  she said "  no  .  "  [SEP]     spaCy: two sentences, words 0-2 and 3-8
#   0    1    2     3    4    5   6   7    8   9  10  11 12   13


@pytest.mark.parametrize("text, name, expected", [
    (TWO, "final mark", [[]] + [[6]] * 6 + [[11]] * 6 + [[]]),       # the full stop before the closing quote
    (TWO, "sentence start", [[]] + [[1]] * 6 + [[7]] * 6 + [[]]),    # each sentence's first piece, "em" alone
    ("The cat sat", "final mark", [[]] * 5),                          # no final mark
    ('?"', "final mark", [[], [1], [1], []]),                         # the mark is the sentence's first word
    ('"', "final mark", [[]] * 3),                                    # a sentence of a closing quote alone
    ("The cat sat", "sentence start", [[], [1], [1], [1], []]),
    (PASSIVE, "sentence subject", [[]] + [[2]] * 7 + [[]]),           # a passive sentence's subject, "dog"
])
def test_sentence_rules_on_two_sentences_a_closing_quote_and_a_word_in_pieces(hf_model, text, name, expected):
    assert rule_named(name).keys(hf_model, text) == expected


def test_a_words_pieces_share_its_keys_and_a_rule_names_every_piece(hf_model):
    """A word in several pieces: every piece of the verb names every piece of its object, as the tokenizer groups
    them; spaCy's parse says which word is the object."""
    text = "She likes embeddings."
    enc = hf_model.tokenizer(text)
    tokens = hf_model.tokenizer.convert_ids_to_tokens(enc["input_ids"])
    words = enc.word_ids()
    assert tokens.count("likes") == 1 and len([t for t in tokens if t.startswith("##")]) >= 1, tokens
    doc = load_spacy()(text)
    (obj,) = [w for w in doc if w.dep_ == "dobj"]
    assert obj.text == "embeddings" and obj.head.text == "likes"
    pieces = {i for i, w in enumerate(words) if w == enc.char_to_word(obj.idx)}
    verb = tokens.index("likes")
    keys = rule_named("dependents: dobj").keys(hf_model, text)
    assert keys[verb] == sorted(pieces) and len(pieces) > 1
    assert all(keys[i] == [] for i in range(len(tokens)) if i != verb)
    heads = rule_named("dependency head").keys(hf_model, text)
    assert all(heads[i] == [verb] for i in pieces)  # each piece of the object: its word's head


def test_every_rules_keys_in_a_causal_model_come_at_or_before_the_query(tiny):
    model = load_model(tiny("gpt2"))
    text = "The cat sat on the mat. The cat ran."
    reading = Reading.read(model, text)
    assert reading.causal and not reading.special.any()
    n = len(reading)
    assert rule_named("next token").keys(model, text) == [[]] * n
    assert rule_named("last token").keys(model, text) == [[]] * (n - 1) + [[n - 1]]
    for name, rule in RULES.items():
        keys = rule.keys(model, text)
        assert len(keys) == n and all(k <= q for q, ks in enumerate(keys) for k in ks), name


# --- a causal tokenizer whose words are whole tokens: each rule hand-worked where a key after the query would show ---

REPEAT = "so, dog cat dog dog cat."
# so  ,  dog  cat  dog  dog  cat  .      (no special token: GPT-2's tokenizer adds none)
# 0   1   2    3    4    5    6   7
CAUSAL_CAT = "The cat sat on the mat."
# The cat sat on the mat .
#  0   1   2   3  4   5  6
PROSE = "Tom saw a dog. It saw Tom."
# Tom saw a dog .  It saw Tom .       spaCy: two sentences, 0-4 and 5-8; PROPN VERB DET NOUN PUNCT PRON VERB PROPN
#  0   1  2  3  4   5  6   7  8       PUNCT; Tom -nsubj-> saw (root); It -nsubj-> saw (root)


@pytest.fixture(scope="module")
def words_gpt2(tmp_path_factory):
    """A tiny random GPT-2 whose tokenizer holds each word of the two sentences above whole."""
    return load_model(build_words_gpt2(tmp_path_factory.mktemp("words-gpt2"), [REPEAT, CAUSAL_CAT, PROSE]))


def test_the_causal_tokens_are_whole_words(words_gpt2):
    assert words_gpt2.tokenizer.tokenize(REPEAT) == ["so", ",", "Ġdog", "Ġcat", "Ġdog", "Ġdog", "Ġcat", "."]
    assert words_gpt2.tokenizer.tokenize(CAUSAL_CAT) == ["The", "Ġcat", "Ġsat", "Ġon", "Ġthe", "Ġmat", "."]
    reading = Reading.read(words_gpt2, REPEAT)
    assert reading.causal and not reading.special.any() and len(reading) == 8


@pytest.mark.parametrize("name, expected", [
    ("previous token", [[], [0], [1], [2], [3], [4], [5], [6]]),
    ("next token", [[]] * 8),                                            # every next token lies after its query
    ("itself", [[q] for q in range(8)]),
    ("2 back", [[], [], [0], [1], [2], [3], [4], [5]]),
    ("3 back", [[], [], [], [0], [1], [2], [3], [4]]),
    ("first token", [[0]] * 8),
    ("last token", [[]] * 7 + [[7]]),
    ("duplicate", [[], [], [], [], [2], [2, 4], [3], []]),               # the second dog's copy 4 is an earlier key
    # what followed an earlier copy: the dog at 5 names 3 (after the dog at 2), never 5 itself (after the dog at 4)
    ("induction", [[], [], [], [], [3], [3], [4], []]),
    ("punctuation", [[], [], [1], [1], [1], [1], [1], [1]]),            # the comma, until the full stop's query
    ("previous token or itself", [[0], [0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7]]),
    ("duplicate or induction", [[], [], [], [], [2, 3], [2, 3, 4], [3, 4], []]),
])
def test_each_lexical_and_positional_rule_on_a_hand_worked_causal_sentence(words_gpt2, name, expected):
    assert rule_named(name).keys(words_gpt2, REPEAT) == expected


@pytest.mark.parametrize("name, expected", [
    # The <-det- cat <-nsubj- sat (root) -prep-> on -pobj-> mat -det-> the; sat -punct-> . (keys after the query go)
    ("dependency head", [[], [], [], [2], [], [3], [2]]),
    ("dependents: det", [[], [0], [], [], [], [4], []]),
    ("dependents: nsubj", [[], [], [1], [], [], [], []]),
    ("dependents: prep", [[]] * 7),                                        # sat's "on" comes after it
    ("dependents: pobj", [[]] * 7),
    ("final mark", [[]] * 6 + [[6]]),
    ("sentence start", [[0]] * 7),
    ("root verb", [[], [], [2], [2], [2], [2], [2]]),
    ("focus: object", [[], [1], [1], [1], [1], [1, 5], [1, 5]]),
    ("focus: relation", [[], [], [2], [2], [2], [2], [2]]),
    ("previous token or first token", [[0], [0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5]]),
])
def test_each_syntactic_rule_on_a_hand_worked_causal_sentence(words_gpt2, name, expected):
    assert rule_named(name).keys(words_gpt2, CAUSAL_CAT) == expected


def test_an_attentions_reading_is_the_models(scratch_model):
    att = scratch_model.attend(CAT)
    for name in ("previous token", "dependency head", "focus: object", "induction"):
        assert rule_named(name).keys_of(Reading.of(att)) == rule_named(name).keys(scratch_model, CAT), name


FAMILIES = {"positional": ["previous token", "next token", "itself", "2 back", "3 back", "first token", "last token"],
            "lexical": ["duplicate", "induction", "punctuation", "final mark", "sentence start"],
            "syntactic": ["dependency head", "root verb", *(f"dependents: {rel}" for rel in (
                "nsubj", "dobj", "det", "amod", "prep", "pobj", "aux", "advmod", "compound", "conj", "poss"))],
            "focus": ["focus: sentence_type", "focus: object", "focus: relation", "focus: sentiment"]}
FAMILIES["positional"] += ["recent 1", "recent 2", "recent 4", "recent 8", "second token"]
FAMILIES["lexical"] += ["first 'the'", "first 'a'", "first 'and'", "first 'of'", "first 'to'", "first comma",
                        "first full stop"]
FAMILIES["syntactic"] += ["nearest noun", "nearest verb", "nearest proper noun", "nearest pronoun", "sentence subject"]
FAMILIES["lexical"] += ["previous sentence end", "same word", "word induction"]


def test_each_rule_has_its_family_and_a_sentence_that_follows_a_heads_name():
    """The families by hand; each sentence is lower-case prose that reads after "L5 H11 " ([CLS] and [SEP] as the
    tokenizer writes them), names a relation's tag, and differs from every other rule's."""
    assert {name: rule.family for name, rule in RULES.items()} == {
        name: family for family, names in FAMILIES.items() for name in names}
    for name, rule in RULES.items():
        assert rule.name == name and rule_named(name) is rule
        prose = rule.sentence.replace("[CLS]", "").replace("[SEP]", "")
        assert re.fullmatch(r"attends (to|from) [a-z0-9 ,'()-]+", prose), rule.sentence
        if name.startswith("dependents: "):
            assert rule.sentence.endswith(f"({name.split(': ')[1]})")
    assert len({rule.sentence for rule in RULES.values()}) == len(RULES)


def test_a_union_says_both_and_an_unknown_name_gets_a_sentence():
    rule = rule_named("previous token or first token")
    assert rule.name == "previous token or first token"
    assert rule.sentence.startswith("attends to the previous token, or to the first token")
    assert rule.family == "positional"
    assert rule_named("induction or first token").family == "lexical or positional"
    with pytest.raises(HeadLensError, match="no rule named 'previos token'"):
        rule_named("previos token")
    three = rule_named("previous token or itself or same word")  # a program's three rules
    assert three.family == "positional or lexical"
    assert three.sentence == "attends to the previous token, or to itself, or to earlier copies of its word"
    # a union of two families joined with a third: each family named once
    assert rule_named("induction or first token or same word").family == "lexical or positional"
    with pytest.raises(HeadLensError, match="no rule named"):
        rule_named("previous token or itself or first token or 2 back")
    with pytest.raises(HeadLensError, match="no rule named 'bogus'. Rules: previous token, next token, itself, "):
        rule_named("previous token or bogus")


@pytest.mark.parametrize("name, expected", [
    ("recent 1", [list(range(max(0, q - 4), q)) for q in range(9)]),     # the four tokens before the query
    ("recent 2", [list(range(max(0, q - 8), q)) for q in range(9)]),
    ("nearest noun", [[]] * 4 + [[3]] * 5),                                # "dog", from the word after it on
    ("nearest verb", [[], []] + [[1]] * 5 + [[6]] * 2),                   # the second "saw" names the first
    ("nearest proper noun", [[]] + [[0]] * 7 + [[7]]),
    ("nearest pronoun", [[]] * 6 + [[5]] * 3),
    ("previous sentence end", [[]] * 5 + [[4]] * 4),
    ("same word", [[]] * 6 + [[1], [0], []]),                              # a full stop is not a word again
    ("word induction", [[]] * 6 + [[2], [1], []]),                         # what followed "saw" and "Tom" before
    ("sentence subject", [[0]] * 5 + [[5]] * 4),
    ("second token", [[]] + [[1]] * 8),
    ("first full stop", [[]] * 5 + [[4]] * 4),                             # from the word after it on
    ("first 'a'", [[]] * 3 + [[2]] * 6),
    ("first 'the'", [[]] * 9),                                             # no "the" in the text
])
def test_each_prose_rule_on_a_hand_worked_causal_paragraph(words_gpt2, name, expected):
    doc = load_spacy()(PROSE)
    assert [(w.pos_, w.dep_) for w in doc][:2] == [("PROPN", "nsubj"), ("VERB", "ROOT")]
    assert [s.start for s in doc.sents] == [0, 5] and doc[5].pos_ == "PRON"
    assert words_gpt2.tokenizer.tokenize(PROSE)[4:6] == [".", "ĠIt"]
    assert rule_named(name).keys(words_gpt2, PROSE) == expected


ASKED = "Did my old friend and Tom walk quickly to the bus stop of town, his home?"
# [CLS] did my old friend and tom walk quickly to the bus stop of town , his home ? [SEP]    word i is token i + 1
#   0    1   2   3    4     5   6   7     8      9  10  11  12  13  14 15  16  17  18   19
# spaCy: Did -aux-> walk (root); my -poss-> friend; old -amod-> friend; friend -nsubj-> walk; Tom -conj-> friend;
# quickly -advmod-> walk; bus -compound-> stop; his -poss-> home; ? -punct-> walk


def asked_by_word(keys_of_word: dict[int, list[int]]) -> list[list[int]]:
    """The keys of each token of ASKED from the keys of its word (word i is token i + 1), the specials none."""
    return [[]] + [keys_of_word.get(w, []) for w in range(18)] + [[]]


@pytest.mark.parametrize("name, expected", [
    ("dependents: advmod", asked_by_word({6: [8]})),                     # walk's "quickly"
    ("dependents: aux", asked_by_word({6: [1]})),                        # walk's "Did"
    ("dependents: amod", asked_by_word({3: [3]})),                       # friend's "old"
    ("dependents: compound", asked_by_word({11: [11]})),                 # stop's "bus"
    ("dependents: conj", asked_by_word({3: [6]})),                       # friend's "Tom"
    ("dependents: poss", asked_by_word({3: [2], 16: [16]})),             # friend's "my", home's "his"
    ("first 'and'", asked_by_word({w: [5] for w in range(5, 18)})),      # from the word after it on
    ("first 'to'", asked_by_word({w: [9] for w in range(9, 18)})),
    ("first 'of'", asked_by_word({w: [13] for w in range(13, 18)})),
    ("first comma", asked_by_word({w: [15] for w in range(15, 18)})),
    # a question's sentence type: its auxiliary up front and its question mark, from every word
    ("focus: sentence_type", asked_by_word({w: [1, 18] for w in range(18)})),
    ("recent 4", [list(range(max(0, q - 16), q)) for q in range(20)]),   # the last 16 tokens, specials too
    ("recent 8", [list(range(q)) for q in range(20)]),
])
def test_each_remaining_rule_on_a_hand_worked_question(hf_model, name, expected):
    doc = load_spacy()(ASKED)
    assert [(w.dep_, w.head.i) for w in doc if w.i in (0, 2, 5, 7, 10, 15)] == [
        ("aux", 6), ("amod", 3), ("conj", 3), ("advmod", 6), ("compound", 11), ("poss", 16)]
    assert hf_model.tokenizer.tokenize(ASKED) == [w.lower_ for w in doc]
    assert rule_named(name).keys(hf_model, ASKED) == expected


def test_every_rule_is_worked_by_hand_here():
    """The explanations' checks (tests/test_explain_heads.py) read each rule's keys through ``Rule.keys``: every rule
    is worked by hand in one of the tables above, so those keys are checked, not taken on trust."""
    import sys

    worked = set()
    for test in (v for k, v in vars(sys.modules[__name__]).items() if k.startswith("test_")):
        for mark in getattr(test, "pytestmark", []):
            if mark.name == "parametrize" and "name" in mark.args[0].split(", "):
                at = mark.args[0].split(", ").index("name")
                worked |= {row[at] for row in mark.args[1]}
    assert not set(RULES) - worked, sorted(set(RULES) - worked)


def test_a_recency_rule_halves_every_half_life_and_the_others_spread_evenly():
    named = np.zeros((2, 12), dtype=bool)
    named[0, [6, 7, 8, 9]] = True  # query 10's last four tokens; query 11 names none
    halved = np.array([0.5 ** 1.5, 0.5, 0.5 ** 0.5, 1.0])
    rows = rule_named("recent 2").spread(np.array([10, 11]), named)
    np.testing.assert_allclose(rows[0, [6, 7, 8, 9]], halved / halved.sum())
    assert rows[0].sum() == pytest.approx(1.0) and not rows[1].any()
    np.testing.assert_allclose(rule_named("same word").spread(np.array([10, 11]), named)[0, [6, 7, 8, 9]], 0.25)
