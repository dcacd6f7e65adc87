"""`radixserve router` flags: one dataclass, its fields' descriptions, and the parser built from it.

The policy choices come from the policy registry. Checks that argparse cannot make (one source
of workers, ranges) raise ValueError with a message naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from radixserve.logging_config import LOG_FORMATS
from radixserve.router.discovery import parse_selector
from radixserve.router.policies import DEFAULT_POLICY, POLICIES, PolicyConfig

PREFIX_SOURCES = ("tree", "events")
# the worker's names for the same keys (radixserve.server_args, which the router cannot import)
API_KEY_ENV = "RADIXSERVE_API_KEY"
ADMIN_API_KEY_ENV = "RADIXSERVE_ADMIN_API_KEY"


def _option(default: Any, help: str, **argparse_extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **argparse_extra})


@dataclass(frozen=True)
class RouterArgs:
    host: str = _option("0.0.0.0", "address to listen on")
    port: int = _option(8000, "HTTP port")
    worker_url: tuple[str, ...] = _option(
        (),
        "a worker's base URL, e.g. http://10.0.0.7:8000 (repeat the flag for each worker)",
        action="append",
        metavar="URL",
    )
    discover_selector: str | None = _option(
        None,
        "watch the EndpointSlices with these labels for ready workers instead of a fixed list,"
        " e.g. kubernetes.io/service-name=llama-workers",
        metavar="LABELS",
    )
    namespace: str | None = _option(
        None, "namespace of the EndpointSlices (default: the pod's own, else default)"
    )
    discover_port: str = _option(
        "http", "the workers' port in the EndpointSlices: a name or number"
    )
    policy: str = _option(DEFAULT_POLICY, "routing policy", choices=tuple(POLICIES))
    cache_threshold: float = _option(
        0.5, "cache_aware: least share of the prompt a worker must hold to get it by prefix"
    )
    balance_abs_threshold: float = _option(
        32.0,
        "cache_aware: the load counts as imbalanced, and the least loaded worker gets the"
        " request whatever it matches, when max - min load exceeds this and max load exceeds"
        " --balance-rel-threshold x min load",
    )
    balance_rel_threshold: float = _option(1.0001, "cache_aware: see --balance-abs-threshold")
    prefix_source: str = _option(
        "tree",
        "cache_aware: what a worker is taken to hold: tree (an approximate tree of the prompts"
        " the router sent it) or events (its KV events: what its cache holds, block by block;"
        " the workers run with --kv-events-endpoint tcp://*:--kv-events-port)",
        choices=PREFIX_SOURCES,
    )
    kv_events_port: int = _option(
        5557, "--prefix-source events: the workers' KV events port (on each worker's host)"
    )
    kv_events_replay_port: int = _option(
        0,
        "--prefix-source events: the workers' replay port, asked for batches a gap shows were"
        " lost (0: none; a gap then drops that worker's index)",
    )
    kv_events_block_size: int = _option(
        16, "--prefix-source events: the workers' --kv-events-block-size"
    )
    max_tree_chars: int = _option(
        4 * 1024 * 1024, "cache_aware: prompt characters remembered per worker (LRU beyond)"
    )
    max_retries: int = _option(
        3,
        "attempts on other workers for a request no worker started (connect error, 429,"
        " a draining worker's 503)",
    )
    quarantine_ttl: float = _option(
        600.0,
        "seconds the router remembers a request that coincided with a worker's death; a second"
        " death with the same request (method, path, body) refuses it with 400 for that long"
        " (0: never quarantine)",
    )
    pending_timeout: float = _option(
        300.0,
        "seconds a request waits for a ready worker (a service scaled to zero wakes up meanwhile)"
        " before a 503 with Retry-After",
    )
    max_pending: int = _option(1024, "requests that may wait for a worker; more get 503 at once")
    response_affinity_size: int = _option(
        100_000,
        "Responses API ids remembered with the worker that made each (least recently used"
        " forgotten first); a request naming one goes to that worker (0: no affinity)",
    )
    health_check_interval: float = _option(2.0, "seconds between probes of each worker")
    model_name: str = _option("", "the model_name label of the router's metrics")
    drain_timeout: float = _option(30.0, "after SIGTERM, seconds in-flight requests get to finish")
    seed: int = _option(0, "seed of power_of_two's random draws")
    api_key: str | None = _option(
        None,
        "clients must send 'Authorization: Bearer KEY' (or 'x-api-key: KEY') to every endpoint"
        " but /health, /ready"
        f" and /metrics (default: ${API_KEY_ENV}; unset: the workers check keys themselves)",
        metavar="KEY",
    )
    admin_api_key: str | None = _option(
        None,
        f"the key for /flush_cache and /get_server_info (default: ${ADMIN_API_KEY_ENV},"
        " else the API key)",
        metavar="KEY",
    )
    log_level: str = _option("info", "logging level")
    log_format: str = _option("plain", "log lines for people or JSON objects", choices=LOG_FORMATS)

    def __post_init__(self) -> None:
        if self.api_key is None:
            object.__setattr__(self, "api_key", os.environ.get(API_KEY_ENV) or None)
        if self.admin_api_key is None:
            object.__setattr__(self, "admin_api_key", os.environ.get(ADMIN_API_KEY_ENV) or None)
        if bool(self.worker_url) == bool(self.discover_selector):
            raise ValueError(
                "give the workers: --worker-url URL (repeatable) or --discover-selector LABELS"
            )
        for url in self.worker_url:
            if not url.startswith(("http://", "https://")) or url.rstrip("/").count("/") > 2:
                raise ValueError(f"--worker-url {url!r} is not a base URL like http://HOST:PORT")
        if self.discover_selector is not None:
            try:
                parse_selector(self.discover_selector)
            except ValueError as exc:
                raise ValueError(f"--discover-selector: {exc}") from None
        ranges = {
            "cache_threshold": (0.0, 1.0),
            "balance_abs_threshold": (0.0, None),
            "balance_rel_threshold": (1.0, None),
            "max_tree_chars": (1, None),
            "max_retries": (0, None),
            "pending_timeout": (0.0, None),
            "max_pending": (0, None),
            "response_affinity_size": (0, None),
            "quarantine_ttl": (0.0, None),
            "drain_timeout": (0.0, None),
        }
        for name, (low, high) in ranges.items():
            value = getattr(self, name)
            if value < low or (high is not None and value > high):
                bound = f"between {low} and {high}" if high is not None else f">= {low}"
                raise ValueError(f"--{name.replace('_', '-')} must be {bound}, got {value}")
        if self.health_check_interval <= 0:
            raise ValueError("--health-check-interval must be > 0")
        if not 0 < self.kv_events_port < 65536 or not 0 <= self.kv_events_replay_port < 65536:
            raise ValueError("--kv-events-port and --kv-events-replay-port must be TCP ports")
        if self.kv_events_block_size < 1:
            raise ValueError("--kv-events-block-size must be positive")

    @property
    def admin_key(self) -> str | None:
        """The key of the admin paths: the admin key, else the API key."""
        return self.admin_api_key or self.api_key

    def __repr__(self) -> str:  # keys never reach a log line
        shown = {
            f.name: "<redacted>"
            if f.name in SECRET_FIELDS and getattr(self, f.name)
            else getattr(self, f.name)
            for f in dataclasses.fields(self)
        }
        return "RouterArgs(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    @property
    def worker_urls(self) -> tuple[str, ...]:
        return tuple(url.rstrip("/") for url in self.worker_url)

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            cache_threshold=self.cache_threshold,
            balance_abs_threshold=self.balance_abs_threshold,
            balance_rel_threshold=self.balance_rel_threshold,
            max_tree_chars=self.max_tree_chars,
            seed=self.seed,
        )


SECRET_FIELDS = ("api_key", "admin_api_key")
_METAVARS = {int: "N", float: "F"}


def add_router_args(parser: argparse.ArgumentParser) -> None:
    """One flag per RouterArgs field; a field's default decides its type (None: text)."""
    for f in dataclasses.fields(RouterArgs):
        extra = {k: v for k, v in f.metadata.items() if k != "help"}
        flag = "--" + f.name.replace("_", "-")
        if extra.get("action") == "append":
            parser.add_argument(flag, default=None, help=f.metadata["help"], **extra)
            continue
        default = f.default
        kind = type(default) if default is not None else str
        extra.setdefault("metavar", None if "choices" in extra else _METAVARS.get(kind, "TEXT"))
        parser.add_argument(
            flag,
            type=kind,
            default=default,
            help=f.metadata["help"]
            + (" (default: %(default)s)" if default not in (None, "") else ""),
            **extra,
        )


def router_args_from(namespace: argparse.Namespace) -> RouterArgs:
    values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(RouterArgs)}
    values["worker_url"] = tuple(values["worker_url"] or ())
    return RouterArgs(**values)


def parse_router_args(argv: list[str]) -> RouterArgs:
    parser = argparse.ArgumentParser(prog="radixserve router")
    add_router_args(parser)
    return router_args_from(parser.parse_args(argv))
