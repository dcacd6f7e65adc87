"""MLA prefill attention, the Triton extend path against the torch loop it replaced: layers/mla.py's
`mla_extend` (the pass's latents gathered and expanded by kv_b_proj together, one launch of
kernels/mla_extend.py a group) against `mla_extend_native` (request by request: gather,
expand, SDPA), at DeepSeek-V2-Lite's 16 heads and V3's 128 (latent 512 + rope 64, key 128 +
64, value 128), bf16.

Workloads: an offline prefill pass (8 prompts of 256-1024 tokens, no prefix), chunks on
cached prefixes (4 requests x 512 new tokens on 4k), one 4k prompt. Each case prints the
time of both paths, the Triton path's share of the dense bf16 peak (the causal attention's
FLOPs, 2 x heads x (192 + 128) per visible key, plus kv_b_proj's expand, 2 x keys x 512 x
heads x 256), and the relative error between them.

Usage: python3 scripts/gpu/bench_mla_extend.py OUT.json  (one `===` line per case, ~20 s)
Without CUDA (a dry run): TRITON_INTERPRET=1, tiny shapes, timings meaningless.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

CUDA = __import__("torch").cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
from mla_extend_case import extend_case  # noqa: E402

from radixserve.kernels import triton_support  # noqa: E402
from radixserve.layers import mla  # noqa: E402

# latent, rope, nope, value
SIZES = (512, 64, 128, 128) if CUDA else (32, 8, 16, 16)
DTYPE = torch.bfloat16 if CUDA else torch.float32
DEVICE = "cuda" if CUDA else "cpu"
PEAK_BF16_FLOPS = 989e12  # H200 SXM, dense bf16 tensor cores
WORKLOADS = {
    "offline pass, 8 prompts": ([0] * 8, [256, 1024, 640, 512, 900, 300, 768, 720]),
    "4 chunks of 512 on 4k prefixes": ([4096] * 4, [512] * 4),
    "one 4k prompt": ([0], [4096]),
}
if not CUDA:
    WORKLOADS = {
        name: ([p // 64 for p in pre], [max(1, n // 64) for n in new])
        for name, (pre, new) in WORKLOADS.items()
    }


def timed(fn: Callable[[], torch.Tensor], iters: int = 10) -> float:
    """Seconds a call, eager (as a prefill pass runs), after one warm-up call."""
    fn()
    if not CUDA:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def flops(prefix: list[int], new: list[int], heads: int) -> float:
    latent, rope, nope, v_dim = SIZES
    visible = sum(e * p + e * (e + 1) / 2 for p, e in zip(prefix, new, strict=True))
    keys = sum(prefix) + sum(new)
    return 2 * heads * visible * (nope + rope + v_dim) + 2 * keys * latent * heads * (nope + v_dim)


def triton_path(*args) -> torch.Tensor:
    """`mla_extend` on its Triton path (the interpreter's in a dry run)."""
    enabled_for = triton_support.enabled_for
    triton_support.enabled_for = lambda x: True
    try:
        return mla.mla_extend(*args)
    finally:
        triton_support.enabled_for = enabled_for


@torch.no_grad()
def main() -> None:
    latent, rope, nope, v_dim = SIZES
    scale = (nope + rope) ** -0.5
    results = []
    for heads in (16, 128):
        for name, (prefix, new) in WORKLOADS.items():
            case = extend_case(prefix, new, heads, latent, rope, nope, v_dim, DTYPE, DEVICE)
            args = (case.q, case.pool, case.batch, case.expand, latent, scale)
            fast = triton_path(*args)
            native = mla.mla_extend_native(*args)
            err = float((fast.float() - native.float()).norm() / native.float().norm())
            # one layer's cost: the pass's key groups, made once for all layers, stay cached
            fast_s = timed(lambda args=args: triton_path(*args))
            native_s = timed(lambda args=args: mla.mla_extend_native(*args))
            result = {
                "heads": heads,
                "workload": name,
                "triton_ms": fast_s * 1e3,
                "torch_ms": native_s * 1e3,
                "speedup": native_s / fast_s,
                "peak_share": flops(prefix, new, heads) / fast_s / PEAK_BF16_FLOPS,
                "rel_err": err,
            }
            results.append(result)
            print(
                f"=== {heads} heads, {name}: triton {result['triton_ms']:.3f} ms, torch loop "
                f"{result['torch_ms']:.3f} ms ({result['speedup']:.2f}x), "
                f"{100 * result['peak_share']:.1f}% of bf16 peak, rel err {err:.1e}",
                flush=True,
            )
    Path(sys.argv[1]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
