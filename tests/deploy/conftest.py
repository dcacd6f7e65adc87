"""Deploy tests: the chart, the Dockerfile's steps, promtool and a live Prometheus.

The PromQL contract and the dashboard generator are repository scripts, not packages: they are
loaded here once, under stable module names, for every test module to import.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_load("radixserve_promql_contract", REPO_ROOT / "prometheus" / "promql_contract.py")
_load("radixserve_dashboards_generate", REPO_ROOT / "dashboards" / "generate.py")
