"""The skinny GEMM (2-16 rows), run on the CPU by Triton's interpreter, against a float64
reference; and `linear`'s dispatch, which leaves every case off CUDA to F.linear."""

from __future__ import annotations

import re

import pytest
import torch
from interpreter_harness import run_interpreted

from radixserve.kernels.skinny_gemm import MAX_ROWS, skinny_tile

FLOAT16_TOLERANCE = 1e-3


def test_skinny_gemm_matches_float64_reference():
    pytest.importorskip("triton")
    result = run_interpreted("skinny_interpret_check.py")
    assert len(result["plain"]) == 10
    for case in result["plain"]:
        m, n, _ = case["shape"]
        assert case["out_shape"] == [m, n] and case["out_dtype"] == "torch.float16", case
        assert case["rel_err"] < FLOAT16_TOLERANCE, case
        assert case["rows_independent"], case
    assert result["strided"] and result["widened"]
    assert len(result["gated"]) == 4
    for case in result["gated"]:
        m, n, _ = case["shape"]
        assert case["out_shape"] == [m, n // 2], case
        assert case["same_as_two_kernels"], case
        assert case["rel_err"] < FLOAT16_TOLERANCE, case


def test_skinny_gemm_takes_only_few_half_precision_rows_of_a_tabled_shape(monkeypatch):
    from radixserve.kernels import skinny_gemm, triton_support

    w = torch.randn(64, 32, dtype=torch.bfloat16)
    rows = lambda m, dtype=torch.bfloat16: torch.randn(m, 32, dtype=dtype)  # noqa: E731
    plain, gated = (16, 32, 4, 4), (16, 64, 4, 2)
    monkeypatch.setattr(
        skinny_gemm, "_device_tiles", lambda index: {(64, 32, False): plain, (32, 32, True): gated}
    )
    assert skinny_tile(rows(4), w) is None  # off CUDA: F.linear
    monkeypatch.setattr(triton_support, "enabled_for", lambda x: True)
    assert [m for m in range(1, MAX_ROWS + 3) if skinny_tile(rows(m), w)] == list(
        range(2, MAX_ROWS + 1)
    )
    assert skinny_tile(rows(4), w) == plain
    assert skinny_tile(rows(4), w, gated=True) == gated  # keyed by the gated product's half
    assert skinny_tile(rows(4), w[:48]) is None  # a shape the device's table does not name
    assert skinny_tile(rows(4, torch.float32), w.float()) is None  # the exactness reference
    assert skinny_tile(rows(4), w.to(torch.float8_e4m3fn)) is None  # FP8 keeps its own path
    assert skinny_tile(rows(4), w.t().contiguous().t()) is None  # weight rows not unit-stride


def test_every_tabled_tile_fits_an_sm_s_shared_memory():
    """Each stage holds a weight chunk (two for the gated [gate; up]) and the rows' chunk padded
    to 16, in half precision: a tile past Hopper's 227 KB a program would fail at launch."""
    from radixserve.kernels.skinny_gemm import SKINNY_TILES

    for tiles in SKINNY_TILES.values():
        for (_, k, gated), (block_n, block_k, _, stages) in tiles.items():
            stage_bytes = 2 * ((1 + gated) * block_n * block_k + block_k * MAX_ROWS)
            assert stages * stage_bytes <= 227 * 1024 and block_k <= k


def test_compiled_for_hopper_it_pipelines_through_shared_memory_and_launches_plainly():
    """The weight chunks arrive as cp.async copies into shared memory (the pipeline that keeps
    the bytes in flight out of registers), and there is no grid-dependency control: this is the
    one Triton kernel of the step launched plainly (as a programmatic dependent it measured
    slower: the module's docstring). Compiling needs no GPU (Triton ships ptxas)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixserve.kernels.skinny_gemm import SKINNY_TILES, _skinny_gemm_kernel

    block_n, block_k, warps, stages = SKINNY_TILES["NVIDIA H100 80GB HBM3"][(14336, 4096, True)]
    constexprs = {
        "HAS_BIAS": True,
        "GATED": True,
        "EVEN_K": True,
        "BLOCK_M": MAX_ROWS,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "NUM_STAGES": stages,
    }
    names = _skinny_gemm_kernel.arg_names
    signature = {
        arg: "constexpr"
        if arg in constexprs
        else "i32"
        if arg in "MNK" or arg.startswith("stride")
        else "*bf16"
        for arg in names
    }
    # pointers and sizes divisible by 16, as a launch on the 8B shapes specializes them
    attrs = {
        (i,): [["tt.divisibility", 16]] for i, arg in enumerate(names) if arg not in constexprs
    }
    source = ASTSource(
        fn=_skinny_gemm_kernel, signature=signature, constexprs=constexprs, attrs=attrs
    )
    target = GPUTarget("cuda", 90, 32)
    ptx = triton.compile(source, target=target, options={"num_warps": warps}).asm["ptx"]
    assert re.search(r"\bcp\.async\.c[ag]\b", ptx)
    assert "griddepcontrol" not in ptx
