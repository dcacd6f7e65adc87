"""Incremental detokenization and stop-string trimming for one request's output stream.

The scheduler sends token ids in small deltas. Decoding each delta on its own would split
multi-byte characters (byte-level BPE spreads one emoji over several tokens) and would drop the
leading space SentencePiece tokenizers attach to a word, so the text of new tokens is always
decoded together with a few tokens of context. Stop strings are cut here because the scheduler
stops *after* the token that completes one, while OpenAI never returns the stop string itself;
text that could still turn into a stop string is held back so a stream never emits a part of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# Prompt tokens used as decoding context, enough for any tokenizer's merge of a leading space.
CONTEXT_TOKENS = 6
REPLACEMENT_CHAR = "\ufffd"
# A character is at most 4 UTF-8 bytes and a token carries at least one, so text still partial
# after this many held tokens is invalid bytes (a random or broken model): it is released with
# its replacement characters rather than held, and re-decoded on every token, until the end.
MAX_HELD_TOKENS = 8


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never end mid-character."""

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        # ids[prefix_offset:read_offset] is text already returned, decoded as context.
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def feed(self, new_ids: Sequence[int], final: bool = False) -> str:
        """Add tokens; return the text they complete (held back while a character is partial)."""
        nothing_held = len(self._ids) == self._read_offset
        self._ids.extend(new_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if nothing_held and full_text == prefix_text and new_ids:
            # Tokens that decode to nothing (skipped special tokens, ids the tokenizer lacks)
            # leave the window: a long run of them would otherwise make every later decode
            # longer, quadratic in the output, and hold the stream's text back.
            del self._ids[-len(new_ids) :]
            return ""
        held = len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR)
        if held and not final:
            if len(self._ids) - self._read_offset <= MAX_HELD_TOKENS:
                return ""
            return self._release_invalid(prefix_text)
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]

    def _release_invalid(self, prefix_text: str) -> str:
        """Release held text up to the last point where it ends cleanly (or all of it)."""
        end = len(self._ids)
        for cut in range(end - 1, max(end - 4, self._read_offset), -1):
            text = self._decode(self._ids[self._prefix_offset : cut])
            if len(text) > len(prefix_text) and not text.endswith(REPLACEMENT_CHAR):
                end = cut
                break
        text = self._decode(self._ids[self._prefix_offset : end])
        self._prefix_offset = self._read_offset
        self._read_offset = end
        return text[len(prefix_text) :]


class StopStringTrimmer:
    """Decides how much of the accumulated output text may be released to the client."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._stop = [s for s in stop if s]
        self.text = ""
        self.released = 0
        self.stopped = False

    def push(self, delta: str, final: bool = False) -> str:
        """Append decoded text; return the newly releasable part (never any stop string)."""
        if self.stopped:
            return ""
        self.text += delta
        cut = self._first_stop_position()
        if cut is not None:
            self.stopped = True
            self.text = self.text[:cut]
            end = cut
        elif final:
            end = len(self.text)
        else:
            end = len(self.text) - self._held_back_length()
        end = max(end, self.released)
        out = self.text[self.released : end]
        self.released = end
        return out

    def _first_stop_position(self) -> int | None:
        # Released text never holds the start of a stop string, so search only the rest.
        positions = [p for s in self._stop if (p := self.text.find(s, self.released)) != -1]
        return min(positions) if positions else None

    def _held_back_length(self) -> int:
        """Longest suffix of the text that is a proper prefix of some stop string."""
        longest = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text) - self.released), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest
