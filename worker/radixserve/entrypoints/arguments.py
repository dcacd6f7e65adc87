"""The worker's command-line arguments, derived from `ServerArgs` and the registries.

One source: each flag is a `ServerArgs` field (its description and default included), and the
choices that name implementations come from the registries that create them. `parse_server_args`
is what `radixserve serve` runs; the operator's contract tests run it on the arguments it
generates, so a spec the CRD accepts cannot yield a worker that refuses its arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing

from radixserve.entrypoints.openai.reasoning_parsers import REASONING_PARSER_CHOICES
from radixserve.entrypoints.openai.tool_parsers import TOOL_PARSER_CHOICES
from radixserve.layers.attention.registry import BACKEND_CHOICES
from radixserve.managers.schedule_policy import SCHEDULE_POLICIES
from radixserve.server_args import ServerArgs, flag_of, static_choices


def registered_choices() -> dict[str, tuple[str, ...]]:
    """Fields whose allowed values are the names in a registry."""
    return {
        "attention_backend": BACKEND_CHOICES,
        "schedule_policy": tuple(SCHEDULE_POLICIES),
        "tool_call_parser": TOOL_PARSER_CHOICES,
        "reasoning_parser": REASONING_PARSER_CHOICES,
    }


def all_choices() -> dict[str, tuple[str, ...]]:
    """Every field with a closed set of values, static or registered."""
    return {**static_choices(), **registered_choices()}


_METAVARS = {int: "N", float: "F"}


def _value_type(field: dataclasses.Field) -> type:
    """int for `int | None`, and so on: the type a flag's text converts to."""
    hints = typing.get_type_hints(ServerArgs)
    hint = hints[field.name]
    if isinstance(hint, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """One flag per ServerArgs field, with its description, default and choices."""
    choices = all_choices()
    for f in dataclasses.fields(ServerArgs):
        kind = _value_type(f)
        help_text = f.metadata.get("help", "")
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


def check_server_args(args: ServerArgs) -> None:
    """The checks ServerArgs cannot make itself: registry-backed choices (None: the default)."""
    for name, allowed in registered_choices().items():
        value = getattr(args, name)
        if value is not None and value not in allowed:
            raise ValueError(f"{flag_of(name)} must be one of {allowed}, got {value!r}")


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
