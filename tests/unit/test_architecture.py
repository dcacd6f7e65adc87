"""The architecture is a contract: `.importlinter` states the layers and forbids cycles, and
these tests prove the contract is live (it fails when the code breaks it), not decoration."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(root: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(root / ".importlinter")],
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
        tree_copy / "radixserve/mem_cache/allocator.py", "import radixserve.scheduler.scheduler"
    )
    result = lint(tree_copy, tree_copy)
    assert result.returncode != 0
    assert "radixserve.mem_cache is not allowed to import radixserve.scheduler" in result.stdout


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


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("import torch", "radixserve.frontend is not allowed to import torch"),
        (
            "import radixserve.scheduler.tp_worker",
            "radixserve.frontend is not allowed to import radixserve.scheduler",
        ),
        (
            "import radixserve.model_loader.tokenizer",
            "radixserve.frontend is not allowed to import radixserve.model_loader",
        ),
    ],
)
def test_the_front_end_contract_fails_on_torch_or_the_engine(tree_copy, statement, message):
    add_import(tree_copy / "radixserve/frontend/detokenizer.py", statement)
    result = lint(tree_copy, tree_copy)
    assert result.returncode != 0
    assert message in result.stdout


def test_a_kernel_importing_a_layer_breaks_the_kernels_contract(tree_copy):
    add_import(tree_copy / "radixserve/kernels/argmax.py", "import radixserve.layers.sampler")
    result = lint(tree_copy, tree_copy)
    assert result.returncode != 0
    assert "radixserve.kernels is not allowed to import radixserve.layers" in result.stdout


def test_the_operator_reaches_the_worker_only_through_the_contract(tree_copy):
    add_import(tree_copy / "radixserve_operator/spec.py", "import radixserve.server_args")
    result = lint(tree_copy, tree_copy)
    assert result.returncode != 0
    assert "radixserve_operator is not allowed to import radixserve.server_args" in result.stdout


WORKER = ROOT / "worker" / "radixserve"


def test_entrypoints_hold_entry_points_only():
    """Benchmark drivers live in `bench/`, the server harness beside them."""
    assert sorted(p.name for p in (WORKER / "entrypoints").glob("*.py")) == [
        "__init__.py",
        "cli.py",
        "server_launch.py",
    ]


def test_every_triton_kernel_sits_in_the_kernels_package():
    outside = [
        str(path.relative_to(WORKER))
        for path in WORKER.rglob("*.py")
        if path.parent.name != "kernels"
        and ("@triton.jit" in path.read_text() or "\n@jit" in path.read_text())
    ]
    assert outside == []
    assert any("@jit" in p.read_text() for p in (WORKER / "kernels").glob("*.py"))


def test_the_tree_carries_no_patch_files():
    tracked = subprocess.run(
        ["git", "ls-files", "*.patch", "*.diff"], cwd=ROOT, capture_output=True, text=True
    )
    assert tracked.returncode == 0
    assert tracked.stdout == ""


def test_the_front_end_process_does_not_import_torch():
    """The HTTP process tokenizes and streams; torch loads only in the scheduler process."""
    code = (
        "import sys, radixserve.frontend.http_server, radixserve.contract; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_the_scheduler_process_imports_no_compiler_stack_nor_model_zoo():
    """What the scheduler process imports before it loads a model is its start's `imports`
    phase, paid from a cold disk on a new node: torch's compiler stack (torch._dynamo, sympy:
    about 800 modules) and transformers' model implementations serve nothing there. The entry
    point is imported as the front end's spawn does."""
    code = (
        "import importlib, json, sys\n"
        "from radixserve.boundary import SCHEDULER_ENTRY_POINT\n"
        "importlib.import_module(SCHEDULER_ENTRY_POINT.split(':')[0])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    modules = json.loads(result.stdout)
    heavy = ("sympy", "torch._dynamo", "torch._inductor", "transformers.modeling_utils")
    assert [m for m in modules if m.split(".")[0] == "sympy" or m.startswith(heavy)] == []
    # of the model zoo, only the Auto registries and configurations (a checkpoint's config is
    # read with AutoConfig at model setup)
    zoo = [m for m in modules if m.startswith("transformers.models.")]
    assert [
        m
        for m in zoo
        if not m.startswith("transformers.models.auto")
        and m.count(".") == 3
        and not m.rsplit(".", 1)[1].startswith("configuration_")
    ] == []
    assert "torch" in modules  # the check is not vacuous: this is the process that has torch
