"""Client-sent text on a log line: control characters escaped, length bounded.

A path with `%0a` decodes to a newline that would start a forged log line; `%00` would write a
NUL byte into the log. Every client string the router logs (paths, header values) goes through
`printable`: backslashes and control characters (C0, DEL, C1, the Unicode line and paragraph
separators, and lone surrogates: header bytes that are not UTF-8, which a handler could not
encode) are shown as escapes (`\\n`, `\\x00`, `\\u2028`, `\\udcff`).
"""

from __future__ import annotations

import re

MAX_LOGGED_CHARS = 512
_UNPRINTABLE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    shown = _UNPRINTABLE.sub(_escape, text[:limit])
    return shown + ("..." if len(text) > limit else "")
