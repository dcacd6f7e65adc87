"""The worker's published flags and names: what `radixserve serve` and `radixserve router`
accept, for everyone who builds their command lines without running the engine.

Each `serve` flag is a `ServerArgs` field (its description and default included), and the
choices that name implementations are listed here. `parse_server_args` is what `radixserve
serve` runs.

The operator imports the worker only through this module (`.importlinter` holds it): its CRD
enums and argument builder derive from these choices, so a spec the API server accepts yields
arguments the worker accepts (tests/unit/operator/test_worker_contract.py). The CLI and the
front end check the same choices. Each registry that implements a name (the schedule policies,
the tool and reasoning parsers, the router's policies) is tested to hold exactly the names
listed here (tests/unit/test_contract.py); the attention backends and quantization methods are
listed once, in `radixserve.catalog`.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Collection

from radixserve.catalog.attention_backends import BACKEND_CHOICES
from radixserve.catalog.quantization_methods import QUANTIZATION_CHOICES
from radixserve.server_args import (
    ADMIN_API_KEY_ENV,
    API_KEY_ENV,
    SPECULATIVE_METHODS,
    ServerArgs,
    flag_of,
    static_choices,
)

SCHEDULE_POLICIES: tuple[str, ...] = ("lpm", "fcfs")
TOOL_PARSERS: tuple[str, ...] = ("hermes", "llama3_json", "mistral", "pythonic", "harmony")
REASONING_PARSERS: tuple[str, ...] = ("qwen3", "deepseek-r1", "harmony")
ROUTER_POLICIES: tuple[str, ...] = ("cache_aware", "power_of_two", "round_robin")
# `serve` flags only the HTTP server reads (its socket and keys, the request log, the API's
# strictness, model name and parsers, the queue bound, drain and readiness): the in-process
# benchmarks (`bench offline`, `bench latency`) add every flag but these.
HTTP_ONLY_FIELDS: frozenset[str] = frozenset(
    {
        "host",
        "port",
        "api_key",
        "admin_api_key",
        "served_model_name",
        "log_requests",
        "strict_api",
        "tool_call_parser",
        "reasoning_parser",
        "max_queued_requests",
        "drain_timeout",
        "scheduler_stall_timeout",
        "responses_store_size",
        "responses_store_dir",
    }
)

__all__ = [
    "ADMIN_API_KEY_ENV",
    "API_KEY_ENV",
    "HTTP_ONLY_FIELDS",
    "REASONING_PARSERS",
    "ROUTER_POLICIES",
    "SCHEDULE_POLICIES",
    "TOOL_PARSERS",
    "all_choices",
    "add_server_args",
    "check_server_args",
    "flag_of",
    "parse_server_args",
    "registered_choices",
    "server_args_from",
]


def registered_choices() -> dict[str, tuple[str, ...]]:
    """`serve` flags whose allowed values are the names in a registry."""
    return {
        "attention_backend": BACKEND_CHOICES,
        "schedule_policy": SCHEDULE_POLICIES,
        "tool_call_parser": TOOL_PARSERS,
        "reasoning_parser": REASONING_PARSERS,
        "quantization": QUANTIZATION_CHOICES,
        "speculative_method": SPECULATIVE_METHODS,
    }


def all_choices() -> dict[str, tuple[str, ...]]:
    """Every `serve` flag with a closed set of values, static or registered."""
    return {**static_choices(), **registered_choices()}


def check_server_args(args: ServerArgs) -> None:
    """The checks ServerArgs cannot make itself: registry-backed choices (None: the default)."""
    for name, allowed in registered_choices().items():
        value = getattr(args, name)
        if value is not None and value not in allowed:
            raise ValueError(f"{flag_of(name)} must be one of {allowed}, got {value!r}")


_METAVARS = {int: "N", float: "F"}


def _value_type(field: dataclasses.Field) -> type:
    """int for `int | None`, and so on: the type a flag's text converts to."""
    hints = typing.get_type_hints(ServerArgs)
    hint = hints[field.name]
    if isinstance(hint, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def add_server_args(parser: argparse.ArgumentParser, exclude: Collection[str] = ()) -> None:
    """One flag per ServerArgs field but those named in `exclude` (e.g. HTTP_ONLY_FIELDS), with
    its description, default and choices; `server_args_from` gives the others their default."""
    choices = all_choices()
    for f in dataclasses.fields(ServerArgs):
        if f.name in exclude:
            continue
        kind = _value_type(f)
        help_text = f.metadata.get("help", "")
        if f.metadata.get("repeatable"):
            parser.add_argument(
                flag_of(f.name), action="append", metavar="NAME=PATH", help=help_text
            )
            continue
        if kind is bool:
            parser.add_argument(
                flag_of(f.name), action="store_true", default=f.default, help=help_text
            )
            continue
        parser.add_argument(
            flag_of(f.name),
            type=kind,
            default=f.default,
            choices=choices.get(f.name),
            metavar=None if f.name in choices else _METAVARS.get(kind, "TEXT"),
            help=help_text + (" (default: %(default)s)" if f.default is not None else ""),
        )


def server_args_from(namespace: argparse.Namespace) -> ServerArgs:
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    args = ServerArgs(**{n: getattr(namespace, n) for n in names if hasattr(namespace, n)})
    check_server_args(args)
    return args


def server_args_parser(prog: str = "radixserve serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="serve a model over HTTP")
    add_server_args(parser)
    return parser


def parse_server_args(argv: list[str]) -> ServerArgs:
    """`radixserve serve ARGV` as the worker parses and validates it; argparse exits (status
    2) on a flag it refuses, a ValueError names a value ServerArgs refuses."""
    return server_args_from(server_args_parser().parse_args(argv))
