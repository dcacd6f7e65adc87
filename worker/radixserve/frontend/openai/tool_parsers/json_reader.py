"""Incremental readers of the JSON that tool calls are written in, one character at a time.

A streamed call must show its name as soon as it is complete and its arguments while they are
still being generated, before the JSON around them closes; a JSON parser only answers at the
end. These readers track nesting and strings instead, and expose the raw text of the
arguments as it grows. The raw text is what both the streamed and the whole response carry
(not a re-serialisation), which keeps them equal.
"""

from __future__ import annotations

import json

ARGUMENT_KEYS = ("arguments", "parameters")


class JsonLexer:
    """Nesting depth and string state of JSON text fed one character at a time."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self._escape = False

    def push(self, ch: str) -> str:
        """The character's role: open, close, string_start, string_end, string or other."""
        if self.in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self.in_string = False
                return "string_end"
            return "string"
        if ch == '"':
            self.in_string = True
            return "string_start"
        if ch in "{[":
            self.depth += 1
            return "open"
        if ch in "}]":
            self.depth -= 1
            return "close"
        return "other"


class CallObjectReader:
    """Reads one `{"name": "...", "arguments": {...}}` object (`parameters` is accepted for
    `arguments`, keys in any order). `done` once the object closes, `failed` on text that cannot
    be such an object; `failed_at` is then the index of the first character that broke it."""

    def __init__(self) -> None:
        self._chars: list[str] = []
        self._lexer = JsonLexer()
        self._phase = "start"
        self._key: str | None = None
        self._key_start = 0
        self._value_start = 0
        self._value_kind = ""
        self.name: str | None = None
        self._args_start: int | None = None
        self._args_kind = ""
        self._args_final: str | None = None
        self.done = False
        self.failed = False
        self.failed_at = 0

    @property
    def text(self) -> str:
        return "".join(self._chars)

    def push(self, ch: str) -> None:
        pos = len(self._chars)
        self._chars.append(ch)
        role = self._lexer.push(ch)
        phase = self._phase
        if phase == "start":
            if ch == "{":
                self._phase = "key"
            elif not ch.isspace():
                self._fail(pos)
        elif phase == "key":
            if role == "string_start":
                self._key_start, self._phase = pos, "in_key"
            elif ch == "}":
                self.done = True
            elif ch != "," and not ch.isspace():
                self._fail(pos)
        elif phase == "in_key":
            if role == "string_end":
                self._key = json.loads(self.text[self._key_start : pos + 1])
                self._phase = "colon"
        elif phase == "colon":
            if ch == ":":
                self._phase = "value"
            elif not ch.isspace():
                self._fail(pos)
        elif phase == "value":
            self._start_value(ch, role, pos)
        elif phase == "in_value":
            self._continue_value(ch, role, pos)
        elif phase == "after":
            if ch == ",":
                self._phase = "key"
            elif ch == "}":
                self.done = True
            elif not ch.isspace():
                self._fail(pos)

    def _start_value(self, ch: str, role: str, pos: int) -> None:
        if ch.isspace():
            return
        if ch in ",}":
            self._fail(pos)
            return
        self._value_start, self._phase = pos, "in_value"
        self._value_kind = {"open": "compound", "string_start": "string"}.get(role, "literal")
        if self._key in ARGUMENT_KEYS and self._args_start is None:
            self._args_start, self._args_kind = pos, self._value_kind

    def _continue_value(self, ch: str, role: str, pos: int) -> None:
        lexer = self._lexer
        if self._value_kind != "literal":
            if lexer.depth == 1 and not lexer.in_string and role in ("close", "string_end"):
                self._end_value(pos + 1)
                self._phase = "after"
        elif ch == "," and lexer.depth == 1:
            self._end_value(pos)
            self._phase = "key"
        elif ch == "}" and lexer.depth == 0:
            self._end_value(pos)
            self.done = True

    def _end_value(self, end: int) -> None:
        raw = self.text[self._value_start : end].strip()
        if self._key == "name":
            try:
                name = json.loads(raw)
            except json.JSONDecodeError:
                name = None
            if isinstance(name, str) and self.name is None:
                self.name = name
        elif self._args_start == self._value_start and self._args_final is None:
            self._args_final = _decoded_if_string(raw, self._args_kind)

    def _fail(self, pos: int) -> None:
        self.failed, self.failed_at = True, pos

    def arguments(self) -> str:
        """The arguments text known so far: it only grows, and ends as the whole arguments
        ("{}" for a call without any). A JSON string holding the arguments (some models quote
        them) is decoded once complete, so it does not grow before that."""
        if self._args_final is not None:
            return self._args_final
        if self._args_start is None:
            return "{}" if self.done else ""
        if self._args_kind == "string":
            return ""
        return self.text[self._args_start :].rstrip()


class ValueReader:
    """Reads one bare JSON object, array or string (the arguments after Mistral's [ARGS])."""

    def __init__(self) -> None:
        self._chars: list[str] = []
        self._lexer = JsonLexer()
        self._start: int | None = None
        self._kind = ""
        self.done = False
        self.failed = False
        self.failed_at = 0

    def push(self, ch: str) -> None:
        pos = len(self._chars)
        self._chars.append(ch)
        role = self._lexer.push(ch)
        if self._start is None:
            if ch.isspace():
                return
            if role not in ("open", "string_start"):
                self.failed, self.failed_at = True, pos
                return
            self._start, self._kind = pos, "string" if role == "string_start" else "compound"
            return
        if self._lexer.depth == 0 and not self._lexer.in_string and role in ("close", "string_end"):
            self.done = True

    @property
    def text(self) -> str:
        return "".join(self._chars)

    def arguments(self) -> str:
        """Like `CallObjectReader.arguments`: grows, then ends as the whole value."""
        if self._start is None:
            return ""
        raw = self.text[self._start :].strip()
        if self._kind == "string":
            return _decoded_if_string(raw, "string") if self.done else ""
        return raw


def _decoded_if_string(raw: str, kind: str) -> str:
    """Arguments some models send as a JSON string of JSON: the inner text."""
    if kind != "string":
        return raw
    try:
        inner = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return inner if isinstance(inner, str) else raw
