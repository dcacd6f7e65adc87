"""The router's pieces against a poison request: the retry rule, fingerprints, the quarantine's
strikes, expiry and bound, and client text made safe for a log line."""

from __future__ import annotations

import json

import pytest

from radixserve.api_errors import error_body
from radixserve.logging_config import escape_control
from radixserve.router.args import parse_router_args
from radixserve.router.proxy import never_started
from radixserve.router.quarantine import Quarantine, fingerprint


def error(code: str | None) -> bytes:
    return json.dumps(error_body("x", code=code)).encode()


@pytest.mark.parametrize(
    ("status", "payload", "retryable"),
    [
        (429, error("queue_full"), True),
        (429, b"", True),
        (503, error("draining"), True),
        (503, error("queue_full"), True),
        (503, error("no_ready_worker"), True),  # a router in front of a router
        (503, error("pending_queue_full"), True),
        (503, error("upstream_unavailable"), True),
        (503, error("unavailable"), False),  # the worker's scheduler is gone
        (503, error("scheduler_unavailable"), False),
        (503, error(None), False),
        (503, b"", False),
        (503, b"<html>Service Unavailable</html>", False),
        (503, b'{"error": "draining"}', False),
        (503, b"[" * 5000 + b"]" * 5000, False),
        (500, error("draining"), False),
        (502, b"", False),
    ],
)
def test_only_answers_that_say_never_started_are_retryable(status, payload, retryable) -> None:
    assert never_started(status, payload) is retryable


def test_fingerprints_tell_method_path_and_body_apart() -> None:
    base = fingerprint("POST", "/v1/completions", b'{"prompt": "x"}')
    assert base == fingerprint("post", "/v1/completions", b'{"prompt": "x"}')
    others = {
        fingerprint("GET", "/v1/completions", b'{"prompt": "x"}'),
        fingerprint("POST", "/v1/completions?a=1", b'{"prompt": "x"}'),
        fingerprint("POST", "/generate", b'{"prompt": "x"}'),
        fingerprint("POST", "/v1/completions", b'{"prompt": "y"}'),
        # no ambiguity where one part ends and the next begins
        fingerprint("POST", "/v1/completions{", b'"prompt": "x"}'),
    }
    assert base not in others and len(others) == 5


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_second_strike_quarantines_until_the_entry_expires() -> None:
    clock = Clock()
    book = Quarantine(ttl=600, clock=clock)
    assert not book.is_quarantined("a")
    assert book.strike("a") is False  # one death may be chance
    assert not book.is_quarantined("a")
    clock.now += 599
    assert book.strike("a") is True  # the second one, within the ttl: quarantined, said once
    assert book.is_quarantined("a") and not book.is_quarantined("b")
    assert book.strike("a") is False  # a third strike does not announce it again
    clock.now += 599
    assert book.is_quarantined("a")
    clock.now += 2  # ttl after the last strike: forgotten
    assert not book.is_quarantined("a")
    assert len(book) == 0


def test_strikes_further_apart_than_the_ttl_do_not_add_up() -> None:
    clock = Clock()
    book = Quarantine(ttl=10, clock=clock)
    book.strike("a")
    clock.now += 11
    assert book.strike("a") is False
    assert not book.is_quarantined("a")


def test_the_book_is_bounded_and_forgets_the_least_recently_struck() -> None:
    book = Quarantine(ttl=600, max_entries=3, clock=Clock())
    for key in ("a", "b", "a", "c", "d"):  # b is the least recently struck when d comes
        book.strike(key)
    assert len(book) == 3
    assert book.is_quarantined("a")
    assert book.strike("b") is False  # b was forgotten: this is its first strike again


def test_a_ttl_of_zero_never_quarantines() -> None:
    book = Quarantine(ttl=0)
    assert not book.strike("a") and not book.strike("a")
    assert not book.is_quarantined("a") and len(book) == 0


def test_control_characters_in_client_text_are_escaped_on_log_lines() -> None:
    forged = "/v1/x\n2026-12-03 12:00:00 router INFO admin logged in\r\x00\x1b[31m\u2028\\n"
    shown = escape_control(forged)
    assert shown == (
        "/v1/x\\n2026-12-03 12:00:00 router INFO admin logged in\\r\\x00\\x1b[31m\\u2028\\\\n"
    )
    assert all(c.isprintable() for c in shown)
    assert escape_control("id\udcff") == "id\\udcff"  # a header byte that is not UTF-8
    assert escape_control("/v1/completions") == "/v1/completions"
    assert escape_control("é" * 10, limit=4) == "éééé..."


def test_keys_come_from_flags_or_the_workers_environment_and_never_show(monkeypatch) -> None:
    monkeypatch.delenv("RADIXSERVE_API_KEY", raising=False)
    monkeypatch.delenv("RADIXSERVE_ADMIN_API_KEY", raising=False)
    plain = parse_router_args(["--worker-url", "http://a:1"])
    assert plain.api_key is None and plain.admin_key is None
    monkeypatch.setenv("RADIXSERVE_API_KEY", "from-env")
    args = parse_router_args(["--worker-url", "http://a:1"])
    assert (args.api_key, args.admin_api_key, args.admin_key) == ("from-env", None, "from-env")
    args = parse_router_args(["--worker-url", "http://a:1", "--admin-api-key", "root"])
    assert (args.api_key, args.admin_key) == ("from-env", "root")
    assert "from-env" not in repr(args) and "root" not in repr(args)
    assert "api_key='<redacted>'" in repr(args)
    assert parse_router_args(["--worker-url", "http://a:1"]).quarantine_ttl == 600
