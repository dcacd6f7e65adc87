"""`radixserve bench NAME --help`: every flag says what it does, and the in-process benchmarks
offer the engine's flags only, none of the HTTP server's (they start no server)."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from radixserve.contract import HTTP_ONLY_FIELDS, server_args_from
from radixserve.entrypoints.cli import BENCHMARKS, build_parser, main
from radixserve.server_args import ServerArgs, flag_of


def bench_parser(name: str) -> argparse.ArgumentParser:
    parser = build_parser(["bench", name])
    bench = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "bench"
    ]
    return next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices[
        name
    ]


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_bench_flag_has_help_and_none_is_an_http_server_flag(name: str) -> None:
    options = [a for a in bench_parser(name)._actions if a.option_strings]
    assert len(options) > 3
    missing = [a.option_strings[0] for a in options if not (a.help or "").strip()]
    assert missing == [], f"bench {name}: flags without help: {missing}"
    flags = {flag for a in options for flag in a.option_strings}
    http_only = sorted(flags & {flag_of(f) for f in HTTP_ONLY_FIELDS})
    assert http_only == [], f"bench {name} offers HTTP server flags: {http_only}"


@pytest.mark.parametrize("name", ["offline", "latency"])
def test_in_process_benchmarks_keep_every_engine_flag(name: str) -> None:
    """Every other serve flag is there, and the HTTP ones take ServerArgs' defaults."""
    flags = {f for a in bench_parser(name)._actions for f in a.option_strings}
    engine = {flag_of(f.name) for f in ServerArgs.__dataclass_fields__.values()} - {
        flag_of(f) for f in HTTP_ONLY_FIELDS
    }
    assert engine <= flags
    args = build_parser(["bench", name]).parse_args(["bench", name, "--device", "cpu"])
    server_args = server_args_from(args)
    assert server_args.device == "cpu" and server_args.port == ServerArgs().port


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_bench_help_prints_and_exits_0(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main(["bench", name, "--help"])
    assert exited.value.code == 0
    text = out.getvalue()
    assert "--output-json" in text and "--api-key" not in text and "--host" not in text
