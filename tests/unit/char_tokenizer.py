"""A tiny in-memory tokenizer for grammar tests without a model: every printable ASCII character
is a token, plus a few multi-character tokens (so a mask must reason about tokens that span
grammar elements, as real vocabularies do) and the end token `</s>`."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

MULTI_CHAR = ['{"', '":', '", "', '"}', '": "', "true", "false", "null", "00", "12", "abc", "ab"]
EOS = "</s>"


def make_char_tokenizer() -> PreTrainedTokenizerFast:
    tokens = [EOS] + [chr(c) for c in range(32, 127)] + MULTI_CHAR
    # every character is in the vocabulary, so the unknown token is never used
    model = models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=" ")
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS)
