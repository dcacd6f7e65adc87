"""`--attention-backend auto` picks a backend that can run here without waiting for a compile:
FlashInfer only when every module the model needs is built (prebuilt or in its JIT cache);
otherwise triton, with a background build for the next start where nvcc exists, and a warning
that says why where it does not (a CUDA runtime image)."""

from __future__ import annotations

import importlib
import logging
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixserve.layers.attention import registry
from radixserve.layers.attention.registry import flashinfer_compiler_problem, resolve_backend_name


def package(root: Path, name: str, body: str = "") -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(body)
    importlib.invalidate_caches()  # the path finder may have listed `root` already


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def machine(tmp_path, monkeypatch) -> Iterator[Path]:
    """A machine with no CUDA toolkit anywhere FlashInfer looks, and a site folder on sys.path
    where a test installs (fake) flashinfer packages; none of them outlives the test."""
    for name in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_NVCC"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(registry, "DEFAULT_CUDA_HOME", str(tmp_path / "no-cuda"))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    names = ("flashinfer", registry.FLASHINFER_PREBUILT)
    real = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    yield tmp_path
    for name in names:
        sys.modules.pop(name, None)
    sys.modules.update(real)


@pytest.fixture
def modules(monkeypatch) -> dict:
    """FlashInfer's modules for the model, as a test sets them (`missing`), and the background
    builds started (`builds`): the real ones need a GPU and FlashInfer (tests/gpu)."""
    state: dict = {"missing": [], "builds": []}
    monkeypatch.setattr(registry, "missing_flashinfer_modules", lambda ctx: state["missing"])
    monkeypatch.setattr(registry, "start_flashinfer_build", state["builds"].append)
    return state


CONTEXT = object()  # stands for the model's AttentionContext, which the seams above receive


def test_the_cpu_takes_torch_native_and_refuses_gpu_backends():
    assert resolve_backend_name("auto", "cpu", CONTEXT) == "torch_native"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_backend_name("triton", "cpu", CONTEXT)
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        resolve_backend_name("flash", "cuda", CONTEXT)


def test_without_flashinfer_auto_is_triton(machine, modules):
    assert resolve_backend_name("auto", "cuda", CONTEXT) == "triton"


def test_a_runtime_image_without_nvcc_serves_on_triton_and_says_why(machine, modules, caplog):
    package(machine / "site", "flashinfer")
    modules["missing"] = ["batch_prefill_fa3"]
    problem = flashinfer_compiler_problem()
    assert problem is not None and "no nvcc" in problem and "flashinfer_jit_cache" in problem
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        assert resolve_backend_name("auto", "cuda", CONTEXT) == "triton"
    assert "triton, not FlashInfer" in caplog.text and "flashinfer-jit-cache" in caplog.text
    assert "batch_prefill_fa3" in caplog.text
    assert modules["builds"] == []  # nothing could build them


def test_modules_in_the_cache_make_auto_flashinfer_even_without_nvcc(machine, modules):
    """A warm JIT cache (the model-cache volume) needs no compiler."""
    package(machine / "site", "flashinfer")
    assert flashinfer_compiler_problem() is not None
    assert resolve_backend_name("auto", "cuda", CONTEXT) == "flashinfer"
    assert modules["builds"] == []


@pytest.mark.parametrize("where", ["CUDA_HOME", "CUDA_PATH", "PATH", "default", "FLASHINFER_NVCC"])
def test_nvcc_where_flashinfer_finds_it_builds_in_the_background_and_serves_triton(
    machine, modules, monkeypatch, caplog, where
):
    """No start waits for FlashInfer's compiler: this one serves on triton while its modules
    build, and the next (same cache, now holding them) is FlashInfer's."""
    package(machine / "site", "flashinfer")
    modules["missing"] = ["batch_prefill_fa2", "batch_prefill_fa3"]
    toolkit = machine / "toolkit"
    if where in ("CUDA_HOME", "CUDA_PATH"):
        executable(toolkit / "bin" / "nvcc")
        monkeypatch.setenv(where, str(toolkit))
    elif where == "PATH":
        executable(machine / "bin" / "nvcc")
    elif where == "default":
        executable(toolkit / "bin" / "nvcc")
        monkeypatch.setattr(registry, "DEFAULT_CUDA_HOME", str(toolkit))
    else:
        monkeypatch.setenv(where, str(executable(toolkit / "nvcc-13")))
    assert flashinfer_compiler_problem() is None
    with caplog.at_level(logging.INFO, logger=registry.__name__):
        assert resolve_backend_name("auto", "cuda", CONTEXT) == "triton"
    assert modules["builds"] == [CONTEXT]
    assert "batch_prefill_fa2, batch_prefill_fa3" in caplog.text and "next start" in caplog.text
    modules["missing"] = []
    assert resolve_backend_name("auto", "cuda", CONTEXT) == "flashinfer"
    assert modules["builds"] == [CONTEXT]


def test_only_tensor_parallel_rank_0_starts_the_build(machine, modules, monkeypatch, caplog):
    """Every rank needs the same modules: rank 0 builds them once for all, and says so once
    (two builds side by side in one cache clobber each other's dependency log)."""
    from radixserve.distributed import parallel_state

    package(machine / "site", "flashinfer")
    modules["missing"] = ["batch_prefill_fa3"]
    executable(machine / "bin" / "nvcc")
    monkeypatch.setattr(parallel_state, "tp_rank", lambda: 1)
    with caplog.at_level(logging.INFO, logger=registry.__name__):
        assert resolve_backend_name("auto", "cuda", CONTEXT) == "triton"
    assert modules["builds"] == [] and caplog.text == ""
    monkeypatch.setattr(parallel_state, "tp_rank", lambda: 0)
    assert resolve_backend_name("auto", "cuda", CONTEXT) == "triton"
    assert modules["builds"] == [CONTEXT]


def test_cuda_home_without_nvcc_in_it_is_a_problem(machine, modules, monkeypatch):
    """FlashInfer compiles with $CUDA_HOME/bin/nvcc: a CUDA_HOME that has none (a runtime
    image's /usr/local/cuda) cannot compile, whatever else is on PATH."""
    package(machine / "site", "flashinfer")
    (machine / "runtime-only").mkdir()
    monkeypatch.setenv("CUDA_HOME", str(machine / "runtime-only"))
    problem = flashinfer_compiler_problem()
    assert problem is not None and str(machine / "runtime-only") in problem
    modules["missing"] = ["batch_decode"]
    assert resolve_backend_name("auto", "cuda", CONTEXT) == "triton"
    assert modules["builds"] == []


def test_a_module_the_prebuilt_package_lacks_sends_auto_to_triton_without_nvcc(machine, modules):
    """The prebuilt package holds the common modules (they count as built, tests/gpu); one it
    lacks (an unusual head dim) cannot be built here, so this start is triton's, for good."""
    package(machine / "site", "flashinfer")
    package(machine / "site", registry.FLASHINFER_PREBUILT)
    assert resolve_backend_name("auto", "cuda", CONTEXT) == "flashinfer"
    modules["missing"] = ["batch_decode_head_dim_96"]
    assert resolve_backend_name("auto", "cuda", CONTEXT) == "triton"
    assert modules["builds"] == []


def test_a_flashinfer_that_does_not_import_leaves_auto_on_triton(machine, modules, caplog):
    package(machine / "site", "flashinfer", "raise ImportError('no tvm_ffi')\n")
    package(machine / "site", registry.FLASHINFER_PREBUILT)
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        assert resolve_backend_name("auto", "cuda", CONTEXT) == "triton"
    assert "no tvm_ffi" in caplog.text


def test_asking_for_flashinfer_stands_and_starts_no_background_build(machine, modules, caplog):
    """FlashInfer's own start builds what it lacks, or fails then (test_flashinfer_modules)."""
    package(machine / "site", "flashinfer")
    modules["missing"] = ["batch_decode"]
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        assert resolve_backend_name("flashinfer", "cuda", CONTEXT) == "flashinfer"
    assert caplog.text == "" and modules["builds"] == []


def test_flashinfer_is_imported_early_only_where_this_start_may_use_it(machine):
    from radixserve.layers.attention.registry import library_to_import_early

    assert library_to_import_early("auto", "cuda") is None  # not installed
    package(machine / "site", "flashinfer")
    assert library_to_import_early("auto", "cuda") == "flashinfer"
    assert library_to_import_early("flashinfer", "cuda") == "flashinfer"
    assert library_to_import_early("triton", "cuda") is None
    assert library_to_import_early("auto", "cpu") is None


def test_the_early_import_loads_the_module_and_leaves_a_failure_to_the_backend(
    machine, monkeypatch
):
    from radixserve.scheduler.scheduler_process import import_on_thread

    uncaught: list = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    package(machine / "site", "flashinfer", "LOADED = True\n")
    import_on_thread("flashinfer").join(timeout=30)
    assert sys.modules["flashinfer"].LOADED
    package(machine / "site", "broken_kernels", "raise ImportError('no libcuda')\n")
    import_on_thread("broken_kernels").join(timeout=30)  # nothing raised on the thread
    assert "broken_kernels" not in sys.modules and not uncaught
    with pytest.raises(ImportError, match="no libcuda"):
        importlib.import_module("broken_kernels")
