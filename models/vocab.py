"""Word-level tokenizers for the decoders HeadLens trains: one token a word, no special tokens added."""
from __future__ import annotations

PAD, UNK = "[PAD]", "[UNK]"


def word_tokenizer(words: list[str], lowercase: bool, max_len: int):
    """A fast tokenizer over ``words`` (plus [PAD] and [UNK]), as transformers' tokenizers are, so
    offsets, word ids and saving work as for any model. Lowercased text is split at spaces and
    punctuation; otherwise at spaces only."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(words)}
    vocab.update({PAD: len(vocab), UNK: len(vocab) + 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Whitespace() if lowercase else pre_tokenizers.WhitespaceSplit()
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=UNK, model_max_length=max_len)
    fast.padding_side = "right"
    return fast


def token_tokenizer(vocab_size: int, max_len: int):
    """Tokens written ``t0`` ... ``t{vocab_size - 1}``, space-separated."""
    return word_tokenizer([f"t{i}" for i in range(vocab_size)], lowercase=False, max_len=max_len)
