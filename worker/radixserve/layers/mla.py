"""Multi-head latent attention (MLA, DeepSeek V2/V3) over the latent pool
(mem_cache/mla_memory_pool.py): the two attention computations an MLA layer makes.

- Decode, absorbed: the query arrives with W_UK folded in (`[q_latent | q_rope]` per head,
  as two tensors) and attends to the pool's latent rows directly, one shared key per token, the value being the
  row's latent part; the caller applies W_UV to the result. Per token it reads
  kv_lora_rank + rope_dim values, not heads x (key + value). On CUDA the Triton kernel
  (kernels/mla_decode.py, which the captured graphs replay), elsewhere the torch reference.
- Extend (prefill, chunked prefill, mixed batches), expanded: each request's latents, its
  cached prefix included, are read back through req_to_token and expanded by kv_b_proj into
  per-head keys and values, then causal attention with the prefix offset. Prefill is compute
  bound, and the expanded form does fewer FLOPs there than the absorbed one. On CUDA the
  requests' latents are gathered and expanded together, in groups of up to
  EXPAND_GROUP_TOKENS keys (their slots gathered once a pass, `key_groups`), and one Triton
  launch a group attends (kernels/mla_extend.py);
  elsewhere the torch reference, request by request.

Neither goes through the attention backend: the backend of an MLA model is built for the pool's
shape and keeps its metadata and graph plumbing, which these computations do not need (they
read req_to_token, the rows and the lengths themselves, as the Triton decode kernels do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixserve.kernels import triton_support
from radixserve.kernels.kv_indices import gather_kv_indices
from radixserve.kernels.mla_decode import mla_decode_fwd
from radixserve.kernels.mla_extend import mla_extend_attention

if TYPE_CHECKING:
    from radixserve.forward.forward_batch import ForwardBatch

# Stands in for the SM count without CUDA (the Triton interpreter on a CPU).
_SMS_WITHOUT_CUDA = 8
# Keys expanded at once on the Triton extend path: a pass's requests are taken in groups
# whose prefixes and new tokens add up to at most this (a longer request goes alone, as every
# request did before), so a pass of many long cached prefixes does not expand them all at
# once: 16k keys are 128 MB of bf16 keys and values at V2-Lite's 16 heads, 1 GB at V3's 128.
EXPAND_GROUP_TOKENS = 16384


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return _SMS_WITHOUT_CUDA
    return torch.cuda.get_device_properties(device).multi_processor_count


def mla_attention_backend(requested: str, device: str) -> str:
    """The attention backend an MLA model is built with: its layers call none for attention,
    the backend only keeps the pass's metadata and graph plumbing. `auto` on CUDA is triton
    (FlashInfer would build its modules for a head size no layer uses); an explicit
    flashinfer is refused in one line."""
    if requested == "flashinfer":
        raise ValueError(
            "--attention-backend flashinfer does not serve MLA models (DeepSeek); use auto, "
            "triton or torch_native"
        )
    if requested == "auto" and device != "cpu":
        return "triton"
    return requested


def mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    kv_buffer: torch.Tensor,
    forward_batch: ForwardBatch,
    scaling: float,
) -> torch.Tensor:
    """The absorbed query, q_latent [bs, heads, kv_lora_rank] (W_UK applied) and q_rope
    [bs, heads, rope_dim], against kv_buffer, the layer's latent pool [slots, 1, kv_lora_rank
    + rope_dim] with this step's rows stored. -> [bs, heads, kv_lora_rank]."""
    req_to_token = forward_batch.req_to_token_pool.req_to_token
    if triton_support.enabled_for(q_latent):
        return mla_decode_fwd(
            q_latent,
            q_rope,
            kv_buffer,
            req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            scaling,
            num_sms(q_latent.device),
        )
    return mla_decode_native(
        torch.cat([q_latent, q_rope], dim=-1),
        kv_buffer,
        req_to_token,
        forward_batch.req_pool_indices,
        forward_batch.seq_lens,
        int(forward_batch.seq_lens_cpu.max()),
        q_latent.shape[-1],
        scaling,
    )


def mla_decode_native(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    kv_lora_rank: int,
    scaling: float,
) -> torch.Tensor:
    """The reference of `mla_decode`: all requests as one padded, masked batch."""
    rows = req_to_token[req_pool_indices, :max_len].long()
    mask = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None]
    kv = kv_buffer[torch.where(mask, rows, 0), 0].to(q.dtype)  # [bs, L, latent + rope]
    scores = torch.einsum("bhc,blc->bhl", q, kv) * scaling
    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32))
    weights = weights.to(q.dtype)
    return torch.einsum("bhl,blc->bhc", weights, kv[..., :kv_lora_rank])


@dataclass(frozen=True)
class KeyGroup:
    """Consecutive requests [first, end) of an extend pass whose keys (cached prefix and new
    tokens) are expanded together, packed request after request: request first + i's from
    kv_indptr[i]; `slots` their pool rows, [kv_indptr[-1]] int64."""

    first: int
    end: int
    max_extend: int
    kv_indptr: torch.Tensor
    slots: torch.Tensor


def key_groups(forward_batch: ForwardBatch) -> list[KeyGroup]:
    """The pass's key groups, made at its first MLA layer and kept on the forward batch: every
    layer packs the same slots (only the pool it reads them from differs)."""
    if forward_batch.mla_key_groups is None:
        prefix_lens = forward_batch.extend_prefix_lens_cpu
        extend_lens = forward_batch.extend_seq_lens_cpu
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        groups = []
        for first, end, keys in expand_groups(prefix_lens, extend_lens, EXPAND_GROUP_TOKENS):
            # kv_indptr from the lengths on the device, the slots gathered from req_to_token in
            # one launch: no host round trip
            seq_lens = (
                forward_batch.extend_prefix_lens[first:end]
                + forward_batch.extend_seq_lens[first:end]
            )
            kv_indptr = F.pad(torch.cumsum(seq_lens, 0), (1, 0))
            slots = torch.empty(keys, dtype=torch.int64, device=seq_lens.device)
            gather_kv_indices(
                req_to_token, forward_batch.req_pool_indices[first:end], seq_lens, kv_indptr, slots
            )
            groups.append(KeyGroup(first, end, max(extend_lens[first:end]), kv_indptr, slots))
        forward_batch.mla_key_groups = groups
    return forward_batch.mla_key_groups


def mla_extend(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    forward_batch: ForwardBatch,
    expand: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    kv_lora_rank: int,
    scaling: float,
) -> torch.Tensor:
    """q: [tokens, heads, qk_nope + rope_dim] of this pass's new tokens; kv_buffer: the latent
    pool, this pass's rows stored; `expand(latent [L, kv_lora_rank])` -> (k_nope [L, heads,
    qk_nope], v [L, heads, v_head_dim]) (the layer's kv_b_proj). -> [tokens, heads, v_head_dim]."""
    if not triton_support.enabled_for(q):
        return mla_extend_native(q, kv_buffer, forward_batch, expand, kv_lora_rank, scaling)
    out = None
    for group in key_groups(forward_batch):
        rows = kv_buffer[group.slots, 0].to(q.dtype)  # [keys, latent + rope]
        k_nope, v = expand(rows[:, :kv_lora_rank])
        if out is None:
            out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        mla_extend_attention(
            q,
            k_nope,
            rows[:, kv_lora_rank:],
            v,
            out,
            group.kv_indptr,
            forward_batch.extend_prefix_lens[group.first : group.end],
            forward_batch.extend_seq_lens[group.first : group.end],
            forward_batch.extend_start_loc[group.first : group.end],
            group.max_extend,
            scaling,
        )
    assert out is not None, "an extend pass has at least one request"
    return out


def expand_groups(
    prefix_lens: list[int], extend_lens: list[int], max_keys: int
) -> list[tuple[int, int, int]]:
    """(first, end, keys): consecutive requests [first, end) whose keys (prefix + new tokens)
    add up to at most max_keys; a request with more keys than that forms a group of its own."""
    groups: list[tuple[int, int, int]] = []
    first, keys = 0, 0
    for i, n in enumerate(p + e for p, e in zip(prefix_lens, extend_lens, strict=True)):
        if i > first and keys + n > max_keys:
            groups.append((first, i, keys))
            first, keys = i, 0
        keys += n
    groups.append((first, len(prefix_lens), keys))
    return groups


def mla_extend_native(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    forward_batch: ForwardBatch,
    expand: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    kv_lora_rank: int,
    scaling: float,
) -> torch.Tensor:
    """`mla_extend` in torch, request by request: the CPU's path and the Triton path's
    reference."""
    # here, not at the top: torch.nn.attention.bias imports torch._dynamo and sympy (about 800
    # modules, 0.6 s of CPU, of every scheduler process's start, read from a cold disk)
    from torch.nn.attention.bias import causal_lower_right

    req_to_token = forward_batch.req_to_token_pool.req_to_token
    outputs = []
    start = 0
    for i in range(forward_batch.batch_size):
        ext = forward_batch.extend_seq_lens_cpu[i]
        prefix = forward_batch.extend_prefix_lens_cpu[i]
        seq_len = prefix + ext
        slots = req_to_token[forward_batch.req_pool_indices[i], :seq_len].long()
        rows = kv_buffer[slots, 0].to(q.dtype)  # [L, latent + rope]
        k_nope, v = expand(rows[:, :kv_lora_rank])
        heads = k_nope.shape[1]
        k_rope = rows[:, None, kv_lora_rank:].expand(-1, heads, -1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        qi = q[start : start + ext]
        v_dim = v.shape[-1]
        if q.is_cuda and v_dim != k.shape[-1]:
            # FlashAttention takes one head size for q, k and v: v padded with zeros
            v = F.pad(v, (0, k.shape[-1] - v_dim))
        # query j (position prefix + j) sees keys 0 .. prefix + j: the causal mask aligned to
        # the bottom right, which the fused SDPA kernels apply without building it
        out = F.scaled_dot_product_attention(
            qi.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=causal_lower_right(ext, seq_len),
            scale=scaling,
        )
        outputs.append(out[0, ..., :v_dim].transpose(0, 1))
        start += ext
    return torch.cat(outputs) if len(outputs) > 1 else outputs[0]
