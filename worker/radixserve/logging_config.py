"""Logging for every worker process: plain lines for people, JSON objects for log pipelines.

`--log-format json` makes each line one JSON object (time, level, logger, process, message and
any `extra` fields, such as a request log's), like the operator's `--log-format json`. The
front end and each scheduler process call `configure_logging` first thing, so every line the
worker writes has the same shape; Python warnings are routed through it too. This module
imports nothing of radixserve, so every process may call it before anything else is loaded.
"""

from __future__ import annotations

import logging
import re
import sys

from pythonjsonlogger.json import JsonFormatter

LOG_FORMATS = ("plain", "json")
# the most characters of one client-sent string a log line shows
MAX_LOGGED_CHARS = 512
# what a client could use to forge or corrupt a log line: C0 controls (newline, NUL, escape),
# DEL, C1 controls (NEL), the Unicode line and paragraph separators, and lone surrogates (not
# encodable: the handler would print an error instead of the line); backslash too, so an escape
# the client wrote reads differently from one made here
_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_control(text: object, limit: int = MAX_LOGGED_CHARS) -> str:
    """Client-sent text (a path, a header value, a field name) made safe for one log line:
    control characters shown as escapes (`\\n`, `\\x00`, `\\u2028`), at most `limit`
    characters kept (then `...`). Every string a client chose goes through this before it is
    logged, so a request cannot forge a line or write a NUL byte into the log."""
    text = text if isinstance(text, str) else str(text)
    shown = _UNSAFE.sub(_escape, text[:limit])
    return shown + ("..." if len(text) > limit else "")


def configure_logging(level: str, log_format: str = "plain", process: str = "frontend") -> None:
    """Replace the root logger's handlers with one stderr handler in `log_format`; `process`
    names the writer (frontend, scheduler, scheduler1, ...)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                static_fields={"process": process},
            )
        )
    elif log_format == "plain":
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {process} %(name)s %(levelname)s %(message)s")
        )
    else:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
