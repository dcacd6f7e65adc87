"""Mixture-of-experts in Triton: routing, tokens sorted by expert, two grouped GEMMs.

A MoE layer sends each token to its top-k experts, k small matmul pairs per token. Running
them expert by expert (the reference below) costs a host sync and a launch per expert; here
one pass is five launches whatever the routing, all with shapes fixed by the token count, so
a decode step is captured in a CUDA graph like any other layer:

1. `topk_softmax`: per token, softmax over the router logits, the top k, renormalised if the
   config says so (one program per token).
2. `align`: one program per expert counts every expert's (token, slot) pairs, pads every
   count to a multiple of BLOCK_M, and writes its expert's pairs in the order sorted by expert
   (`sorted_ids`, padding = numel) and its BLOCK_M blocks' expert (`expert_ids`, -1 past the
   end). An expert no token chose gets no block. Buffers are sized for the worst case, so
   nothing depends on the routing.
3. the gate/up GEMM: each program multiplies one block's rows (gathered hidden states) by a
   tile of its expert's [gate; up] weights and applies act(gate) * up in the epilogue.
4. the down GEMM: the same over the activations, scaled by each pair's routing weight.
5. the top-k sum: each token's k rows added, and the caller's `add` (DeepSeek's shared
   experts) after them, in one launch.

A pass of a few tokens (decode at batch 1: `moe_gemv.uses_moe_gemv`) skips steps 2 to 5 for
the routed GEMV of moe_gemv.py: two launches that stream the routed experts as GEMVs, the
top-k sum in the down kernel.

Expert weights may be FP8 with one scale per (expert, output channel): the tiles are widened
to the activation dtype and the scale applied to the accumulator (weight-only FP8: decode
reads half the bytes). Experts may have biases (gpt-oss: one per output of gate/up and of
down, added after each product), and the gated activation is SiLU, GELU-tanh or gpt-oss's
clamped SwiGLU ((clamp(up, -l, l) + 1) * g * sigmoid(alpha * g), g = min(gate, l)). The
weight tiles' decoding and the products' epilogue are moe_experts.py's, shared with the
routed GEMV.
Expert weights may also be MXFP4 (uint8 [E, N, K / 2] e2m1 pairs, uint8 [E, N, K / 32]
power-of-two scales: layers/quantization/mxfp4.py): each B tile is dequantized in registers
as it is read (weight-only, for any GPU Triton runs on; decode reads about a quarter of
bf16's bytes). `fused_moe_native` is the torch reference: the CPU path, and what the
kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.kernels.moe_experts import (
    MXFP4_GROUP,
    activation_code,
    finish_product,
    gated_activation,
    mxfp4_tile,
)
from radixserve.kernels.moe_gemv import fused_moe_gemv, uses_moe_gemv
from radixserve.kernels.triton_support import (
    dependent_launch,
    dot_precision,
    jit,
    tl,
    triton,
    wait_for_prior_kernel,
)

# Largest expert count the routing and align kernels hold in registers.
MAX_EXPERTS = 512
# Pair ids an align program reads at a time (fewer for a pass with fewer pairs)
_ALIGN_CHUNK = 1024


@jit
def _store_choice(TopkWeights, TopkIds, token, slots, picked, picked_ids, TOP_K: tl.constexpr):
    """A routing kernel's result for one token: its TOP_K weights and expert ids."""
    in_k = slots < TOP_K
    tl.store(TopkWeights + token * TOP_K + slots, picked, mask=in_k)
    tl.store(TopkIds + token * TOP_K + slots, picked_ids.to(TopkIds.dtype.element_ty), mask=in_k)


@jit
def _topk_softmax_kernel(
    Logits,
    TopkWeights,
    TopkIds,
    num_experts,
    stride_l,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    ROUND_TO_LOGITS_DTYPE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """One token: softmax over its logits in float32, then the k largest (lowest expert id
    first among equals), optionally renormalised to sum 1 and rounded to the logits' dtype.
    A programmatic dependent (PDL) of the router's projection, whose logits it waits for."""
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    valid = experts < num_experts
    wait_for_prior_kernel(PDL)
    logits = tl.load(Logits + token * stride_l + experts, mask=valid, other=float("-inf"))
    logits = logits.to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, 0))
    probs = probs / tl.sum(probs, 0)
    remaining = tl.where(valid, probs, -1.0)
    slots = tl.arange(0, BLOCK_K)
    picked = tl.zeros([BLOCK_K], dtype=tl.float32)
    picked_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for i in range(TOP_K):
        best = tl.max(remaining, 0)
        best_id = tl.min(tl.where(remaining == best, experts, BLOCK_E), 0)
        picked = tl.where(slots == i, best, picked)
        picked_ids = tl.where(slots == i, best_id, picked_ids)
        remaining = tl.where(experts == best_id, -1.0, remaining)
    if RENORMALIZE:
        picked = picked / tl.sum(picked, 0)
    if ROUND_TO_LOGITS_DTYPE:
        picked = picked.to(Logits.dtype.element_ty).to(tl.float32)
    _store_choice(TopkWeights, TopkIds, token, slots, picked, picked_ids, TOP_K)


@jit
def _noaux_tc_topk_kernel(
    Logits,
    Bias,
    TopkWeights,
    TopkIds,
    stride_l,
    scaling,
    N_GROUP: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_GS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """One token of DeepSeek-V3's routing (layers/moe/routing.py's `noaux_tc`): sigmoid scores;
    experts chosen by score + Bias within the TOPK_GROUP best of N_GROUP groups (a group's
    worth: the sum of its two best biased scores), weighted by their unbiased scores, then
    renormalised if asked and times `scaling`. The experts as a [group, member] tile (a padded
    member's id is the next group's first expert's: only `valid` cells count); among equals the
    lowest group and expert id first. A programmatic dependent of the router."""
    token = tl.program_id(0).to(tl.int64)
    groups = tl.arange(0, BLOCK_G)
    members = tl.arange(0, BLOCK_GS)
    experts = groups[:, None] * GROUP_SIZE + members[None, :]
    valid = (groups[:, None] < N_GROUP) & (members[None, :] < GROUP_SIZE)
    bias = tl.load(Bias + experts, mask=valid, other=0.0)
    wait_for_prior_kernel(PDL)
    logits = tl.load(Logits + token * stride_l + experts, mask=valid, other=0.0).to(tl.float32)
    scores = tl.sigmoid(logits)
    choice = tl.where(valid, scores + bias, float("-inf"))
    # a group's worth: its best biased score plus its second best
    first = tl.max(choice, 1)
    first_at = tl.min(tl.where(choice == first[:, None], members[None, :], BLOCK_GS), 1)
    second = tl.max(tl.where(members[None, :] == first_at[:, None], float("-inf"), choice), 1)
    worth = tl.where(groups < N_GROUP, first + second, float("-inf"))
    keep = groups < 0
    for _ in range(TOPK_GROUP):
        best = tl.max(worth, 0)
        best_group = tl.min(tl.where(worth == best, groups, BLOCK_G), 0)
        keep = keep | (groups == best_group)
        worth = tl.where(groups == best_group, float("-inf"), worth)
    remaining = tl.where(keep[:, None] & valid, choice, float("-inf"))
    slots = tl.arange(0, BLOCK_K)
    picked = tl.zeros([BLOCK_K], dtype=tl.float32)
    picked_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for i in range(TOP_K):
        best = tl.max(tl.max(remaining, 1), 0)
        best_id = tl.min(tl.min(tl.where(remaining == best, experts, N_GROUP * GROUP_SIZE), 1), 0)
        weight = tl.sum(tl.sum(tl.where(valid & (experts == best_id), scores, 0.0), 1), 0)
        picked = tl.where(slots == i, weight, picked)
        picked_ids = tl.where(slots == i, best_id, picked_ids)
        remaining = tl.where(experts == best_id, float("-inf"), remaining)
    if RENORMALIZE:
        picked = picked / (tl.sum(picked, 0) + 1e-20)
    picked = picked * scaling
    _store_choice(TopkWeights, TopkIds, token, slots, picked, picked_ids, TOP_K)


@jit
def _align_kernel(
    TopkIds,
    SortedIds,
    ExpertIds,
    NumPadded,
    ExpertUse,
    numel,
    max_padded,
    max_blocks,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Sort the numel (token, slot) pairs by expert, each expert's run padded to BLOCK_M: one
    program per expert.

    Every program counts all the pairs (a histogram of CHUNK ids at a time: cheap beside the
    launch), so each knows where its run starts without waiting on the others. It then writes
    its own pairs in pair order (a running count over the ids that chose it) and its padding,
    its blocks' expert, and its stripe of the unused tail (padding, blocks of -1). One program
    doing all of it took 32 us a layer at batch 64 (512 pairs, 128 experts, an H100), 6% of
    a Qwen3-30B-A3B step. Program 0 also adds the number of experts that got a pair to
    ExpertUse[0] and 1 to ExpertUse[1]: what a benchmark reads to count the expert weights a
    pass actually streamed."""
    expert = tl.program_id(0)
    lanes = tl.arange(0, CHUNK)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, numel, CHUNK):
        offs = start + lanes
        valid = offs < numel
        counts += tl.histogram(tl.load(TopkIds + offs, mask=valid, other=0), BLOCK_E, mask=valid)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    total = tl.sum(padded, 0)
    mine = tl.arange(0, BLOCK_E) == expert
    count = tl.sum(tl.where(mine, counts, 0), 0)
    run = tl.sum(tl.where(mine, padded, 0), 0)
    run_start = tl.sum(tl.where(mine, tl.cumsum(padded, 0), 0), 0) - run

    if count > 0:
        placed = 0
        for start in range(0, numel, CHUNK):
            offs = start + lanes
            chose = tl.load(TopkIds + offs, mask=offs < numel, other=-1) == expert
            rank = placed + tl.cumsum(chose.to(tl.int32), 0) - 1
            tl.store(SortedIds + run_start + rank, offs, mask=chose)
            placed += tl.sum(chose.to(tl.int32), 0)
        pad = count + tl.arange(0, BLOCK_M)  # fewer than BLOCK_M rows, in the run's last block
        tl.store(SortedIds + run_start + pad, numel + pad * 0, mask=pad < run)
        for start in range(0, run // BLOCK_M, CHUNK):
            blocks = start + lanes
            tl.store(
                ExpertIds + run_start // BLOCK_M + blocks,
                expert + blocks * 0,
                mask=blocks < run // BLOCK_M,
            )

    # the tail past the used rows, cut in one stripe a program
    programs = tl.num_programs(0)
    rows = tl.cdiv(max_padded - total, programs)
    for start in range(0, rows, CHUNK):
        offs = total + expert * rows + start + lanes
        tl.store(
            SortedIds + offs,
            numel + lanes * 0,
            mask=offs < tl.minimum(total + (expert + 1) * rows, max_padded),
        )
    used_blocks = total // BLOCK_M
    blocks_each = tl.cdiv(max_blocks - used_blocks, programs)
    for start in range(0, blocks_each, CHUNK):
        blocks = used_blocks + expert * blocks_each + start + lanes
        end = tl.minimum(used_blocks + (expert + 1) * blocks_each, max_blocks)
        tl.store(ExpertIds + blocks, lanes * 0 - 1, mask=blocks < end)

    if expert == 0:
        tl.store(NumPadded, total)
        tl.store(ExpertUse, tl.load(ExpertUse) + tl.sum((counts > 0).to(tl.int64), 0))
        tl.store(ExpertUse + 1, tl.load(ExpertUse + 1) + 1)


@jit
def _moe_gemm_kernel(
    A,
    B,
    C,
    BScale,
    Bias,
    TopkWeights,
    SortedIds,
    ExpertIds,
    NumPadded,
    N,
    K,
    max_padded,
    numel,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    stride_se,
    stride_sn,
    stride_biase,
    alpha,
    limit,
    A_ROWS_PER_PAIR: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MXFP4: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """C[pair, n] for one BLOCK_M block of sorted pairs and one BLOCK_N tile of outputs.

    A row of a pair is pair // A_ROWS_PER_PAIR (top_k for the hidden states: every slot of a
    token reads its row; 1 for the activations, one row per pair). B is [E, N(or 2N), K] with
    unit-stride K. GATED: B's rows N.. are the up projection and C = act(gate) * up, act by
    ACT (0 SiLU, 1 GELU-tanh, 2 clamped SwiGLU with alpha and limit). HAS_BIAS: Bias [E, N
    (or 2N)] is added to each product, rounded, as the reference's separate add is. MXFP4: B
    is packed [E, N, K / 2] and BScale [E, N, K / 32] its group scales."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(max_padded, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    if pid_m * BLOCK_M < tl.load(NumPadded):
        pairs = tl.load(SortedIds + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        row_mask = pairs < numel
        expert = tl.load(ExpertIds + pid_m).to(tl.int64)
        a_rows = (pairs // A_ROWS_PER_PAIR).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = A + a_rows[:, None] * stride_am + offs_k[None, :]
        b_rows = B + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn
        if MXFP4:
            b_ptrs = b_rows + offs_k[:, None] // 2
            s_ptrs = (
                BScale + expert * stride_se + offs_n[None, :].to(tl.int64) * stride_sn
            ) + offs_k[:, None] // 32
        else:
            b_ptrs = b_rows + offs_k[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if GATED:
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = offs_k < K - k0
            b_mask = k_mask[:, None] & n_mask[None, :]
            a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            if MXFP4:
                b = mxfp4_tile(b_ptrs, s_ptrs, offs_k, b_mask, a.dtype)
            else:
                b = tl.load(b_ptrs, mask=b_mask, other=0.0).to(a.dtype)
            acc += tl.dot(a, b, input_precision=DOT_PRECISION)
            if GATED:
                if MXFP4:
                    b_up = mxfp4_tile(
                        b_ptrs + N * stride_bn, s_ptrs + N * stride_sn, offs_k, b_mask, a.dtype
                    )
                else:
                    b_up = tl.load(b_ptrs + N * stride_bn, mask=b_mask, other=0.0).to(a.dtype)
                acc_up += tl.dot(a, b_up, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K
            if MXFP4:
                b_ptrs += BLOCK_K // 2
                s_ptrs += BLOCK_K // 32
            else:
                b_ptrs += BLOCK_K
        # each product is rounded to the activation dtype before the epilogue, as the
        # reference's separate matmuls are
        out_dtype = C.dtype.element_ty
        scales = BScale + expert * stride_se
        biases = Bias + expert * stride_biase
        out = finish_product(acc, scales, biases, offs_n, n_mask, out_dtype, HAS_SCALE, HAS_BIAS)
        if GATED:
            up = finish_product(
                acc_up, scales + N, biases + N, offs_n, n_mask, out_dtype, HAS_SCALE, HAS_BIAS
            )
            out = gated_activation(out, up, alpha, limit, ACT)
        if MUL_WEIGHT:
            out = out * tl.load(TopkWeights + pairs, mask=row_mask, other=0.0)[:, None]
        c_ptrs = C + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, out.to(C.dtype.element_ty), mask=row_mask[:, None] & n_mask[None, :])


@jit
def _topk_sum_kernel(
    Rows,
    Add,
    Out,
    hidden,
    stride_add,
    TOP_K: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_ADD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Out[t] = sum of Rows[t, :TOP_K] (+ Add[t]), BLOCK of one token's features a program.

    Summed in float32 and rounded once, then Add added and rounded again: what torch's sum
    over the k rows then `add_` computes, in one launch instead of two (torch's reduce of a
    [64, 8, 2048] block took 6.2 us a layer on an H100, three times its bytes)."""
    token = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    wait_for_prior_kernel(PDL)
    rows = Rows + token.to(tl.int64) * TOP_K * hidden + offs
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        total += tl.load(rows + slot * hidden, mask=mask, other=0.0).to(tl.float32)
    out = total.to(Out.dtype.element_ty)
    if HAS_ADD:
        add = tl.load(Add + token.to(tl.int64) * stride_add + offs, mask=mask, other=0.0)
        out = (out.to(tl.float32) + add.to(tl.float32)).to(Out.dtype.element_ty)
    tl.store(Out + token.to(tl.int64) * hidden + offs, out, mask=mask)


def topk_sum(rows: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """[T, k, H] contiguous -> [T, H]: each token's k expert outputs summed, `add` ([T, H],
    unit stride along H) added after."""
    tokens, top_k, hidden = rows.shape
    if not rows.is_contiguous() or (add is not None and add.stride(-1) != 1):
        raise ValueError("the top-k sum needs contiguous rows and a unit-stride add")
    out = torch.empty((tokens, hidden), dtype=rows.dtype, device=rows.device)
    if tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(hidden))
    _topk_sum_kernel[(tokens, triton.cdiv(hidden, block))](
        rows,
        add if add is not None else out,
        out,
        hidden,
        add.stride(0) if add is not None else 0,
        TOP_K=top_k,
        BLOCK=block,
        HAS_ADD=add is not None,
        num_warps=4,
        **dependent_launch(rows),
    )
    return out


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def gemm_config(numel: int, dtype: torch.dtype) -> GemmConfig:
    """Tiles by the number of (token, slot) pairs. Decode (few pairs, most experts idle) wants
    the smallest row block and many programs over N to stream the active experts' weights;
    prefill wants the usual large tiles. float32 (the exactness reference) keeps tiles small."""
    if dtype == torch.float32:
        return GemmConfig(16, 32, 32, 1, 4, 1)
    if numel <= 64:
        return GemmConfig(16, 64, 128, 1, 4, 3)
    if numel <= 1024:
        return GemmConfig(32, 64, 64, 8, 4, 3)
    return GemmConfig(64, 128, 64, 8, 8, 3)


def select_experts_native(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, round_weights: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, ids [T, k] int32): softmax in float32, top k, renormalised if
    asked, rounded to the logits' dtype if asked (Qwen3-MoE rounds, Mixtral does not)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if round_weights:
        weights = weights.to(router_logits.dtype).float()
    return weights, ids.to(torch.int32)


def _choice_outputs(
    tokens: int, top_k: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing kernels' outputs: weights [T, k] float32 and expert ids [T, k] int32."""
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=device)
    return weights, torch.empty((tokens, top_k), dtype=torch.int32, device=device)


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, round_weights: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`select_experts_native` in one launch (one program per token), launched as a dependent
    of the kernel before (PDL: at batch 1 the decode step's MoE is this and the GEMV's two)."""
    tokens, num_experts = router_logits.shape
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"{num_experts} experts: the routing kernel holds at most {MAX_EXPERTS}")
    weights, ids = _choice_outputs(tokens, top_k, router_logits.device)
    if tokens:
        _topk_softmax_kernel[(tokens,)](
            router_logits,
            weights,
            ids,
            num_experts,
            router_logits.stride(0),
            TOP_K=top_k,
            RENORMALIZE=renormalize,
            ROUND_TO_LOGITS_DTYPE=round_weights,
            BLOCK_E=triton.next_power_of_2(num_experts),
            BLOCK_K=triton.next_power_of_2(top_k),
            **dependent_launch(router_logits),
        )
    return weights, ids


def select_experts_noaux_tc(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """layers/moe/routing.py's `grouped_topk(method="noaux_tc")` in one launch (one program per
    token) instead of a dozen torch kernels a MoE layer: (weights [T, k] float32, ids [T, k]
    int32), the ids in falling order of their biased score."""
    tokens, num_experts = router_logits.shape
    if num_experts > MAX_EXPERTS or num_experts % n_group:
        raise ValueError(f"{num_experts} experts in {n_group} groups: not for this kernel")
    group_size = num_experts // n_group
    weights, ids = _choice_outputs(tokens, top_k, router_logits.device)
    if tokens:
        _noaux_tc_topk_kernel[(tokens,)](
            router_logits,
            correction_bias,
            weights,
            ids,
            router_logits.stride(0),
            scaling,
            N_GROUP=n_group,
            GROUP_SIZE=group_size,
            TOPK_GROUP=topk_group,
            TOP_K=top_k,
            RENORMALIZE=renormalize,
            BLOCK_G=max(2, triton.next_power_of_2(n_group)),
            BLOCK_GS=max(2, triton.next_power_of_2(group_size)),
            BLOCK_K=triton.next_power_of_2(top_k),
            **dependent_launch(router_logits),
        )
    return weights, ids


@dataclass
class Alignment:
    sorted_ids: torch.Tensor  # [max_padded] int32 pair index, numel for padding
    expert_ids: torch.Tensor  # [max_blocks] int32, -1 past the used blocks
    num_padded: torch.Tensor  # [1] int32: used length of sorted_ids
    max_padded: int


def max_padded_pairs(numel: int, num_experts: int, block_m: int) -> int:
    """Worst case of sum over experts of count rounded up to block_m: every expert that gets a
    pair (at most min(E, numel) of them) wastes at most block_m - 1 rows."""
    return numel + min(num_experts, numel) * (block_m - 1)


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, expert_use: torch.Tensor
) -> Alignment:
    """The (token, slot) pairs of `topk_ids` [T, k] sorted by expert in block_m runs (see the
    module docstring); `expert_use` [2] int64 accumulates (experts used, passes)."""
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"{num_experts} experts: the align kernel holds at most {MAX_EXPERTS}")
    numel = topk_ids.numel()
    max_padded = max_padded_pairs(numel, num_experts, block_m)
    max_blocks = triton.cdiv(max_padded, block_m)
    device = topk_ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    _align_kernel[(num_experts,)](
        topk_ids,
        sorted_ids,
        expert_ids,
        num_padded,
        expert_use,
        numel,
        max_padded,
        max_blocks,
        BLOCK_M=block_m,
        BLOCK_E=triton.next_power_of_2(num_experts),
        CHUNK=min(_ALIGN_CHUNK, triton.next_power_of_2(numel)),
        num_warps=4,
    )
    return Alignment(sorted_ids, expert_ids, num_padded, max_padded)


def _grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor | None,
    out: torch.Tensor,
    align: Alignment,
    topk_weights: torch.Tensor,
    n: int,
    a_rows_per_pair: int,
    config: GemmConfig,
    gated: bool = False,
    activation: str = "silu",
    mul_weight: bool = False,
    bias: torch.Tensor | None = None,
    swiglu: tuple[float, float] = (1.702, 7.0),
) -> None:
    if a.stride(-1) != 1 or b.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("fused MoE needs unit-stride rows")
    mxfp4 = b.dtype == torch.uint8
    if mxfp4 and (b_scale is None or config.block_k % MXFP4_GROUP):
        raise ValueError(f"MXFP4 experts need their scales and K tiles of {MXFP4_GROUP}s")
    k = a.shape[-1]
    grid = (triton.cdiv(align.max_padded, config.block_m) * triton.cdiv(n, config.block_n),)
    _moe_gemm_kernel[grid](
        a,
        b,
        out,
        b_scale if b_scale is not None else b,
        bias if bias is not None else b,
        topk_weights,
        align.sorted_ids,
        align.expert_ids,
        align.num_padded,
        n,
        k,
        align.max_padded,
        topk_weights.numel(),
        a.stride(0),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        b_scale.stride(0) if b_scale is not None else 0,
        b_scale.stride(1) if mxfp4 and b_scale is not None else 0,
        bias.stride(0) if bias is not None else 0,
        swiglu[0],
        swiglu[1],
        A_ROWS_PER_PAIR=a_rows_per_pair,
        GATED=gated,
        ACT=activation_code(activation),
        MUL_WEIGHT=mul_weight,
        HAS_SCALE=b_scale is not None and not mxfp4,
        HAS_BIAS=bias is not None,
        MXFP4=mxfp4,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        DOT_PRECISION=dot_precision(a.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_use: torch.Tensor,
    activation: str = "silu",
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu: tuple[float, float] = (1.702, 7.0),
    gemv: bool | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum over k of topk_weights[t, k] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, k],
    plus `add` [T, H] where given (in the routed GEMV's epilogue, else after the sum).

    hidden [T, H]; w13 [E, 2I, H] ([gate; up] per expert); w2 [E, H, I]; scales, for FP8
    weights, [E, 2I] and [E, H] float32 per output channel; MXFP4 weights (uint8) are
    [E, 2I, H / 2] and [E, H, I / 2] with uint8 scales [E, 2I, H / 32] and [E, H, I / 32];
    biases [E, 2I] and [E, H];
    swiglu: (alpha, limit) of the clamped SwiGLU. Returns [T, H] in hidden's dtype.

    `gemv`: take the routed GEMV (moe_gemv.py: two launches, no sort) rather than the grouped
    GEMMs; None takes it for the few tokens it is made for (`uses_moe_gemv`). `config` is the
    grouped GEMMs' tiles."""
    tokens, hidden_size = hidden.shape
    num_experts, two_i, _ = w13.shape
    top_k = topk_ids.shape[1]
    if gemv if gemv is not None else uses_moe_gemv(tokens, top_k):
        return fused_moe_gemv(
            hidden,
            w13,
            w2,
            topk_weights,
            topk_ids,
            expert_use,
            activation,
            w13_scale,
            w2_scale,
            w13_bias,
            w2_bias,
            swiglu,
            add=add,
        )
    numel = tokens * top_k
    config = config or gemm_config(numel, hidden.dtype)
    align = align_by_expert(topk_ids, num_experts, config.block_m, expert_use)
    weights = topk_weights.reshape(-1)
    inter = two_i // 2
    acts = torch.empty((numel, inter), dtype=hidden.dtype, device=hidden.device)
    _grouped_gemm(
        hidden,
        w13,
        w13_scale,
        acts,
        align,
        weights,
        inter,
        top_k,
        config,
        gated=True,
        activation=activation,
        bias=w13_bias,
        swiglu=swiglu,
    )
    down = torch.empty((numel, hidden_size), dtype=hidden.dtype, device=hidden.device)
    _grouped_gemm(
        acts,
        w2,
        w2_scale,
        down,
        align,
        weights,
        hidden_size,
        1,
        config,
        mul_weight=True,
        bias=w2_bias,
    )
    return topk_sum(down.view(tokens, top_k, hidden_size), add)
