"""Run the fused kernels of kernels/fused_ops.py in Triton's CPU interpreter; print one JSON line.

Started by test_fused_ops_interpret.py in a subprocess, because TRITON_INTERPRET must be set
before any kernel module is imported and must not leak into the rest of the test session.
Float32 and float16 only: the interpreter's bf16 is unreliable, so bf16 is left to tests/gpu.
The comparisons are tests/gpu/test_fused_ops.py's, at small sizes; on top, a tiny Llama and
Qwen3 run their whole forward on the fused path (forced on, CPU tensors) against the torch path.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

import torch  # noqa: E402
from test_fused_ops import (  # noqa: E402
    _norm,
    check_rms_norm,
    check_rotary_and_store_kv,
    check_silu_and_mul,
    check_store_cells,
    fused_path,
    model_passes,
    rel_err,
)
from triton_interpret_check import _allow_one_element_index  # noqa: E402

from radixserve.layers.layernorm import GemmaRMSNorm, RMSNorm  # noqa: E402
from radixserve.layers.moe.router import RouterLinear  # noqa: E402
from radixserve.models.deepseek_v2 import DeepseekRouter  # noqa: E402
from radixserve.models.llama import LlamaDecoderLayer  # noqa: E402

DTYPES = (torch.float32, torch.float16)
# a prompt past the rotary kernel's one-head-per-program size, one below it, one of a few tokens
PROMPT_LENS = [3, 17, 70]


def kernel_results() -> list[dict]:
    """{case, dtype, errors: {metric: error}} for every kernel case, from one seeded generator."""
    gen = torch.Generator().manual_seed(0)
    results = []

    def add(case: str, dtype: torch.dtype, errors: dict[str, float]) -> None:
        results.append({"case": case, "dtype": str(dtype), "errors": errors})

    for dtype in DTYPES:
        for rows, hidden in ((1, 256), (300, 256), (5, 200)):
            add(f"rms_norm-{rows}x{hidden}", dtype, check_rms_norm(rows, hidden, dtype, "cpu", gen))
        for t, h, kvh, d in ((1, 8, 2, 64), (70, 3, 1, 32)):  # Qwen3's q/k norm in the rotary
            errors = check_rotary_and_store_kv(t, h, kvh, d, dtype, "cpu", gen, qk_norm_cls=RMSNorm)
            add(f"qk_norm_rotary-{t}-{h}/{kvh}-d{d}", dtype, errors)
        for t, d in ((1, 256), (300, 96)):
            add(f"silu_and_mul-{t}x{d}", dtype, check_silu_and_mul(t, d, dtype, "cpu", gen))
        # T=1 and T=7 take the one-head-per-program grid, T >= 65 the tiled one
        for t, h, kvh, d, pad in (
            (1, 8, 2, 64, 0),
            (7, 3, 1, 32, 2),
            (300, 8, 2, 64, 5),
            (130, 3, 1, 32, 3),
        ):
            errors = check_rotary_and_store_kv(t, h, kvh, d, dtype, "cpu", gen, pad)
            add(f"rotary-{t}-{h}/{kvh}-d{d}-pad{pad}", dtype, errors)
    errors = check_rotary_and_store_kv(9, 8, 2, 64, torch.float32, "cpu", gen, 1, torch.float16)
    add("rotary-into-float16-cache", torch.float32, errors)
    # (stores into an FP8 cache are checked on the GPU only: Triton 3.6's interpreter rounds
    # float32 -> float8 wrongly where the rounding carries into the exponent, 1.956 -> 1.0)
    for dtype in DTYPES:  # Gemma's (1 + w) norm, whole rows and per head
        errors = check_rms_norm(5, 200, dtype, "cpu", gen, GemmaRMSNorm)
        add("gemma_rms_norm-5x200", dtype, errors)
        errors = check_rotary_and_store_kv(7, 4, 2, 32, dtype, "cpu", gen, qk_norm_cls=GemmaRMSNorm)
        add("gemma_qk_norm_rotary-7-4/2-d32", dtype, errors)
    add("store_cells", torch.int32, check_store_cells("cpu", gen))
    return results


def model_results() -> list[dict]:
    """Fused forward vs the torch path, float32, four passes. Llama stores K/V for the
    torch_native backend, which reads them back from the pool; Qwen3 (q/k norm on views of qkv)
    for the triton one, which reads this pass's k and v as views of qkv. Qwen3-MoE runs its
    routing and experts through the fused MoE kernels (Gemma's and gpt-oss's fused paths are
    left to tests/gpu, whose model tests run them at size; their kernels' variants, windows,
    soft-caps, sinks and the biased clamped-SwiGLU experts, are checked here by
    triton_interpret_check.py and moe_interpret_check.py)."""
    results = []
    cases = (
        ("tiny-llama", "torch_native"),
        ("tiny-qwen3", "triton"),
        ("tiny-qwen3-moe", "triton"),
    )
    for preset, backend in cases:
        model = f"random:{preset}"
        native = model_passes(model, "float32", "cpu", "torch_native", False, PROMPT_LENS)
        fused = model_passes(model, "float32", "cpu", backend, True, PROMPT_LENS)
        pairs = list(zip(fused, native, strict=True))
        results.append(
            {
                "case": f"{preset}-{backend}",
                "rel_err": max(rel_err(f, n) for f, n in pairs),
                "same_argmax": all(torch.equal(f.argmax(-1), n.argmax(-1)) for f, n in pairs),
            }
        )
    return results


@torch.no_grad()
def router_results() -> list[dict]:
    """A MoE router's logits in the norm's launch (`norm_and_project`, as the decoder layer's
    `norm_before` asks at batch 1) against the norm's torch code and the router's torch
    product: Qwen3's plain router, gpt-oss's biased one, DeepSeek's float32 one, with and
    without the residual add; then the router called on another row than the norm's output
    must compute that row's logits itself (equal to its own fused-path call)."""
    gen = torch.Generator().manual_seed(1)
    config = SimpleNamespace(
        hidden_size=192,
        num_experts_per_tok=6,
        topk_method="greedy",
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
    )
    results = []
    for name, router, with_residual in (
        ("qwen3", RouterLinear(192, 128, bias=False), True),
        ("gpt-oss", RouterLinear(192, 32, bias=True), False),
        ("deepseek", DeepseekRouter(config, 64), True),
    ):
        with torch.no_grad():
            for param in router.parameters():
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
        if isinstance(router, RouterLinear):
            router.half()
            logits_of = router
        else:  # the float32 router: its logits, not its routing
            logits_of = lambda x, r=router: torch.nn.functional.linear(x.float(), r.weight)  # noqa: E731
        norm = _norm(192, torch.float16, "cpu", gen)
        x = torch.randn(1, 192, generator=gen).half()
        residual = torch.randn(1, 192, generator=gen).half() if with_residual else None
        with fused_path(True):
            r_in = residual.clone() if residual is not None else None
            normed, summed = LlamaDecoderLayer.norm_before(norm, router, x.clone(), r_in)
            took = router._after_norm is not None
            fused = router.logits_after_norm(normed)
        with fused_path(False):
            r_in = residual.clone() if residual is not None else None
            exp_normed, exp_summed = LlamaDecoderLayer.norm_before(norm, router, x.clone(), r_in)
            expected = logits_of(exp_normed)
        other = torch.randn(1, 192, generator=gen).half()
        with fused_path(True):
            fresh = logits_of(other)
            LlamaDecoderLayer.norm_before(norm, router, x.clone(), residual)
            stale = router(other) if isinstance(router, RouterLinear) else None
        results.append(
            {
                "case": name,
                "took_the_fused_norm": took,
                "dtype_same": fused is not None and fused.dtype == expected.dtype,
                "logits_rel_err": rel_err(fused, expected),
                "normed_rel_err": rel_err(normed, exp_normed),
                "residual_same": bool(torch.equal(summed, exp_summed)),
                "other_row_same": stale is None or bool(torch.equal(stale, fresh)),
            }
        )
    return results


def main() -> None:
    torch.set_num_threads(2)
    _allow_one_element_index()  # the triton attention backend's loops need it under numpy 2
    print(
        json.dumps(
            {"kernels": kernel_results(), "models": model_results(), "routers": router_results()}
        )
    )


if __name__ == "__main__":
    main()
