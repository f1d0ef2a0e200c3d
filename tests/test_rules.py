"""Rules that say where a head should attend (``analysis.rules``): each rule's keys on hand-worked sentences, in
all-MiniLM-L6-v2's tokens and a tiny GPT-2's, against the tokenizer's own word ids and spaCy's own parse."""
import pytest

from analysis.roles import load_spacy
from analysis.rules import RULES, Reading, rule_named
from models import HeadLensError, load_model

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
    # the second "cat": its duplicate is the first, and induction names what followed it
    cats = [i for i, p in enumerate(reading.pieces) if p.strip() == "cat"]
    if len(cats) == 2 and all(reading.tokens[c] == reading.tokens[cats[0]] for c in cats):
        assert rule_named("duplicate").keys(model, text)[cats[1]] == [cats[0]]
        assert rule_named("induction").keys(model, text)[cats[1]] == [cats[0] + 1]


def test_an_attentions_reading_is_the_models(scratch_model):
    att = scratch_model.attend(CAT)
    for name in ("previous token", "dependency head", "focus: object", "induction"):
        assert rule_named(name).keys_of(Reading.of(att)) == rule_named(name).keys(scratch_model, CAT), name


def test_a_union_says_both_and_an_unknown_name_gets_a_sentence():
    rule = rule_named("previous token or first token")
    assert rule.sentence.startswith("attends to the previous token, or to the first token")
    assert rule.family == "positional"
    assert rule_named("induction or first token").family == "lexical or positional"
    with pytest.raises(HeadLensError, match="no rule named 'previos token'"):
        rule_named("previos token")
    with pytest.raises(HeadLensError, match="no rule named"):
        rule_named("previous token or itself or first token")
