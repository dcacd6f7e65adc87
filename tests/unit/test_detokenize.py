"""Incremental detokenization and stop-string trimming, with tokenizers whose quirks are known.

A byte-level tokenizer (one token per UTF-8 byte) is the worst case for multi-byte characters;
a SentencePiece-like one drops the leading space of the first token it decodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from radixserve.frontend.detokenizer import (
    CONTEXT_TOKENS,
    MAX_HELD_TOKENS,
    IncrementalDetokenizer,
    StopStringTrimmer,
)


class ByteTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class WordPieceLikeTokenizer:
    """Words with a "▁" marker for a leading space, stripped at the start of a decode."""

    def __init__(self, words: list[str]) -> None:
        self.words = words

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.words[i] for i in ids).replace("▁", " ").lstrip(" ")


def split_points(draw, length: int) -> list[int]:
    cuts = draw(st.lists(st.integers(0, length), max_size=8))
    return sorted(set(cuts) | {0, length})


@st.composite
def text_and_chunks(draw):
    text = draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
    ids = ByteTokenizer().encode(text)
    points = split_points(draw, len(ids))
    chunks = [ids[a:b] for a, b in zip(points, points[1:], strict=False)]
    return text, chunks


@given(text_and_chunks())
def test_byte_tokens_decode_whole_characters_only(case):
    text, chunks = case
    detok = IncrementalDetokenizer(ByteTokenizer())
    deltas = [detok.feed(chunk) for chunk in chunks[:-1]]
    deltas.append(detok.feed(chunks[-1] if chunks else [], final=True))
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_emoji_is_released_only_when_complete():
    detok = IncrementalDetokenizer(ByteTokenizer())
    emoji = list("🎉".encode())
    assert [detok.feed([b]) for b in emoji] == ["", "", "", "🎉"]


def test_invalid_bytes_are_flushed_at_the_end():
    detok = IncrementalDetokenizer(ByteTokenizer())
    assert detok.feed([0xF0, 0x9F]) == ""
    assert detok.feed([], final=True) == "\ufffd"


def test_invalid_bytes_are_released_while_streaming_not_held_to_the_end():
    detok = IncrementalDetokenizer(ByteTokenizer())
    garbage = [0xFF] * 40  # never valid UTF-8, as a broken or random-weight model may emit
    released = "".join(detok.feed([b]) for b in garbage)
    assert released.count("\ufffd") >= len(garbage) - MAX_HELD_TOKENS - 1
    assert (released + detok.feed([], final=True)) == "\ufffd" * len(garbage)


def test_text_that_decodes_to_nothing_keeps_the_decode_window_bounded():
    class CountingTokenizer(ByteTokenizer):
        """Ids of 256 and up are special tokens: skipped, so they decode to nothing."""

        longest = 0

        def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
            self.longest = max(self.longest, len(ids))
            return super().decode([i for i in ids if i < 256])

    tok = CountingTokenizer()
    detok = IncrementalDetokenizer(tok, prompt_ids=list(b"say: "))
    out = [detok.feed([i]) for i in [*b"hi", *[300] * 500, *"é!".encode()]]
    assert "".join(out) == "hié!"
    assert tok.longest <= CONTEXT_TOKENS + MAX_HELD_TOKENS


def test_prompt_context_keeps_the_leading_space_of_the_first_word():
    tok = WordPieceLikeTokenizer(["▁Hello", "▁big", "▁world", "!"])
    detok = IncrementalDetokenizer(tok, prompt_ids=[0])
    assert [detok.feed([i]) for i in (1, 2, 3)] == [" big", " world", "!"]


def test_without_context_the_first_word_has_no_space():
    tok = WordPieceLikeTokenizer(["▁Hello", "▁world"])
    detok = IncrementalDetokenizer(tok)
    assert detok.feed([0]) + detok.feed([1]) == "Hello world"


def run_trimmer(stop: list[str], deltas: list[str]) -> tuple[list[str], StopStringTrimmer]:
    trimmer = StopStringTrimmer(stop)
    out = [trimmer.push(d) for d in deltas[:-1]]
    out.append(trimmer.push(deltas[-1], final=True))
    return out, trimmer


def test_stop_string_split_across_chunks_is_never_released():
    out, trimmer = run_trimmer(["END"], ["abc E", "N", "D tail"])
    assert out == ["abc ", "", ""]
    assert trimmer.stopped and trimmer.text == "abc "


def test_held_back_prefix_is_released_when_it_is_not_a_stop():
    out, trimmer = run_trimmer(["END"], ["x E", "Nx", "!"])
    assert out == ["x ", "ENx", "!"]
    assert not trimmer.stopped


def test_earliest_of_several_stop_strings_wins():
    out, trimmer = run_trimmer(["world", "lo"], ["hello world"])
    assert "".join(out) == "hel"
    assert trimmer.stopped


def test_final_push_releases_a_dangling_prefix():
    out, _ = run_trimmer(["###"], ["answer #", "#"])
    assert "".join(out) == "answer ##"


def test_nothing_after_a_stop():
    trimmer = StopStringTrimmer(["."])
    assert trimmer.push("a.b") == "a"
    assert trimmer.push("more", final=True) == ""


@given(
    st.text(alphabet="ab.", max_size=30),
    st.lists(st.integers(0, 30), max_size=5),
    st.sampled_from([["."], ["ab"], ["b.a", "aa"]]),
)
def test_released_text_is_the_text_before_the_first_stop(text, cuts, stop):
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    deltas = [text[a:b] for a, b in zip(points, points[1:], strict=False)] or [""]
    out, _ = run_trimmer(stop, deltas)
    positions = [p for s in stop if (p := text.find(s)) != -1]
    expected = text[: min(positions)] if positions else text
    assert "".join(out) == expected
