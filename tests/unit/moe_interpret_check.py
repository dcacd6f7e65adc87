"""Run the fused MoE kernels in Triton's CPU interpreter; print one JSON result line.

Started by test_moe_interpret.py in a subprocess: TRITON_INTERPRET must be set before the
kernel module is imported and must not leak into the rest of the test session."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from triton_interpret_check import _allow_one_element_index  # noqa: E402

from radixserve.kernels.fused_moe import (  # noqa: E402
    align_by_expert,
    fused_moe,
    max_padded_pairs,
    select_experts,
    select_experts_native,
    select_experts_noaux_tc,
    topk_sum,
)
from radixserve.kernels.moe_experts import mxfp4_tile  # noqa: E402
from radixserve.kernels.moe_gemv import GemvTiles, fused_moe_gemv, router_gemv  # noqa: E402
from radixserve.kernels.triton_support import jit, tl  # noqa: E402
from radixserve.layers.moe.reference import fused_moe_native  # noqa: E402
from radixserve.layers.moe.routing import grouped_topk  # noqa: E402
from radixserve.layers.quantization.fp8 import quantize_rows  # noqa: E402
from radixserve.layers.quantization.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402

_allow_one_element_index()
gen = torch.Generator().manual_seed(0)


def randn(*shape: int, dtype: torch.dtype = torch.float32, std: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * std).to(dtype)


def routing_logits(tokens: int, experts: int, used: list[int] | None) -> torch.Tensor:
    """Random router logits; with `used`, every other expert is out of reach (no token)."""
    logits = randn(tokens, experts)
    if used is not None:
        idle = torch.ones(experts, dtype=torch.bool)
        idle[used] = False
        logits[:, idle] = -30.0
    return logits


def oss_experts(tokens: int, experts: int, hidden: int, inter: int, dtype: torch.dtype):
    """Random gpt-oss-style inputs: x, w13, w2 and their biases, scaled so that the clamped
    SwiGLU's low test limit bites."""
    x = randn(tokens, hidden, dtype=dtype)
    w13 = randn(experts, 2 * inter, hidden, dtype=dtype, std=0.3)
    w2 = randn(experts, hidden, inter, dtype=dtype, std=0.2)
    return x, w13, w2, randn(experts, 2 * inter, dtype=dtype), randn(experts, hidden, dtype=dtype)


def oss_reference(x, w13, w2, weights, ids, b13, b2, swiglu=(1.702, 1.5)) -> torch.Tensor:
    """gpt-oss's experts (biases after both products, the clamped SwiGLU) in float64: the
    reference of every biased case (w13 and w2 as given, e.g. already dequantized)."""
    return fused_moe_native(
        x.double(),
        w13.double(),
        w2.double(),
        weights.double(),
        ids,
        "swiglu_oai",
        w13_bias=b13.double(),
        w2_bias=b2.double(),
        swiglu=swiglu,
    )


def check_alignment(topk_ids: torch.Tensor, experts: int, block_m: int) -> dict:
    use = torch.zeros(2, dtype=torch.int64)
    align = align_by_expert(topk_ids.to(torch.int32), experts, block_m, use)
    flat = topk_ids.reshape(-1)
    numel = flat.numel()
    used = int(align.num_padded[0])
    ids, owners = align.sorted_ids[:used], align.expert_ids
    pairs = ids[ids < numel]
    counts = torch.bincount(flat, minlength=experts)
    expected_padded = int(((counts + block_m - 1) // block_m * block_m).sum())
    blocks_ok = all(
        bool((flat[ids[b * block_m : (b + 1) * block_m]] == owners[b]).all())
        for b in range(used // block_m)
        if (ids[b * block_m : (b + 1) * block_m] < numel).all()
    )
    # every padding row sits in its expert's last block, after the pairs
    return {
        "pairs_once": sorted(pairs.tolist()) == list(range(numel)),
        # by expert, then in pair order: the same sort whatever the programs' timing
        "stable_order": pairs.tolist() == sorted(range(numel), key=lambda p: (int(flat[p]), p)),
        "padding_only_numel": bool((ids[ids >= numel] == numel).all()),
        "tail_padding": bool((align.sorted_ids[used:] == numel).all()),
        "num_padded": used == expected_padded,
        "within_bound": used <= max_padded_pairs(numel, experts, block_m),
        "blocks_owned": blocks_ok
        and all(int(owners[b]) == int(flat[ids[b * block_m]]) for b in range(used // block_m)),
        "unused_blocks": bool((owners[used // block_m :] == -1).all()),
        "expert_use": use.tolist() == [int((counts > 0).sum()), 1],
    }


results = {"routing": [], "alignment": [], "moe": []}
# routing: softmax + top-k (+ renormalise, + round) against torch
for tokens, experts, top_k, renorm, round_to in [
    (7, 8, 2, True, False),
    (5, 60, 8, False, True),
    (3, 128, 8, True, True),
]:
    if round_to:  # half-precision logits, all distinct (ties would leave the order open)
        order = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])
        logits = (order * 0.01).to(torch.float16)
    else:
        logits = randn(tokens, experts)
    w, ids = select_experts(logits, top_k, renorm, round_to)
    w_ref, ids_ref = select_experts_native(logits, top_k, renorm, round_to)
    results["routing"].append(
        {
            "case": [tokens, experts, top_k, renorm, round_to],
            "same_ids": bool(torch.equal(ids.long(), ids_ref.long())),
            "max_weight_err": float((w - w_ref).abs().max()),
        }
    )

# alignment: random routings, some with idle experts, block sizes 4, 16 and 64; the last
# has more pairs (2,400) than an align program reads at a time
for tokens, experts, top_k, block_m, used in [
    (1, 8, 2, 16, None),
    (9, 8, 2, 4, [1, 6]),
    (70, 16, 4, 16, None),
    (33, 64, 8, 4, list(range(0, 64, 5))),
    (300, 128, 8, 64, list(range(0, 128, 3))),
]:
    logits = routing_logits(tokens, experts, used)
    _, ids = select_experts_native(logits, top_k, True, False)
    results["alignment"].append(
        {"case": [tokens, experts, top_k, block_m]} | check_alignment(ids, experts, block_m)
    )

# the whole layer against the reference, float32 and float16, idle experts included
for tokens, experts, top_k, hidden, inter, used, activation in [
    (1, 8, 2, 32, 24, None, "silu"),
    (6, 8, 2, 48, 40, [2, 5], "silu"),
    (19, 16, 4, 64, 32, list(range(0, 16, 3)), "gelu_pytorch_tanh"),
]:
    for dtype in (torch.float32, torch.float16):
        x = randn(tokens, hidden, dtype=dtype)
        w13 = randn(experts, 2 * inter, hidden, dtype=dtype, std=0.2)
        w2 = randn(experts, hidden, inter, dtype=dtype, std=0.2)
        weights, ids = select_experts_native(
            routing_logits(tokens, experts, used), top_k, True, False
        )
        ref = fused_moe_native(
            x.double(), w13.double(), w2.double(), weights.double(), ids, activation
        )
        use = torch.zeros(2, dtype=torch.int64)
        out = fused_moe(x, w13, w2, weights, ids, use, activation, gemv=False)
        native = fused_moe_native(x, w13, w2, weights, ids, activation)
        results["moe"].append(
            {
                "case": [tokens, experts, top_k, hidden, inter, activation, str(dtype)],
                "dtype": str(dtype),
                "shape_ok": list(out.shape) == [tokens, hidden] and out.dtype == dtype,
                "rel_err": float((out.double() - ref).norm() / ref.norm()),
                "native_rel_err": float((native.double() - ref).norm() / ref.norm()),
                "idle_experts": experts - int(torch.unique(ids).numel()),
            }
        )
    # FP8 experts (per expert and channel scales) against the dequantized reference
    w13_q, w13_s = quantize_rows(w13.float())
    w2_q, w2_s = quantize_rows(w2.float())
    x = randn(tokens, hidden, dtype=torch.float16)
    use = torch.zeros(2, dtype=torch.int64)
    out = fused_moe(x, w13_q, w2_q, weights, ids, use, activation, w13_s, w2_s, gemv=False)
    ref = fused_moe_native(x.double(), w13_q, w2_q, weights.double(), ids, activation, w13_s, w2_s)
    results.setdefault("fp8", []).append(
        {"case": [tokens, experts], "rel_err": float((out.double() - ref).norm() / ref.norm())}
    )
# gpt-oss's experts: biases after both products and the clamped SwiGLU, its limit low enough
# that the clamps bite on these values
for dtype in (torch.float32, torch.float16):
    tokens, experts, top_k, hidden, inter = 9, 8, 4, 64, 48
    x, w13, w2, b13, b2 = oss_experts(tokens, experts, hidden, inter, dtype)
    weights, ids = select_experts_native(
        routing_logits(tokens, experts, [0, 3, 4, 7]), 4, True, True
    )
    swiglu = (1.702, 1.5)
    extra = {"swiglu": swiglu}
    ref = oss_reference(x, w13, w2, weights, ids, b13, b2, **extra)
    use = torch.zeros(2, dtype=torch.int64)
    out = fused_moe(
        x, w13, w2, weights, ids, use, "swiglu_oai", w13_bias=b13, w2_bias=b2, gemv=False, **extra
    )
    gate = torch.einsum("th,eih->tei", x.double(), w13[:, :inter].double()) + b13[:, :inter]
    results.setdefault("swiglu", []).append(
        {
            "dtype": str(dtype),
            "rel_err": float((out.double() - ref).norm() / ref.norm()),
            "clamped": float((gate > swiglu[1]).double().mean()),
        }
    )
# MXFP4 experts (gpt-oss's checkpoint format, kept by --quantization mxfp4): the tiles decoded
# in the kernel against the reference on the decoded weights, with biases and the clamped
# SwiGLU; float32 and float16 activations, K spanning several tiles and groups
for dtype in (torch.float32, torch.float16):
    tokens, experts, top_k, hidden, inter = 7, 8, 4, 64, 64
    x = randn(tokens, hidden, dtype=dtype)
    w13_blocks, w13_scales = quantize_mxfp4(randn(experts, 2 * inter, hidden, std=0.3))
    w2_blocks, w2_scales = quantize_mxfp4(randn(experts, hidden, inter, std=0.2))
    w13_q, w2_q = w13_blocks.flatten(-2), w2_blocks.flatten(-2)
    b13, b2 = randn(experts, 2 * inter, dtype=dtype), randn(experts, hidden, dtype=dtype)
    weights, ids = select_experts_native(
        routing_logits(tokens, experts, [1, 2, 5, 6]), 4, True, True
    )
    w13 = dequantize_mxfp4(w13_blocks, w13_scales, torch.float64)
    w2 = dequantize_mxfp4(w2_blocks, w2_scales, torch.float64)
    extra = {"swiglu": (1.702, 1.5)}
    ref = oss_reference(x, w13, w2, weights, ids, b13, b2, **extra)
    use = torch.zeros(2, dtype=torch.int64)
    out = fused_moe(
        x,
        w13_q,
        w2_q,
        weights,
        ids,
        use,
        "swiglu_oai",
        w13_scales,
        w2_scales,
        w13_bias=b13,
        w2_bias=b2,
        gemv=False,
        **extra,
    )
    native = fused_moe_native(
        x,
        w13_q,
        w2_q,
        weights,
        ids,
        "swiglu_oai",
        w13_scales,
        w2_scales,
        w13_bias=b13,
        w2_bias=b2,
        **extra,
    )
    results.setdefault("mxfp4", []).append(
        {
            "dtype": str(dtype),
            "rel_err": float((out.double() - ref).norm() / ref.norm()),
            "native_rel_err": float((native.double() - ref).norm() / ref.norm()),
        }
    )

# the routed GEMV (moe_gemv.py, a few tokens): against the float64 reference with small tiles
# (K loops of several chunks, the last one partial; row blocks past the end), idle experts,
# a top-k that is no power of two (DeepSeek's 6: padded slots), every slot on one expert, three
# tokens; then FP8, biases with the clamped SwiGLU, MXFP4.
# `expert_use` must count distinct experts, and `fused_moe` must take it at batch 1 by itself.
SMALL = GemvTiles(gate_up_rows=2, gate_up_k=32, down_rows=4, down_k=32)


def gemv_case(name, x, w13, w2, weights, ids, exact, activation="silu", **extra) -> dict:
    use = torch.zeros(2, dtype=torch.int64)
    out = fused_moe_gemv(x, w13, w2, weights, ids, use, activation, tiles=SMALL, **extra)
    auto_use = torch.zeros(2, dtype=torch.int64)
    auto = fused_moe(x, w13, w2, weights, ids, auto_use, activation, **extra)
    return {
        "case": name,
        "dtype": str(x.dtype),
        "shape_ok": list(out.shape) == list(x.shape) and out.dtype == x.dtype,
        "rel_err": float((out.double() - exact).norm() / exact.norm()),
        "auto_rel_err": float((auto.double() - exact).norm() / exact.norm()),
        "expert_use": use.tolist(),
        "auto_expert_use": auto_use.tolist(),
        "expected_use": [int(torch.unique(ids).numel()), 1],
    }


results["gemv"] = []
for tokens, experts, top_k, hidden, inter, used, activation, one_expert in [
    (1, 8, 2, 64, 48, None, "silu", False),
    (1, 16, 6, 96, 40, [1, 4, 6, 9, 11, 13, 14, 15], "gelu_pytorch_tanh", False),
    (1, 8, 4, 64, 48, None, "silu", True),
    (3, 8, 4, 48, 40, [0, 2, 3, 6, 7], "silu", False),
]:
    for dtype in (torch.float32, torch.float16):
        x = randn(tokens, hidden, dtype=dtype)
        w13 = randn(experts, 2 * inter, hidden, dtype=dtype, std=0.2)
        w2 = randn(experts, hidden, inter, dtype=dtype, std=0.2)
        weights, ids = select_experts_native(
            routing_logits(tokens, experts, used), top_k, True, False
        )
        if one_expert:
            ids = torch.full_like(ids, 5)
        exact = fused_moe_native(
            x.double(), w13.double(), w2.double(), weights.double(), ids, activation
        )
        name = f"{tokens}x{experts}e top{top_k} {activation}{' one-expert' if one_expert else ''}"
        results["gemv"].append(gemv_case(name, x, w13, w2, weights, ids, exact, activation))
    # FP8 experts, per (expert, channel) scales
    (w13_q, w13_s), (w2_q, w2_s) = quantize_rows(w13.float()), quantize_rows(w2.float())
    x = randn(tokens, hidden, dtype=torch.float16)
    exact = fused_moe_native(
        x.double(), w13_q, w2_q, weights.double(), ids, activation, w13_s, w2_s
    )
    fp8 = {"w13_scale": w13_s, "w2_scale": w2_s}
    results["gemv"].append(
        gemv_case(f"{name} fp8", x, w13_q, w2_q, weights, ids, exact, activation, **fp8)
    )
# gpt-oss: biases, the clamped SwiGLU with its clamps biting, then MXFP4 experts
for dtype in (torch.float32, torch.float16):
    tokens, experts, top_k, hidden, inter = 2, 8, 4, 64, 64
    x, w13, w2, b13, b2 = oss_experts(tokens, experts, hidden, inter, dtype)
    weights, ids = select_experts_native(
        routing_logits(tokens, experts, [0, 3, 4, 7, 1]), top_k, True, True
    )
    oss = {"w13_bias": b13, "w2_bias": b2, "swiglu": (1.702, 1.5)}
    exact = oss_reference(x, w13, w2, weights, ids, b13, b2)
    gate = x.double() @ w13[:, :inter].double().transpose(1, 2) + b13[:, None, :inter]
    case = gemv_case("gpt-oss biases", x, w13, w2, weights, ids, exact, "swiglu_oai", **oss)
    results["gemv"].append(case | {"clamped": float((gate > 1.5).double().mean())})
    (q13, s13), (q2, s2) = quantize_mxfp4(w13.float()), quantize_mxfp4(w2.float())
    exact = oss_reference(
        x,
        dequantize_mxfp4(q13, s13, torch.float64),
        dequantize_mxfp4(q2, s2, torch.float64),
        weights,
        ids,
        b13,
        b2,
    )
    mx = oss | {"w13_scale": s13, "w2_scale": s2}
    q13, q2 = q13.flatten(-2), q2.flatten(-2)
    results["gemv"].append(
        gemv_case("gpt-oss mxfp4", x, q13, q2, weights, ids, exact, "swiglu_oai", **mx)
    )


# the K loops software-pipelined (`GemvTiles` stages): the same sums as the plain loops
x = randn(1, 96, dtype=torch.float16)
w13, w2 = (
    randn(16, 80, 96, dtype=torch.float16, std=0.2),
    randn(16, 96, 40, dtype=torch.float16, std=0.2),
)
weights, ids = select_experts_native(routing_logits(1, 16, None), 6, True, False)
use = torch.zeros(2, dtype=torch.int64)
plain = fused_moe_gemv(x, w13, w2, weights, ids, use, tiles=SMALL)
piped = GemvTiles(
    gate_up_rows=2, gate_up_k=32, down_rows=4, down_k=32, gate_up_stages=3, down_stages=2
)
pipelined = fused_moe_gemv(x, w13, w2, weights, ids, use, tiles=piped)
results["pipelined"] = {
    "same": bool(torch.equal(plain, pipelined)),
    "norm": float(plain.float().norm()),
}

# DeepSeek's shared experts' output added in the down GEMV's epilogue, and after the grouped
# GEMMs' sum; its float32 router as one GEMV
results["add"] = []
for dtype in (torch.float32, torch.float16):
    tokens, experts, top_k, hidden, inter = 2, 8, 3, 64, 48
    x = randn(tokens, hidden, dtype=dtype)
    w13 = randn(experts, 2 * inter, hidden, dtype=dtype, std=0.2)
    w2 = randn(experts, hidden, inter, dtype=dtype, std=0.2)
    shared = randn(tokens, hidden, dtype=dtype)
    weights, ids = select_experts_native(routing_logits(tokens, experts, None), top_k, True, False)
    exact = fused_moe_native(x.double(), w13.double(), w2.double(), weights.double(), ids)
    exact = exact + shared.double()
    use = torch.zeros(2, dtype=torch.int64)
    for path, gemv in (("gemv", True), ("grouped", False)):
        out = fused_moe(x, w13, w2, weights, ids, use, gemv=gemv, add=shared)
        results["add"].append(
            {
                "case": path,
                "dtype": str(dtype),
                "rel_err": float((out.double() - exact).norm() / exact.norm()),
            }
        )
# the top-k sum alone: 1,500 features (a partial second block), with and without the add,
# against float64 rounded once (the sum) and twice (then the add), as torch's sum then add_
results["topk_sum"] = []
for dtype in (torch.float32, torch.float16):  # (the interpreter truncates to bf16)
    rows, add = randn(5, 6, 1500, dtype=dtype), randn(5, 1500, dtype=dtype)
    summed = rows.double().sum(1).to(dtype)
    for with_add in (False, True):
        out = topk_sum(rows, add if with_add else None)
        exact = (summed.double() + add.double()).to(dtype) if with_add else summed
        results["topk_sum"].append(
            {
                "case": [str(dtype), with_add],
                "ulps_off": int((out.double() - exact.double()).ne(0).sum()),
                "max_err": float((out.double() - exact.double()).abs().max()),
            }
        )
router = randn(70, 600, std=0.05)  # 70 experts: a partial last block; 600: a partial K chunk
results["router"] = []
for dtype in (torch.float32, torch.float16):
    x = randn(3, 600, dtype=dtype)
    exact = x.double() @ router.double().T
    logits = router_gemv(x, router)
    results["router"].append(
        {
            "dtype": str(dtype),
            "float32": logits.dtype == torch.float32,
            "rel_err": float((logits.double() - exact).norm() / exact.norm()),
        }
    )


# DeepSeek-V3's grouped routing with the correction bias (noaux_tc) in one kernel against the
# torch routing: V3's 256 experts in 8 groups, a one-group layout, groups of one power-of-two
# short; the same experts (as a set) with the same weights
results["noaux_tc"] = []
for tokens, experts, n_group, topk_group, top_k, renormalize, scaling in [
    (3, 256, 8, 4, 8, True, 2.5),
    (2, 64, 1, 1, 6, False, 1.0),
    (4, 24, 4, 2, 3, True, 1.0),
]:
    logits = randn(tokens, experts)
    bias = randn(experts, std=0.1)
    want_w, want_ids = grouped_topk(
        logits, top_k, method="noaux_tc", n_group=n_group, topk_group=topk_group,
        correction_bias=bias, renormalize=renormalize, scaling=scaling,
    )  # fmt: skip
    got_w, got_ids = select_experts_noaux_tc(
        logits, bias, top_k, n_group, topk_group, renormalize, scaling
    )
    want_order, got_order = want_ids.long().sort(1), got_ids.long().sort(1)
    results["noaux_tc"].append(
        {
            "case": f"{experts}e/{n_group}g top{topk_group} k{top_k}",
            "same_ids": bool(torch.equal(want_order.values, got_order.values)),
            "max_weight_err": float(
                (want_w.gather(1, want_order.indices) - got_w.gather(1, got_order.indices))
                .abs()
                .max()
            ),
        }
    )


# the MXFP4 decode (float32 bit patterns built with integer operations) bit for bit against the
# CPU's: every byte (both nibbles: all 16 codes, signs, zeros) under scale bytes from the
# subnormal 0 to 254 (2^127: the largest values overflow to inf in both)
@jit
def _decode_kernel(Blocks, Scales, Out, K: tl.constexpr):
    ks = tl.arange(0, K)
    one = tl.arange(0, 1)[None, :]
    tile = mxfp4_tile(Blocks + ks[:, None] // 2 + one, Scales + ks[:, None] // 32 + one, ks,
                      (ks[:, None] < K) & (one < 1), tl.float32)  # fmt: skip
    tl.store(Out + ks[:, None] + one, tile)


blocks = torch.arange(256, dtype=torch.uint8).repeat(4)
scales = torch.tensor(
    [0, 1, 2, 126, 127, 128, 200, 253, 254] + list(range(3, 58)), dtype=torch.uint8
)
decoded = torch.empty(2048)
_decode_kernel[(1,)](blocks, scales, decoded, K=2048)
expected = dequantize_mxfp4(blocks.view(64, 16), scales, torch.float32).reshape(-1)
results["mxfp4_decode"] = {
    "bit_exact": bool(torch.equal(decoded, expected)),
    "infinite": int(torch.isinf(expected).sum()),
    "subnormal_scale_nonzero": int((expected[:32] != 0).sum()),
}
print(json.dumps(results))
