"""FlashInfer's modules for a model, built before they are needed: side by side at an explicit
FlashInfer start (or one clear error without a compiler), and in a background process for
`auto`'s next start. FlashInfer's own specs need it and a GPU (tests/gpu checks that the
modules named here are the ones its plans load); these fakes stand in for them."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import types

import pytest

from radixserve.layers.attention import flashinfer_backend, flashinfer_kernels, registry
from radixserve.layers.attention.flashinfer_kernels import KernelSignature

SIGNATURE = KernelSignature(
    q_dtype="bfloat16",
    kv_dtype="bfloat16",
    head_dim=128,
    tensor_core_decode=True,
    prefill_backend="fa3",
    variants=((False, False), (True, True)),
    cuda_arch="9.0a",
)


class FakeSpec:
    """A FlashInfer JitSpec's surface: a name, whether it is prebuilt or compiled."""

    def __init__(self, name: str, built: bool = False):
        self.name = name
        self.is_aot = False
        self.is_compiled = built
        self.builds = 0


@pytest.fixture(autouse=True)
def ninja_runs(monkeypatch) -> list[list[str]]:
    """FlashInfer's build_jit_specs stand-in: the modules of each ninja run, built."""
    runs: list[list[str]] = []

    def build_jit_specs(specs):
        runs.append([spec.name for spec in specs])
        for spec in specs:
            spec.builds += 1
            spec.is_compiled = True

    monkeypatch.setattr(flashinfer_kernels, "_build_jit_specs", build_jit_specs)
    return runs


def test_missing_is_what_is_neither_prebuilt_nor_compiled():
    prebuilt, compiled, absent = FakeSpec("a"), FakeSpec("b", built=True), FakeSpec("c")
    prebuilt.is_aot = True
    assert flashinfer_kernels.missing([prebuilt, compiled, absent]) == [absent]


def test_build_runs_every_module_in_one_ninja_run(ninja_runs):
    """One ninja process for all of them: their sources compile side by side, and one process
    owns the build directory's dependency log (ninjas side by side lost it: rebuilt later)."""
    specs = [FakeSpec(name) for name in ("decode", "prefill", "window")]
    assert flashinfer_kernels.build(specs) >= 0
    assert ninja_runs == [["decode", "prefill", "window"]]
    assert [spec.builds for spec in specs] == [1, 1, 1]
    assert flashinfer_kernels.build([]) >= 0 and len(ninja_runs) == 1


@pytest.fixture
def model_specs(monkeypatch) -> list[FakeSpec]:
    specs = [FakeSpec("batch_prefill_fa2"), FakeSpec("batch_prefill_fa3", built=True)]
    monkeypatch.setattr(KernelSignature, "of", classmethod(lambda cls, ctx: SIGNATURE))
    monkeypatch.setattr(KernelSignature, "specs", lambda self: specs)
    return specs


def test_an_explicit_flashinfer_start_builds_what_is_missing(model_specs, monkeypatch, ninja_runs):
    monkeypatch.setattr(registry, "flashinfer_compiler_problem", lambda: None)
    flashinfer_backend._build_missing_modules(object())
    assert ninja_runs == [["batch_prefill_fa2"]]
    flashinfer_backend._build_missing_modules(object())  # nothing left to build
    assert ninja_runs == [["batch_prefill_fa2"]]


def test_with_tensor_parallelism_rank_0_builds_and_every_rank_waits_for_it(
    model_specs, monkeypatch, ninja_runs
):
    """Ranks need the same modules: one ninja run in the shared cache, not one per rank."""
    events: list[str] = []
    monkeypatch.setattr(registry, "flashinfer_compiler_problem", lambda: None)
    monkeypatch.setattr(flashinfer_backend, "barrier", lambda: events.append("barrier"))
    monkeypatch.setattr(flashinfer_backend, "tp_rank", lambda: 1)
    flashinfer_backend._build_missing_modules(object())
    assert ninja_runs == [] and events == ["barrier"]
    monkeypatch.setattr(flashinfer_backend, "tp_rank", lambda: 0)
    flashinfer_backend._build_missing_modules(object())
    assert ninja_runs == [["batch_prefill_fa2"]] and events == ["barrier", "barrier"]


def test_an_explicit_flashinfer_start_without_a_compiler_fails_in_one_line(
    model_specs, monkeypatch
):
    monkeypatch.setattr(registry, "flashinfer_compiler_problem", lambda: "no nvcc in PATH")
    with pytest.raises(RuntimeError, match=r"needs the modules batch_prefill_fa2: no nvcc"):
        flashinfer_backend._build_missing_modules(object())
    assert model_specs[0].builds == 0


def test_the_background_build_runs_apart_without_the_gpu(model_specs, monkeypatch, caplog):
    """The builder is a separate process given the signature as JSON and the GPU target in
    FLASHINFER_CUDA_ARCH_LIST (so FlashInfer never asks CUDA); run here in-process, it rebuilds
    the same signature and builds what is missing, niced."""
    started = {}

    class FakeProcess:
        def __init__(self, argv, **kw):
            started.update(argv=argv, **kw)

        def wait(self):
            started["reaped"] = True

    monkeypatch.setattr(flashinfer_kernels.subprocess, "Popen", FakeProcess)
    niced = []
    monkeypatch.setattr(os, "nice", niced.append)
    flashinfer_kernels.build_in_background(SIGNATURE)
    for _ in range(100):  # the reaper thread waits on the child
        if started.get("reaped"):
            break
        time.sleep(0.01)
    assert started.get("reaped")
    argv = started["argv"]
    assert argv[1:3] == ["-m", "radixserve.layers.attention.flashinfer_kernels"]
    assert started["env"]["FLASHINFER_CUDA_ARCH_LIST"] == "9.0a"
    assert json.loads(argv[3])["variants"] == [[False, False], [True, True]]
    rebuilt = []
    monkeypatch.setattr(KernelSignature, "specs", lambda self: rebuilt.append(self) or model_specs)
    with caplog.at_level("INFO", logger=flashinfer_kernels.__name__):
        assert flashinfer_kernels._main(argv[3:]) == 0
    assert rebuilt == [SIGNATURE] and niced == [10]
    assert [spec.builds for spec in model_specs] == [1, 0]
    assert "built 1 FlashInfer modules" in caplog.text and "batch_prefill_fa2" in caplog.text


def test_specs_name_each_plans_module_once_per_process(monkeypatch):
    """Tensor-core decode loads FA2's prefill module, CUDA-core decode the decode module; the
    prefill takes the signature's backend; variants sharing flags share modules. Generated
    once a process (FlashInfer writes sources for each): auto's choice and the backend ask."""
    made = []

    def gen_prefill(backend, q, kv, o, idx, d_qk, d_vo, pos, window, cap, fp16_qk):
        made.append(("prefill", backend, window, cap))
        return FakeSpec(f"prefill_{backend}_{window}_{cap}")

    def gen_decode(q, kv, o, idx, d_qk, d_vo, pos, window, cap):
        made.append(("decode", window, cap))
        return FakeSpec(f"decode_{window}_{cap}")

    fake = types.ModuleType("flashinfer.jit.attention.modules")
    fake.gen_batch_prefill_module, fake.gen_batch_decode_module = gen_prefill, gen_decode
    for name in ("flashinfer", "flashinfer.jit", "flashinfer.jit.attention"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    flashinfer_kernels._specs.cache_clear()
    try:
        names = [spec.name for spec in SIGNATURE.specs()]
        assert names == [
            "prefill_fa2_False_False",
            "prefill_fa3_False_False",
            "prefill_fa2_True_True",
            "prefill_fa3_True_True",
        ]
        assert SIGNATURE.specs() is SIGNATURE.specs() and len(made) == 4
        mha = dataclasses.replace(SIGNATURE, tensor_core_decode=False, variants=((False, False),))
        assert [spec.name for spec in mha.specs()] == [
            "decode_False_False",
            "prefill_fa3_False_False",
        ]
    finally:
        flashinfer_kernels._specs.cache_clear()


def test_fp8_kv_under_bf16_queries_prefills_on_fa2(monkeypatch):
    """FA3 has no bf16 x e4m3 product on Hopper: an FP8 pool under bf16 queries takes FA2
    (without asking FlashInfer), and same-dtype pools take what FlashInfer's `auto` picks."""
    import torch

    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    context = types.SimpleNamespace(device="cuda:0", dtype=bf16, kv_dtype=fp8)
    monkeypatch.setitem(sys.modules, "flashinfer.utils", None)  # importing it would fail
    assert flashinfer_kernels.prefill_backend(context) == "fa2"

    asked = []

    def determine_attention_backend(device, pos_encoding, fp16_qk, custom_mask, q, kv):
        asked.append((q, kv))
        return "fa3"

    fake = types.ModuleType("flashinfer.utils")
    fake.determine_attention_backend = determine_attention_backend
    monkeypatch.setitem(sys.modules, "flashinfer.utils", fake)
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    same = types.SimpleNamespace(device="cuda:0", dtype=bf16, kv_dtype=bf16)
    assert flashinfer_kernels.prefill_backend(same) == "fa3"
    assert asked == [(bf16, bf16)]
