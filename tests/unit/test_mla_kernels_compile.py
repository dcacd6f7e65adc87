"""The MLA decode and extend kernels' default tiles compiled for Hopper (no GPU needed: Triton
ships ptxas): above 16 heads the decode's heads are the rows of Hopper's wgmma, and the
extend's products are wgmma at every head count (a fallback to mma.sync would keep a kernel
correct and several times slower, which only a GPU benchmark would show), and every default
tile fits an H100/H200 block's shared memory (a larger one fails only at launch, on the
GPU)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from radixserve.kernels import mla_decode, mla_extend  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
HOPPER_SHARED_BYTES = 232448  # the opt-in maximum of one block on sm_90 (227 KB)
POINTERS = {
    "Req_to_token": "*i32",
    "Req_pool_indices": "*i64",
    "Seq_lens": "*i64",
    "Mid_O": "*fp32",
    "Mid_Lse": "*fp32",
    "Kv_start": "*i64",
    "Prefix_lens": "*i64",
    "Extend_lens": "*i64",
    "Q_start": "*i64",
}


def _compile(kernel, constexprs: dict, num_warps: int, num_stages: int):
    signature = {}
    for arg in kernel.arg_names:
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif arg[0].isupper():
            signature[arg] = POINTERS.get(arg, "*bf16")
        else:
            signature[arg] = "fp32" if arg == "sm_scale" else "i32"
    # pointers and strides divisible by 16, as DeepSeek's shapes specialize them
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, arg in enumerate(kernel.arg_names)
        if signature[arg].startswith("*") or arg.startswith("stride")
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(source, target=HOPPER, options=options)


def compiled(heads: int):
    """Stage 1 as DeepSeek's bf16 decode launches it (latent 512 + rope 64)."""
    config = mla_decode.default_config(heads, torch.bfloat16)
    constexprs = {
        "LATENT": 512,
        "ROPE": 64,
        "BLOCK_C": 512,
        "BLOCK_R": 64,
        "BLOCK_H": config.block_h,
        "BLOCK_N": config.block_n,
        "MIN_SPLIT": 64,
        "DOT_PRECISION": "tf32",
        "PDL": True,  # as Hopper launches it
    }
    kernel = mla_decode._mla_decode_split_kernel
    return _compile(kernel, constexprs, config.num_warps, config.num_stages)


@pytest.mark.parametrize("heads", [16, 128])
def test_default_tiles_compile_for_hopper_within_shared_memory(heads: int) -> None:
    kernel = compiled(heads)
    assert kernel.metadata.shared <= HOPPER_SHARED_BYTES, kernel.metadata.shared
    wgmma = "ttng.warp_group_dot" in kernel.asm["ttgir"]
    assert wgmma == (mla_decode.default_config(heads, torch.bfloat16).block_h >= 64), heads


def test_extend_tile_compiles_for_hopper_within_shared_memory() -> None:
    """The extend kernel as DeepSeek's bf16 prefill launches it (key 128 + 64, value 128)."""
    block_m, block_n, num_warps, num_stages = mla_extend.tile_config(torch.bfloat16)
    constexprs = {
        "D_NOPE": 128,
        "D_ROPE": 64,
        "D_V": 128,
        "BLOCK_NOPE": 128,
        "BLOCK_ROPE": 64,
        "BLOCK_V": 128,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "DOT_PRECISION": "tf32",
    }
    kernel = _compile(mla_extend._mla_extend_kernel, constexprs, num_warps, num_stages)
    assert kernel.metadata.shared <= HOPPER_SHARED_BYTES, kernel.metadata.shared
    assert "ttng.warp_group_dot" in kernel.asm["ttgir"]
