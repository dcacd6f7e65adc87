"""``radixserve-operator``: the operator process (kopf run with radixserve's settings).

Flags (each also read from the environment, ``RADIXSERVE_OPERATOR_<FLAG>``):
namespace scope or cluster-wide, kopf peering for leader election, the liveness endpoint,
the metrics port, JSON or plain logs, the default worker image and the Prometheus address
that KEDA triggers query.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import kopf
from prometheus_client import start_http_server

# Importing the handlers module registers the kopf handlers this process runs.
from radixserve_operator.handlers import DEFAULT_PROMETHEUS_ADDRESS, DEFAULT_WORKER_IMAGE

ENV_PREFIX = "RADIXSERVE_OPERATOR_"


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    clusterwide: bool = False
    peering: str | None = "radixserve-operator"  # None: standalone, no leader election
    priority: int | None = None  # None: random, so exactly one replica leads
    liveness_port: int | None = 8081
    metrics_port: int | None = 8080
    log_format: str = "json"
    verbose: bool = False
    worker_image: str = DEFAULT_WORKER_IMAGE
    prometheus_address: str = DEFAULT_PROMETHEUS_ADDRESS


def parse_args(argv: Sequence[str] | None = None) -> OperatorConfig:
    parser = argparse.ArgumentParser(prog="radixserve-operator", description=__doc__)

    def env(name: str, default: str | None = None) -> str | None:
        return os.environ.get(ENV_PREFIX + name, default)

    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="watch this namespace (repeatable; globs allowed; env: comma-separated)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=env("ALL_NAMESPACES") == "true",
        help="watch every namespace (the default when no --namespace is given)",
    )
    parser.add_argument(
        "--peering",
        default=env("PEERING", "radixserve-operator"),
        help="kopf peering object used for leader election",
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        default=env("STANDALONE") == "true",
        help="no leader election (a single replica)",
    )
    parser.add_argument("--priority", type=int, default=env("PRIORITY"), help="peering priority")
    parser.add_argument("--liveness-port", type=int, default=int(env("LIVENESS_PORT", "8081")))
    parser.add_argument("--metrics-port", type=int, default=int(env("METRICS_PORT", "8080")))
    parser.add_argument(
        "--log-format", choices=["json", "plain"], default=env("LOG_FORMAT", "json")
    )
    parser.add_argument("-v", "--verbose", action="store_true", default=env("VERBOSE") == "true")
    parser.add_argument("--worker-image", default=env("WORKER_IMAGE", DEFAULT_WORKER_IMAGE))
    parser.add_argument(
        "--prometheus-address", default=env("PROMETHEUS_ADDRESS", DEFAULT_PROMETHEUS_ADDRESS)
    )
    args = parser.parse_args(argv)
    namespaces = args.namespace or [ns for ns in (env("NAMESPACE") or "").split(",") if ns]
    return OperatorConfig(
        namespaces=tuple(namespaces),
        clusterwide=args.all_namespaces or not namespaces,
        peering=None if args.standalone else args.peering,
        priority=None if args.priority is None else int(args.priority),
        liveness_port=args.liveness_port or None,
        metrics_port=args.metrics_port or None,
        log_format=args.log_format,
        verbose=args.verbose,
        worker_image=args.worker_image,
        prometheus_address=args.prometheus_address,
    )


def build_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Handler chatter stays in logs; Events carry only what reconcile chose, plus failures.
    settings.posting.level = logging.WARNING
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="radixserve.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="radixserve.io", key="last-handled-configuration"
    )
    settings.peering.standalone = config.peering is None
    settings.peering.mandatory = config.peering is not None
    settings.peering.clusterwide = config.clusterwide
    if config.peering is not None:
        settings.peering.name = config.peering
        # Equal priorities make every kopf peer pause; distinct ones elect the highest.
        settings.peering.priority = (
            config.priority if config.priority is not None else random.randint(1, 2**31 - 1)
        )
    return settings


def run(
    config: OperatorConfig,
    *,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> None:
    """Run until stopped; ``stop_flag`` lets tests run and restart the real operator in a thread."""
    kopf.configure(
        verbose=config.verbose,
        log_format=kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL,
    )
    metrics_server = start_http_server(config.metrics_port)[0] if config.metrics_port else None
    try:
        kopf.run(
            clusterwide=config.clusterwide,
            namespaces=config.namespaces,
            standalone=config.peering is None,
            peering_name=config.peering,
            liveness_endpoint=(
                f"http://0.0.0.0:{config.liveness_port}/healthz" if config.liveness_port else None
            ),
            settings=build_settings(config),
            memo=kopf.Memo(
                worker_image=config.worker_image, prometheus_address=config.prometheus_address
            ),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()


def main(argv: Sequence[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
