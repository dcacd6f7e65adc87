"""The fused MoE kernels at real sizes on the GPU: against the torch reference over random
routings (experts that get no token included, and all tokens on one expert), in bf16 and with
FP8 experts, gpt-oss's MXFP4 experts (biases, clamped SwiGLU); routing against torch; and a MoE
layer captured in a CUDA graph (no host sync, replays with new routings equal to eager). A
pass of a few tokens takes the routed GEMV (moe_gemv.py), checked at the three served MoE
shapes beside the grouped GEMMs, and captured in a graph at batch 1 too."""

from __future__ import annotations

import functools

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from radixserve.kernels.fused_moe import (  # noqa: E402
    align_by_expert,
    fused_moe,
    gemm_config,
    select_experts,
    select_experts_native,
)
from radixserve.kernels.moe_gemv import uses_moe_gemv  # noqa: E402
from radixserve.layers.moe.layer import FusedMoE  # noqa: E402
from radixserve.layers.moe.reference import fused_moe_native  # noqa: E402
from radixserve.layers.quantization.fp8 import quantize_rows  # noqa: E402
from radixserve.layers.quantization.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402

# (experts, top_k, hidden, intermediate): Qwen3-30B-A3B's layer, a Mixtral-like one
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "mixtral-like": (8, 2, 1024, 1792)}
TOKENS = [1, 7, 64, 512]
ROUTINGS = ["random", "few-experts", "one-expert"]


def routing(tokens: int, experts: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Router logits: random; reaching only a fifth of the experts; or piling on expert 3."""
    logits = torch.randn(tokens, experts, generator=gen)
    if kind == "few-experts":
        logits[:, torch.randperm(experts, generator=gen)[: experts * 4 // 5]] = -30.0
    elif kind == "one-expert":
        logits[:, 3] += 30.0
    return logits.cuda()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def weights(experts: int, hidden: int, inter: int, gen: torch.Generator):
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).cuda()
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).cuda()
    return w13, w2


def capture_without_sync(layer, x: torch.Tensor, logits: torch.Tensor):
    """The layer's pass over the static (x, logits) captured in a CUDA graph after a warm-up
    (compilation stays out of it), any host sync during capture an error: (graph, output)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        layer(x, logits)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph, stream=stream):
            out = layer(x, logits)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return graph, out


@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fused_moe_matches_reference_within_bf16(shape, tokens, kind):
    """Error against float64 no larger than the bf16 torch reference's own (plus slack):
    within bf16 norms, idle experts and pile-ups included."""
    experts, top_k, hidden, inter = SHAPES[shape]
    gen = torch.Generator().manual_seed(tokens)
    w13, w2 = weights(experts, hidden, inter, gen)
    x = torch.randn(tokens, hidden, generator=gen).cuda()
    topk_w, topk_ids = select_experts_native(
        routing(tokens, experts, kind, gen), top_k, True, False
    )
    exact = fused_moe_native(x.double(), w13.double(), w2.double(), topk_w.double(), topk_ids)
    bf = torch.bfloat16
    use = torch.zeros(2, dtype=torch.int64, device="cuda")
    out = fused_moe(x.to(bf), w13.to(bf), w2.to(bf), topk_w, topk_ids, use)
    native = fused_moe_native(x.to(bf), w13.to(bf), w2.to(bf), topk_w, topk_ids)
    err, native_err = relative_error(out, exact), relative_error(native, exact)
    assert out.shape == (tokens, hidden) and out.dtype == bf
    assert err <= 1.5 * native_err + 2e-3, (err, native_err)
    assert use.tolist() == [int(torch.unique(topk_ids).numel()), 1]


@pytest.mark.parametrize("tokens", [1, 64])
def test_fp8_experts_match_dequantized_reference(tokens):
    experts, top_k, hidden, inter = SHAPES["qwen3-30b-a3b"]
    gen = torch.Generator().manual_seed(5)
    w13, w2 = weights(experts, hidden, inter, gen)
    (q13, s13), (q2, s2) = quantize_rows(w13), quantize_rows(w2)
    x = torch.randn(tokens, hidden, generator=gen).cuda().to(torch.bfloat16)
    topk_w, topk_ids = select_experts_native(
        routing(tokens, experts, "random", gen), top_k, True, True
    )
    use = torch.zeros(2, dtype=torch.int64, device="cuda")
    out = fused_moe(x, q13, q2, topk_w, topk_ids, use, "silu", s13, s2)
    ref = fused_moe_native(x.double(), q13, q2, topk_w.double(), topk_ids, "silu", s13, s2)
    assert relative_error(out, ref) < 1e-2


@pytest.mark.parametrize("tokens", [1, 64])
def test_mxfp4_gpt_oss_experts_match_decoded_reference(tokens):
    """gpt-oss-20b's layer (32 experts, top 4, 2880 wide) with MXFP4 experts decoded in the
    kernel, biases and the clamped SwiGLU, bf16, against float64 on the decoded weights."""
    experts, top_k, hidden, inter = 32, 4, 2880, 2880
    gen = torch.Generator().manual_seed(6)
    w13, w2 = weights(experts, hidden, inter, gen)
    (b13, s13), (b2, s2) = quantize_mxfp4(w13), quantize_mxfp4(w2)
    bias13 = (torch.randn(experts, 2 * inter, generator=gen) * 0.1).cuda().to(torch.bfloat16)
    bias2 = (torch.randn(experts, hidden, generator=gen) * 0.1).cuda().to(torch.bfloat16)
    x = torch.randn(tokens, hidden, generator=gen).cuda().to(torch.bfloat16)
    topk_w, topk_ids = select_experts_native(
        routing(tokens, experts, "random", gen), top_k, True, True
    )
    use = torch.zeros(2, dtype=torch.int64, device="cuda")
    q13, q2 = b13.flatten(-2), b2.flatten(-2)
    extra = {"w13_bias": bias13, "w2_bias": bias2, "swiglu": (1.702, 7.0)}
    out = fused_moe(x, q13, q2, topk_w, topk_ids, use, "swiglu_oai", s13, s2, **extra)
    ref = fused_moe_native(
        x.double(),
        dequantize_mxfp4(b13, s13, torch.float64),
        dequantize_mxfp4(b2, s2, torch.float64),
        topk_w.double(),
        topk_ids,
        "swiglu_oai",
        w13_bias=bias13.double(),
        w2_bias=bias2.double(),
        swiglu=(1.702, 7.0),
    )
    assert relative_error(out, ref) < 1e-2


@pytest.mark.parametrize("tokens", [64, 8192])
@pytest.mark.parametrize("kind", ROUTINGS)
def test_alignment_is_the_stable_sort_by_expert(kind, tokens):
    """Every expert's run holds its pairs in pair order, padded to its blocks, each block's
    expert named and the rows and blocks past the used ones padding and -1: at a decode batch
    (512 pairs) and a prefill (65,536 pairs, 64 chunks of an align program's read), one program
    per expert running at once."""
    gen = torch.Generator().manual_seed(tokens)
    experts, top_k = 128, 8
    _, ids = select_experts(routing(tokens, experts, kind, gen), top_k, True, False)
    block_m = gemm_config(ids.numel(), torch.bfloat16).block_m
    use = torch.zeros(2, dtype=torch.int64, device="cuda")
    align = align_by_expert(ids, experts, block_m, use)
    flat, numel = ids.reshape(-1).long().cpu(), ids.numel()
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    expected = torch.full((align.max_padded,), numel, dtype=torch.int32)
    owners = torch.full((align.expert_ids.numel(),), -1, dtype=torch.int32)
    order = torch.sort(flat, stable=True).indices.to(torch.int32)
    start = 0
    for expert in range(experts):
        count, run = int(counts[expert]), int(padded[expert])
        expected[start : start + count] = order[:count]
        order = order[count:]
        owners[start // block_m : (start + run) // block_m] = expert
        start += run
    assert int(align.num_padded[0]) == start
    assert torch.equal(align.sorted_ids.cpu(), expected)
    assert torch.equal(align.expert_ids.cpu(), owners)
    assert use.tolist() == [int((counts > 0).sum()), 1]


@pytest.mark.parametrize("round_weights", [False, True])
def test_routing_kernel_matches_torch(round_weights):
    gen = torch.Generator().manual_seed(2)
    # distinct logits: ties would leave torch.topk's order open
    logits = torch.stack([torch.randperm(128, generator=gen) for _ in range(300)]) * 0.01
    logits = logits.cuda().to(torch.bfloat16 if round_weights else torch.float32)
    w, ids = select_experts(logits, 8, True, round_weights)
    w_ref, ids_ref = select_experts_native(logits, 8, True, round_weights)
    assert torch.equal(ids, ids_ref)
    assert torch.allclose(w, w_ref, atol=1e-6)


@pytest.mark.parametrize("tokens", [1, 300])
def test_grouped_noaux_tc_routing_kernel_matches_torch(tokens):
    """DeepSeek-V3's routing (256 experts in 8 groups, 4 kept, top 8, renormalised, x2.5) in
    one kernel against the torch routing: the same experts, the same weights."""
    from radixserve.kernels.fused_moe import select_experts_noaux_tc
    from radixserve.layers.moe.routing import grouped_topk

    gen = torch.Generator().manual_seed(3)
    # distinct logits: ties would leave torch.topk's order open
    logits = (
        torch.stack([torch.randperm(256, generator=gen) for _ in range(tokens)]) * 0.01
    ).cuda()
    bias = (torch.randn(256, generator=gen) * 0.01).cuda()
    w, ids = select_experts_noaux_tc(logits, bias, 8, 8, 4, True, 2.5)
    w_ref, ids_ref = grouped_topk(
        logits, 8, method="noaux_tc", n_group=8, topk_group=4, correction_bias=bias,
        renormalize=True, scaling=2.5,
    )  # fmt: skip
    got, want = ids.long().sort(1), ids_ref.long().sort(1)
    assert torch.equal(got.values, want.values)
    assert torch.allclose(w.gather(1, got.indices), w_ref.gather(1, want.indices), atol=1e-6)


def test_moe_layer_decode_is_captured_in_a_cuda_graph():
    """Routing, alignment, both GEMMs and the sum run inside a graph: replays with other
    hidden states and router logits (other experts, idle ones) equal eager runs, and the
    captured pass asks nothing of the host."""
    experts, top_k, hidden, inter = SHAPES["qwen3-30b-a3b"]
    gen = torch.Generator().manual_seed(9)
    with torch.device("cuda"):
        layer = FusedMoE(experts, top_k, hidden, inter, renormalize=True, round_weights=True)
    w13, w2 = weights(experts, hidden, inter, gen)
    layer.w13_weight.data = w13.to(torch.bfloat16)
    layer.w2_weight.data = w2.to(torch.bfloat16)
    bs = 4
    x = torch.zeros(bs, hidden, device="cuda", dtype=torch.bfloat16)
    logits = torch.zeros(bs, experts, device="cuda", dtype=torch.bfloat16)
    graph, out = capture_without_sync(layer, x, logits)
    for kind in ROUTINGS:
        x.copy_(torch.randn(bs, hidden, generator=gen).to(x))
        logits.copy_(routing(bs, experts, kind, gen).to(logits))
        graph.replay()
        assert torch.equal(out, layer(x, logits)), kind


# (experts, top_k, hidden, intermediate, biases): the batch-1 MoE layers the routed GEMV serves
GEMV_SHAPES = {
    "qwen3-30b-a3b": (128, 8, 2048, 768, False),
    "gpt-oss-20b": (32, 4, 2880, 2880, True),
    "deepseek-v2-lite": (64, 6, 2048, 1408, False),
}


@functools.cache
def gemv_layer(shape: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One random layer of a GEMV shape, made once on the GPU (the CPU's generator takes
    seconds at these sizes): float32 w13, w2, and gpt-oss's bf16 biases and SwiGLU."""
    experts, _, hidden, inter, biased = GEMV_SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(10)

    def randn(*size: int, std: float) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device="cuda") * std

    w13 = randn(experts, 2 * inter, hidden, std=hidden**-0.5)
    w2 = randn(experts, hidden, inter, std=inter**-0.5)
    extra = {}
    if biased:
        extra = {
            "w13_bias": randn(experts, 2 * inter, std=0.1).to(torch.bfloat16),
            "w2_bias": randn(experts, hidden, std=0.1).to(torch.bfloat16),
            "swiglu": (1.702, 7.0),
        }
    return w13, w2, extra


@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize("shape", list(GEMV_SHAPES))
def test_routed_gemv_matches_reference_and_grouped_gemm(shape, tokens, kind):
    """The routed GEMV, which `fused_moe` takes by itself for these passes, within bf16 of
    float64 (no worse than the bf16 torch reference, plus slack) and of the grouped GEMMs;
    `expert_use` counts the distinct experts as the grouped path does."""
    experts, top_k, hidden, inter, biased = GEMV_SHAPES[shape]
    assert uses_moe_gemv(tokens, top_k)
    gen = torch.Generator().manual_seed(11 + tokens)
    w13, w2, extra = gemv_layer(shape)
    activation = "swiglu_oai" if biased else "silu"
    x = torch.randn(tokens, hidden, generator=gen).cuda()
    topk_w, topk_ids = select_experts_native(
        routing(tokens, experts, kind, gen), top_k, True, False
    )
    exact_extra = {k: v.double() if torch.is_tensor(v) else v for k, v in extra.items()}
    # (the reference widens each used expert to float64 itself)
    exact = fused_moe_native(
        x.double(), w13, w2, topk_w.double(), topk_ids, activation, **exact_extra
    )
    bf = torch.bfloat16
    args = (x.to(bf), w13.to(bf), w2.to(bf), topk_w, topk_ids)
    use, grouped_use = (torch.zeros(2, dtype=torch.int64, device="cuda") for _ in range(2))
    out = fused_moe(*args, use, activation, **extra)
    grouped = fused_moe(*args, grouped_use, activation, gemv=False, **extra)
    native = fused_moe_native(*args, activation, **extra)
    err, native_err = relative_error(out, exact), relative_error(native, exact)
    assert out.shape == (tokens, hidden) and out.dtype == bf
    assert err <= 1.5 * native_err + 2e-3, (err, native_err)
    assert relative_error(out, grouped) < 1e-2
    assert use.tolist() == grouped_use.tolist() == [int(torch.unique(topk_ids).numel()), 1]


@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "gpt-oss-20b"])
def test_batch1_moe_layer_takes_the_routed_gemv_in_a_cuda_graph(shape):
    """A batch-1 decode layer (routing kernel, then the two GEMV launches) captured in a graph:
    replays with new hidden states and routings equal eager runs, ask nothing of the host, and
    count top_k experts a pass in the layer's `expert_use`."""
    experts, top_k, hidden, inter, biased = GEMV_SHAPES[shape]
    gen = torch.Generator().manual_seed(12)
    options = {"activation": "swiglu_oai", "bias": True} if biased else {}
    with torch.device("cuda"):
        layer = FusedMoE(
            experts, top_k, hidden, inter, renormalize=True, round_weights=True, **options
        )
    w13, w2, extra = gemv_layer(shape)
    layer.w13_weight.data = w13.to(torch.bfloat16)
    layer.w2_weight.data = w2.to(torch.bfloat16)
    if biased:
        layer.w13_bias.data, layer.w2_bias.data = extra["w13_bias"], extra["w2_bias"]
    x = torch.zeros(1, hidden, device="cuda", dtype=torch.bfloat16)
    logits = torch.zeros(1, experts, device="cuda", dtype=torch.bfloat16)
    graph, out = capture_without_sync(layer, x, logits)
    seen = set()
    for kind in ROUTINGS + ["random"]:
        x.copy_(torch.randn(1, hidden, generator=gen).to(x))
        logits.copy_(routing(1, experts, kind, gen).to(logits))
        before = layer.experts_read()
        graph.replay()
        after = layer.experts_read()
        assert (after[0] - before[0], after[1] - before[1]) == (top_k, 1), kind
        assert torch.equal(out, layer(x, logits)), kind
        routed = select_experts(logits, top_k, True, True)  # the layer's (ties: bf16 logits)
        seen.add(tuple(sorted(routed[1][0].tolist())))
        reference = fused_moe_native(
            x, layer.w13_weight, layer.w2_weight, *routed,
            layer.activation, w13_bias=layer.w13_bias, w2_bias=layer.w2_bias,
        )  # fmt: skip
        assert relative_error(out, reference) < 2e-2, kind
    assert len(seen) > 1  # the replays really routed elsewhere


def test_deepseek_shared_add_and_float32_router_at_v2_lite_sizes():
    """DeepSeek-V2-Lite's MoE at batch 1 (64 experts, top 6, 2048 hidden, 1408 wide): the shared
    experts' output added in the down GEMV's epilogue equals the routed GEMV plus it, and the
    float32 router GEMV equals F.linear in float32, both also replayed in a CUDA graph."""
    from radixserve.kernels.moe_gemv import router_gemv

    gen = torch.Generator().manual_seed(5)
    experts, top_k, hidden, inter = 64, 6, 2048, 1408
    bf = torch.bfloat16
    w13, w2 = (w.to(bf) for w in weights(experts, hidden, inter, gen))
    router = (torch.randn(experts, hidden, generator=gen) / hidden**0.5).cuda()
    x = torch.randn(1, hidden, generator=gen).cuda().to(bf)
    shared = torch.randn(1, hidden, generator=gen).cuda().to(bf)
    use = torch.zeros(2, dtype=torch.int64, device="cuda")

    def layer() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = router_gemv(x, router)
        topk_w, topk_ids = select_experts(logits, top_k, False, False)
        routed = fused_moe(x, w13, w2, topk_w, topk_ids, use)
        return logits, routed, fused_moe(x, w13, w2, topk_w, topk_ids, use, add=shared)

    logits, routed, summed = layer()
    exact_logits = torch.nn.functional.linear(x.float(), router)
    assert relative_error(logits, exact_logits) < 1e-5
    assert relative_error(summed, routed.float() + shared.float()) < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer()
    x.copy_(torch.randn(1, hidden, generator=gen).cuda().to(bf))
    graph.replay()
    for eager, replayed in zip(layer(), captured, strict=True):
        assert torch.equal(eager, replayed)
