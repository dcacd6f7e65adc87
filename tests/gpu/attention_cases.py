"""Random paged attention batches and a float64 dense reference, shared by the backend tests.

A case scatters each request's tokens over random KV slots (a random permutation of the pool,
slot 0 never used), puts requests in random req_to_token rows, fills the whole pool with
random values (never zeros: they hide unwritten outputs), and keeps its own dense copy of
every request's K/V so the reference does not trust the pool it is checking.

A case may narrow attention to a sliding window, soft-cap the scores, give each head an
attention sink (a random logit in the softmax's denominator), and keep its KV in FP8
(`kv_dtype`): new K/V values are then drawn on the FP8 grid times a power-of-two scale, so
storing them is exact and every backend, however it reads K/V, sees the same values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from radixserve.forward.forward_batch import ForwardBatch
from radixserve.forward.mode import ForwardMode
from radixserve.layers.attention.base import AttentionContext
from radixserve.layers.radix_attention import RadixAttention
from radixserve.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool

TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


@dataclass
class AttentionCase:
    forward_batch: ForwardBatch
    layer: RadixAttention
    context: AttentionContext  # what a backend is built from
    q: torch.Tensor  # [tokens, heads * head_dim]
    k: torch.Tensor  # [tokens, kv_heads * head_dim]
    v: torch.Tensor
    dense_k: list[torch.Tensor]  # per request [seq_len, kv_heads, head_dim]: prefix + new
    dense_v: list[torch.Tensor]
    extend_lens: list[int]  # new tokens per request (1 for decode)


def make_context(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
    req_to_token_pool: ReqToTokenPool,
    token_to_kv_pool: TokenToKVPool,
) -> AttentionContext:
    return AttentionContext(
        device=torch.device(device),
        dtype=dtype,
        kv_dtype=token_to_kv_pool.dtype,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        req_to_token=req_to_token_pool.req_to_token,
    )


def make_case(
    mode: ForwardMode,
    prefix_lens: list[int],
    extend_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
    generator: torch.Generator,
    spare_rows: int = 3,
    pool_size: int | None = None,
    max_context: int | None = None,
    sliding_window: int = -1,
    logit_cap: float = 0.0,
    kv_dtype: torch.dtype | None = None,
    kv_scales: tuple[float, float] = (0.5, 0.25),
    sinks: bool = False,
) -> AttentionCase:
    """One pass over len(prefix_lens) requests; decode passes need every extend_len == 1.

    Fixed pool_size/max_context/spare_rows give equal-shaped pools, so one case's contents can
    be copied into another's (CUDA-graph replay over the pools a graph was captured with).
    """
    bs = len(prefix_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    total = sum(seq_lens)
    pool_size = pool_size or total + 17
    max_context = max_context or max(seq_lens) + 5

    # Bulk random data is drawn on the device (a GPU pool can hold millions of tokens),
    # from a generator seeded by the caller's CPU one, so a case is reproducible.
    dev_gen = torch.Generator(device=device)
    dev_gen.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=dev_gen, device=device).to(dtype)

    req_pool = ReqToTokenPool(bs + spare_rows, max_context, device)
    kv_pool = TokenToKVPool(pool_size, 1, num_kv_heads, head_dim, kv_dtype or dtype, device)
    kv_pool.k_buffers[0].copy_(randn(pool_size + 1, num_kv_heads, head_dim))
    kv_pool.v_buffers[0].copy_(randn(pool_size + 1, num_kv_heads, head_dim))
    fp8 = kv_pool.is_fp8
    if fp8:
        kv_pool.set_scales(0, *kv_scales)

    def on_fp8_grid(x: torch.Tensor, scale: float) -> torch.Tensor:
        """x rounded to values an FP8 pool with this scale stores exactly."""
        return (x.float() / scale).to(kv_pool.dtype).float().mul(scale).to(dtype) if fp8 else x

    req_pool.req_to_token.copy_(
        torch.randint(
            0, pool_size + 1, req_pool.req_to_token.shape, generator=dev_gen, device=device
        )
    )
    slots = torch.randperm(pool_size, generator=dev_gen, device=device)[:total] + 1
    rows = torch.randperm(bs + spare_rows, generator=generator)[:bs]
    tokens = sum(extend_lens)
    q, k, v = (
        randn(tokens, num_heads * head_dim),
        on_fp8_grid(randn(tokens, num_kv_heads * head_dim), kv_pool.scales(0)[0]),
        on_fp8_grid(randn(tokens, num_kv_heads * head_dim), kv_pool.scales(0)[1]),
    )
    dense_k, dense_v, out_cache_loc = [], [], []
    offset, token = 0, 0
    for row, prefix, ext in zip(rows.tolist(), prefix_lens, extend_lens, strict=True):
        req_slots = slots[offset : offset + prefix + ext]
        offset += prefix + ext
        req_pool.req_to_token[row, : prefix + ext] = req_slots.to(torch.int32)
        new_k = k[token : token + ext].view(ext, num_kv_heads, head_dim)
        new_v = v[token : token + ext].view(ext, num_kv_heads, head_dim)
        token += ext
        old_k, old_v = kv_pool.read_kv(0, req_slots[:prefix], dtype)
        dense_k.append(torch.cat([old_k, new_k]))
        dense_v.append(torch.cat([old_v, new_v]))
        out_cache_loc.append(req_slots[prefix:])

    def dev_long(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
    extend_fields = {}
    if mode.is_extend():
        starts = [sum(extend_lens[:i]) for i in range(bs)]
        extend_fields = dict(
            extend_num_tokens=tokens,
            extend_seq_lens=dev_long(extend_lens),
            extend_prefix_lens=dev_long(prefix_lens),
            extend_start_loc=dev_long(starts),
            extend_seq_lens_cpu=list(extend_lens),
            extend_prefix_lens_cpu=list(prefix_lens),
        )
    positions = torch.cat(
        [torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens, strict=True)]
    )
    forward_batch = ForwardBatch(
        forward_mode=mode,
        batch_size=bs,
        input_ids=torch.zeros(tokens, dtype=torch.int64, device=device),
        positions=positions.to(device),
        req_pool_indices=rows.to(device),
        seq_lens=seq_lens_cpu.to(device),
        seq_lens_cpu=seq_lens_cpu,
        seq_lens_sum=total,
        out_cache_loc=torch.cat(out_cache_loc).to(torch.int64),
        req_to_token_pool=req_pool,
        token_to_kv_pool=kv_pool,
        attn_backend=None,  # type: ignore[arg-type]  # set by run_backend
        **extend_fields,
    )
    layer = RadixAttention(
        num_heads,
        head_dim,
        head_dim**-0.5,
        num_kv_heads,
        layer_id=0,
        sliding_window_size=sliding_window,
        logit_cap=logit_cap,
        has_sinks=sinks,
    )
    if layer.sinks is not None:
        # around the scores' own scale, so a sink takes a real share of the softmax
        with torch.no_grad():
            layer.sinks.copy_(torch.randn(num_heads, generator=generator) * 2)
        layer.to(device)
    context = make_context(num_heads, num_kv_heads, head_dim, dtype, device, req_pool, kv_pool)
    context = dataclasses.replace(context, variants=(layer.variant,))
    return AttentionCase(
        forward_batch, layer, context, q, k, v, dense_k, dense_v, list(extend_lens)
    )


def dense_reference(case: AttentionCase) -> torch.Tensor:
    """Causal attention in float64 from the case's own K/V copy: [tokens, heads * head_dim]."""
    layer = case.layer
    group = layer.tp_q_head_num // layer.tp_k_head_num
    outs, token = [], 0
    for keys, values, ext in zip(case.dense_k, case.dense_v, case.extend_lens, strict=True):
        seq_len = keys.shape[0]
        prefix = seq_len - ext
        q = case.q[token : token + ext].double().view(ext, layer.tp_q_head_num, layer.head_dim)
        token += ext
        kh = keys.double().repeat_interleave(group, dim=1)  # [L, h, d]
        vh = values.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, kh) * layer.scaling
        if layer.logit_cap > 0:
            scores = torch.tanh(scores / layer.logit_cap) * layer.logit_cap
        key_pos = torch.arange(seq_len, device=q.device)[None, :]
        query_pos = torch.arange(ext, device=q.device)[:, None] + prefix
        visible = key_pos <= query_pos
        if layer.sliding_window_size > 0:
            visible &= key_pos > query_pos - layer.sliding_window_size
        scores = scores.masked_fill(~visible[None], float("-inf"))
        if layer.sinks is not None:
            sinks = layer.sinks.detach().double().to(q.device).view(-1, 1, 1)
            weights = torch.cat([scores, sinks.expand(-1, ext, 1)], -1).softmax(-1)[..., :-1]
        else:
            weights = scores.softmax(-1)
        out = torch.einsum("hqk,khd->qhd", weights, vh)
        outs.append(out.reshape(ext, -1))
    return torch.cat(outs)


def run_backend(backend, case: AttentionCase) -> torch.Tensor:
    """Metadata once, then the layer's forward, as the model runner would do it."""
    case.forward_batch.attn_backend = backend
    backend.init_forward_metadata(case.forward_batch)
    return backend.forward(case.q, case.k, case.v, case.layer, case.forward_batch)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double().to(out.device)
    return float((out64 - ref64).norm() / ref64.norm())


def stored_kv_matches(case: AttentionCase) -> bool:
    """After a pass the pool holds this pass's k/v at out_cache_loc."""
    fb, layer = case.forward_batch, case.layer
    k_stored, v_stored = fb.token_to_kv_pool.read_kv(layer.layer_id, fb.out_cache_loc, case.k.dtype)
    k = case.k.view(-1, layer.tp_k_head_num, layer.head_dim)
    v = case.v.view(-1, layer.tp_v_head_num, layer.head_dim)
    return bool(torch.equal(k_stored, k) and torch.equal(v_stored, v))


def random_lengths(
    mode: ForwardMode, generator: torch.Generator, max_bs: int = 6
) -> tuple[list[int], list[int]]:
    """(prefix_lens, extend_lens): decode up to 1500 tokens of context (several KV splits);
    extend with prefixes 0..300 (often 0) and 1..200 new tokens; MIXED adds length-1 rows."""

    def draw(low: int, high: int, n: int) -> list[int]:
        return torch.randint(low, high + 1, (n,), generator=generator).tolist()

    bs = draw(1, max_bs, 1)[0]
    if mode.is_decode():
        return draw(0, 1500, bs), [1] * bs
    prefix = [p if p % 3 else 0 for p in draw(0, 300, bs)]
    extend = draw(1, 200, bs)
    if mode.is_mixed():
        prefix += draw(1, 400, 2)
        extend += [1, 1]
    return prefix, extend
