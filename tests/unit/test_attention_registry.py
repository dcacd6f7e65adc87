"""`--attention-backend auto` picks a backend that can run here: FlashInfer only where it can
have its kernels (prebuilt, or nvcc to compile them), so a CUDA runtime image without a
toolkit serves on triton instead of dying at its first kernel compile."""

from __future__ import annotations

import importlib
import logging
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixserve.layers.attention import registry
from radixserve.layers.attention.registry import flashinfer_kernels_problem, resolve_backend_name


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


def test_the_cpu_takes_torch_native_and_refuses_gpu_backends():
    assert resolve_backend_name("auto", "cpu") == "torch_native"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_backend_name("triton", "cpu")
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        resolve_backend_name("flash", "cuda")


def test_without_flashinfer_auto_is_triton(machine):
    assert resolve_backend_name("auto", "cuda") == "triton"


def test_a_runtime_image_without_nvcc_serves_on_triton_and_says_why(machine, caplog):
    package(machine / "site", "flashinfer")
    problem = flashinfer_kernels_problem()
    assert problem is not None and "no nvcc" in problem and "flashinfer_jit_cache" in problem
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        assert resolve_backend_name("auto", "cuda") == "triton"
    assert "triton, not FlashInfer" in caplog.text and "flashinfer-jit-cache" in caplog.text


@pytest.mark.parametrize("where", ["CUDA_HOME", "CUDA_PATH", "PATH", "default", "FLASHINFER_NVCC"])
def test_nvcc_where_flashinfer_finds_it_makes_auto_flashinfer(machine, monkeypatch, where):
    package(machine / "site", "flashinfer")
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
    assert flashinfer_kernels_problem() is None
    assert resolve_backend_name("auto", "cuda") == "flashinfer"


def test_cuda_home_without_nvcc_in_it_is_a_problem(machine, monkeypatch):
    """FlashInfer compiles with $CUDA_HOME/bin/nvcc: a CUDA_HOME that has none (a runtime
    image's /usr/local/cuda) cannot compile, whatever else is on PATH."""
    package(machine / "site", "flashinfer")
    (machine / "runtime-only").mkdir()
    monkeypatch.setenv("CUDA_HOME", str(machine / "runtime-only"))
    problem = flashinfer_kernels_problem()
    assert problem is not None and str(machine / "runtime-only") in problem
    assert resolve_backend_name("auto", "cuda") == "triton"


def test_prebuilt_kernels_need_no_nvcc(machine):
    package(machine / "site", "flashinfer")
    package(machine / "site", registry.FLASHINFER_PREBUILT)
    assert flashinfer_kernels_problem() is None
    assert resolve_backend_name("auto", "cuda") == "flashinfer"


def test_a_flashinfer_that_does_not_import_leaves_auto_on_triton(machine, caplog):
    package(machine / "site", "flashinfer", "raise ImportError('no tvm_ffi')\n")
    package(machine / "site", registry.FLASHINFER_PREBUILT)
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        assert resolve_backend_name("auto", "cuda") == "triton"
    assert "no tvm_ffi" in caplog.text


def test_asking_for_flashinfer_without_its_kernels_warns_and_keeps_the_choice(machine, caplog):
    """A warm kernel cache may hold every kernel it needs, so an explicit choice stands."""
    package(machine / "site", "flashinfer")
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        assert resolve_backend_name("flashinfer", "cuda") == "flashinfer"
    assert "no nvcc" in caplog.text
