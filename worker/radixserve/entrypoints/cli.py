"""`radixserve serve ...`, `radixserve router ...` and `radixserve bench <name> ...`.

Serve flags are derived from `ServerArgs`, so the CLI cannot drift from the engine. Benchmarks
are modules named in `BENCHMARKS`, each exposing `add_args(parser)` and `run(args) -> int`;
they are imported only when chosen, so `serve` never pays for them. The router
(`radixserve.router`) is imported only for `radixserve router`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

from radixserve.contract import add_server_args, server_args_from
from radixserve.logging_config import configure_logging

BENCHMARKS: dict[str, str] = {
    "serving": "radixserve.bench.serving",
    "offline": "radixserve.bench.offline",
    "latency": "radixserve.bench.latency",
    "router": "radixserve.bench.router",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixserve",
        description="LLM serving: a worker that serves one model, a router in front of many "
        "workers, and benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve one model over HTTP: the OpenAI and Anthropic APIs, /generate, probes and "
        "metrics",
        description="Serve a model over HTTP with an OpenAI-compatible API.",
    )
    add_server_args(serve)
    router = commands.add_parser(
        "router",
        help="put one endpoint in front of many workers, routing each request by prefix cache "
        "and load",
        description="One endpoint in front of many workers: cache-aware routing, failover, "
        "and holding requests while no worker is ready.",
    )
    if argv[:1] == ["router"]:
        from radixserve.router.args import add_router_args

        add_router_args(router)
    bench = commands.add_parser(
        "bench",
        help="measure the model worker, the in-process engine, a running server or the router "
        "(latency, offline, serving, router)",
    )
    names = bench.add_subparsers(dest="benchmark", required=True)
    for name, module_path in BENCHMARKS.items():
        sub = names.add_parser(name, help=f"the {name} benchmark")
        # Only the chosen benchmark's module is imported (some pull in torch or the model).
        if len(argv) >= 2 and argv[0] == "bench" and argv[1] == name:
            importlib.import_module(module_path).add_args(sub)
    return parser


def version() -> str:
    """The installed package's version."""
    try:
        return metadata.version("radixserve")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command == "serve":
        try:
            server_args = server_args_from(args)
        except ValueError as exc:
            parser.error(str(exc))
        configure_logging(server_args.log_level, server_args.log_format)
        from radixserve.entrypoints.server_launch import run_server
        from radixserve.frontend.engine import EngineStartupError

        try:
            run_server(server_args)
        except EngineStartupError as exc:
            # a model that cannot be served: one line, not a traceback
            print(f"radixserve serve: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "router":
        from radixserve.router.args import router_args_from
        from radixserve.router.server import run_router

        try:
            router_args = router_args_from(args)
        except ValueError as exc:
            parser.exit(2, f"radixserve router: error: {exc}\n")
        configure_logging(router_args.log_level, router_args.log_format, process="router")
        return run_router(router_args)
    configure_logging(getattr(args, "log_level", "info"), getattr(args, "log_format", "plain"))
    return importlib.import_module(BENCHMARKS[args.benchmark]).run(args)


if __name__ == "__main__":
    sys.exit(main())
