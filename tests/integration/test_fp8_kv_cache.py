"""--kv-cache-dtype fp8_e4m3 on the CPU (the torch_native backend reads the FP8 pool through
its scales): the pool stores one byte per value, and the logits of teacher-forced passes
(prefill, a chunk on the cached prefix, decode steps) stay within FP8's rounding of the
model-dtype cache's (cosine >= 0.99, the GPU benchmark's bar for FP8 weights). The kernels
themselves are checked exactly, on FP8-grid values, in tests/unit/test_triton_interpret.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from test_fused_ops import model_passes  # noqa: E402

from radixserve.model_executor.model_runner import ModelRunner  # noqa: E402
from radixserve.model_loader.loader import load_model_source  # noqa: E402
from radixserve.server_args import ServerArgs  # noqa: E402

pytestmark = pytest.mark.slow


def test_pool_is_fp8_and_half_the_bytes():
    pools = {}
    for kv in ("auto", "fp8_e4m3"):
        args = ServerArgs(
            model="random:tiny-gemma3", device="cpu", max_total_tokens=512, kv_cache_dtype=kv
        )
        runner = ModelRunner(args, load_model_source(args.model, device="cpu"))
        pools[kv] = runner.token_to_kv_pool
    fp8, full = pools["fp8_e4m3"], pools["auto"]
    assert fp8.is_fp8 and fp8.k_buffers[0].dtype == torch.float8_e4m3fn
    assert full.k_buffers[0].dtype == torch.float32  # the CPU's model dtype
    assert fp8.k_buffers[0].nbytes * 4 == full.k_buffers[0].nbytes


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gemma2", "tiny-qwen3-moe"])
def test_logits_stay_within_fp8_rounding(preset):
    model, lens = f"random:{preset}", [5, 40, 70]
    full = model_passes(model, "float32", "cpu", "torch_native", False, lens, decode_steps=4)
    fp8 = model_passes(
        model,
        "float32",
        "cpu",
        "torch_native",
        False,
        lens,
        decode_steps=4,
        kv_cache_dtype="fp8_e4m3",
    )
    for a, b in zip(fp8, full, strict=True):
        assert not torch.equal(a, b)  # the cache really is FP8
        assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() >= 0.99
