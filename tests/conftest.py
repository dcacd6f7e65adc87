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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = item.path.relative_to(TESTS).parts[0]
        if kind in KINDS:
            item.add_marker(kind)
