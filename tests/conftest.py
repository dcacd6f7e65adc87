"""Tests by kind, one directory each, each marked with its kind (`pytest -m unit`, ...):

- unit: fast, in-process, no network, no virtualenvs, no servers (`make test-fast`);
- integration: real worker processes, the operator against an emulated API server;
- deploy: the chart, the Dockerfile's steps, promtool and a live Prometheus;
- gpu: needs CUDA, skipped without it (run on the device machine).
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
KINDS = ("unit", "integration", "deploy", "gpu")
# The files that take minutes on a 2-core CPU machine, longest first. They are collected first:
# `make test` hands whole files to two pytest processes in collection order, and a long file
# handed out last would run alone at the end while the other process sits idle.
LONGEST_FIRST = (
    "integration/test_router_fleet.py",
    "integration/test_tensor_parallel.py",
    "deploy/test_dockerfile.py",
    "integration/test_server_structured.py",
    "integration/test_router_failover.py",
    "unit/test_fused_ops_interpret.py",
)


def _rank(item: pytest.Item) -> int:
    path = item.path.relative_to(TESTS).as_posix()
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = item.path.relative_to(TESTS).parts[0]
        if kind in KINDS:
            item.add_marker(kind)
    items.sort(key=_rank)  # stable: every file keeps its tests' order, the rest their own
