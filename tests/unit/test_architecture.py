"""The architecture is a contract: `.importlinter` states the layers and forbids cycles, and
these tests prove the contract is live (it fails when the code breaks it), not decoration."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(root: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / ".importlinter")],
        cwd=root,
        env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """Both packages and the contract, copied so a test can break them."""
    shutil.copytree(ROOT / "worker" / "radixserve", tmp_path / "radixserve")
    shutil.copytree(ROOT / "operator" / "radixserve_operator", tmp_path / "radixserve_operator")
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def add_import(module: Path, statement: str) -> None:
    module.write_text(module.read_text() + f"\n{statement}  # noqa\n")


def test_the_tree_keeps_every_contract(tree_copy):
    result = lint(tree_copy, tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers(tree_copy):
    add_import(
        tree_copy / "radixserve/mem_cache/allocator.py", "import radixserve.managers.scheduler"
    )
    result = lint(tree_copy, tree_copy)
    assert result.returncode != 0
    assert "radixserve.mem_cache is not allowed to import radixserve.managers" in result.stdout


def test_a_cycle_inside_a_package_breaks_the_acyclic_contract(tree_copy):
    add_import(tree_copy / "radixserve/forward/mode.py", "import radixserve.forward.worker_batch")
    result = lint(tree_copy, tree_copy)
    assert result.returncode != 0
    assert "No cycles are allowed in radixserve.forward" in result.stdout


def test_an_operator_cycle_is_caught_too(tree_copy):
    add_import(tree_copy / "radixserve_operator/spec.py", "import radixserve_operator.reconcile")
    result = lint(tree_copy, tree_copy)
    assert result.returncode != 0
    assert "radixserve_operator.spec is not allowed to import" in result.stdout


def test_the_front_end_process_does_not_import_torch():
    """The HTTP process tokenizes and streams; torch loads only in the scheduler process."""
    code = (
        "import sys, radixserve.entrypoints.http_server, radixserve.entrypoints.arguments; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
