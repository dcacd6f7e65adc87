"""The machinery the family parsers share: a buffer of unread output, a state machine stepping
over it, content held back while it could still be a marker, and calls streamed as they are
read. Each family only writes its states (`_step`)."""

from __future__ import annotations

from abc import abstractmethod

from radixserve.frontend.openai.tool_parsers.base import (
    CallParser,
    ContentStream,
    ParsedDelta,
    ToolCallDelta,
    held_prefix_length,
)
from radixserve.frontend.openai.tool_parsers.json_reader import CallObjectReader, ValueReader


class CallStream:
    """One call being read: announces its name once known, then sends what the arguments grew
    by. `reader` is a CallObjectReader, or a ValueReader when the name came from elsewhere."""

    def __init__(
        self, index: int, reader: CallObjectReader | ValueReader, name: str | None = None
    ) -> None:
        self.index = index
        self.reader = reader
        self._name = name
        self.announced = False
        self._sent = 0
        self.consumed = ""  # the raw text this call read, for giving it back as content

    @property
    def name(self) -> str | None:
        return self._name if self._name is not None else getattr(self.reader, "name", None)

    def read(self, text: str) -> int:
        """Push characters until the reader is done or fails; returns how many it took."""
        taken = 0
        for ch in text:
            self.reader.push(ch)
            taken += 1
            if self.reader.done or self.reader.failed:
                break
        self.consumed += text[:taken]
        return taken

    def deltas(self) -> list[ToolCallDelta]:
        out = []
        if not self.announced and self.name is not None:
            self.announced = True
            out.append(ToolCallDelta(self.index, name=self.name))
        if self.announced:
            arguments = self.reader.arguments()
            if len(arguments) > self._sent:
                out.append(ToolCallDelta(self.index, arguments=arguments[self._sent :]))
                self._sent = len(arguments)
        return out


class ScanningParser(CallParser):
    """A state machine over buffered output; `_step` advances it and says whether to go on."""

    def __init__(self) -> None:
        self._buf = ""
        self._final = False
        self._state = self.initial_state
        self._content = ContentStream()
        self._num_calls = 0
        self._call: CallStream | None = None

    initial_state = "content"

    def feed(self, text: str) -> ParsedDelta:
        self._buf += text
        return self._run()

    def finish(self) -> ParsedDelta:
        self._final = True
        out = self._run()
        if self._call is not None:
            self._close_unfinished_call(out)
        if self._num_calls:
            self._content.drop()  # whitespace around calls is not content
        out.content += self._content.flush()
        return out

    def open_call(self) -> int | None:
        return self._call.index if self._call is not None else None

    def _run(self) -> ParsedDelta:
        out = ParsedDelta()
        while self._step(out):
            pass
        return out

    @abstractmethod
    def _step(self, out: ParsedDelta) -> bool:
        """Advance over `self._buf`; False when more output is needed (or all is done)."""

    # ---------------------------------------------------------------- helpers for states

    def _emit_content(self, out: ParsedDelta, text: str) -> None:
        out.content += self._content.add(text)

    def _content_until(self, out: ParsedDelta, marker: str) -> bool:
        """Emit content up to `marker` and consume it (True); without it, emit what cannot be
        its start and keep the rest (False)."""
        index = self._buf.find(marker)
        if index >= 0:
            self._emit_content(out, self._buf[:index])
            self._content.drop()
            self._buf = self._buf[index + len(marker) :]
            return True
        end = len(self._buf) - held_prefix_length(self._buf, marker)
        if self._final:
            # The output ended inside a marker: after calls, one more call was cut (dropped);
            # before any, it is text.
            self._emit_content(out, self._buf[: end if self._num_calls else None])
            self._buf = ""
            return False
        self._emit_content(out, self._buf[:end])
        self._buf = self._buf[end:]
        return False

    def _lstrip(self) -> bool:
        """Drop leading whitespace; False when nothing else is buffered yet."""
        self._buf = self._buf.lstrip()
        return bool(self._buf)

    def _waits_for(self, *markers: str) -> bool:
        """True while the buffer could still grow into one of `markers`."""
        return not self._final and any(m.startswith(self._buf) for m in markers)

    def _start_call(self, reader: CallObjectReader | ValueReader, name: str | None = None) -> None:
        self._call = CallStream(self._num_calls, reader, name)

    def _read_call(self, out: ParsedDelta, marker: str = "") -> str:
        """Feed the buffer to the current call: "done", "more" (needs output) or "failed".
        A call that fails before any part of it was sent was text after all: it goes back to
        content, `marker` first; after that, the text from where it broke is read again."""
        call = self._call
        assert call is not None
        taken = call.read(self._buf)
        self._buf = self._buf[taken:]
        if call.reader.failed and not call.announced:
            self._call = None
            self._emit_content(out, marker + call.consumed)
            return "failed"
        was_announced = call.announced
        out.calls.extend(call.deltas())
        if call.announced and not was_announced:
            self._num_calls += 1
        if call.reader.failed:
            self._call = None
            self._buf = call.consumed[call.reader.failed_at :] + self._buf
            return "failed"
        if call.reader.done:
            self._call = None
            return "done"
        return "more"

    def _close_unfinished_call(self, out: ParsedDelta) -> None:
        """The output ended inside a call (cut at max_tokens, or an EOS before it closed): a
        named one keeps what its arguments got (a client gets it only when those are whole
        JSON: `CompleteCalls`); one cut before its name was complete is dropped, not given
        back as text (every character of it so far could still have been a call)."""
        assert self._call is not None
        self._call = None
