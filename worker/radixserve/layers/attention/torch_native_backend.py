"""The reference backend: plain torch over the paged KV pool, on any device.

It stores this pass's K/V into the pool first and then reads every request's keys and values
back through `req_to_token`, exactly as the fast backends must; so it checks the paging, not
just the maths. Decode runs all requests as one padded, masked batch (one SDPA call per
layer); extend runs request by request with a causal mask offset by the cached prefix. A
layer's sliding window narrows those masks; a logit soft-cap (which SDPA cannot apply) takes
the explicit softmax path, in the reference's order of operations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixserve.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixserve.forward.forward_batch import ForwardBatch
    from radixserve.layers.radix_attention import RadixAttention


@dataclass
class NativeDecodeMetadata:
    """One decode pass's padded [bs, max_len] slot index and validity mask, every layer's."""

    index: torch.Tensor  # [bs, max_len] int64, 0 where padded
    mask: torch.Tensor  # [bs, max_len] bool
    seq_lens: torch.Tensor  # [bs]
    # window -> decode mask of this pass (the full mask narrowed to the last W keys)
    window_masks: dict[int, torch.Tensor] = field(default_factory=dict)


class TorchNativeAttnBackend(AttentionBackend):
    # pads decode to the longest sequence of the pass: shapes change every step
    supports_cuda_graph = False
    name = "torch_native"
    decode_metadata_type = NativeDecodeMetadata

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if not forward_batch.forward_mode.is_decode():
            return  # extend reads each request's slots itself
        seq_lens = forward_batch.seq_lens
        max_len = int(forward_batch.seq_lens_cpu.max())
        rows = forward_batch.req_to_token_pool.req_to_token[
            forward_batch.req_pool_indices, :max_len
        ]
        mask = torch.arange(max_len, device=seq_lens.device)[None, :] < seq_lens[:, None]
        self.forward_metadata = NativeDecodeMetadata(
            torch.where(mask, rows.long(), 0), mask, seq_lens
        )

    @staticmethod
    def _decode_mask_for(meta: NativeDecodeMetadata, layer: RadixAttention) -> torch.Tensor:
        window = layer.sliding_window_size
        if window <= 0:
            return meta.mask
        if window not in meta.window_masks:
            positions = torch.arange(meta.mask.shape[1], device=meta.mask.device)
            recent = positions[None, :] >= (meta.seq_lens - window)[:, None]
            meta.window_masks[window] = meta.mask & recent
        return meta.window_masks[window]

    def run_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        meta: NativeDecodeMetadata,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        k_scale: float,
        v_scale: float,
    ) -> torch.Tensor:
        bs = forward_batch.batch_size
        # [bs, L, kvh, d], the FP8 pool's scales applied
        keys, values = forward_batch.token_to_kv_pool.read_kv(layer.layer_id, meta.index, q.dtype)
        qh = q.view(bs, layer.tp_q_head_num, 1, layer.head_dim)
        out = _attention(
            qh,
            keys.transpose(1, 2),
            values.transpose(1, 2),
            self._decode_mask_for(meta, layer)[:, None, None, :],
            layer,
        )
        return out.reshape(bs, layer.tp_q_head_num * layer.head_dim)

    def run_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        meta: object,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        k_scale: float,
        v_scale: float,
    ) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        out = torch.empty_like(q)  # [tokens, h, d]
        start = 0
        for i in range(forward_batch.batch_size):
            ext = forward_batch.extend_seq_lens_cpu[i]
            prefix = forward_batch.extend_prefix_lens_cpu[i]
            seq_len = prefix + ext
            slots = req_to_token[forward_batch.req_pool_indices[i], :seq_len].long()
            keys, values = pool.read_kv(layer.layer_id, slots, q.dtype)
            keys = keys.transpose(0, 1)[None]  # [1, kvh, L, d]
            values = values.transpose(0, 1)[None]
            qi = q[start : start + ext].transpose(0, 1)[None]  # [1, h, ext, d]
            # query j (absolute position prefix + j) sees keys 0..prefix + j, or with a window
            # W only the last W of them
            key_pos = torch.arange(seq_len, device=q.device)[None, :]
            query_pos = (torch.arange(ext, device=q.device) + prefix)[:, None]
            visible = key_pos <= query_pos
            if layer.sliding_window_size > 0:
                visible &= key_pos > query_pos - layer.sliding_window_size
            o = _attention(qi, keys, values, visible[None, None], layer)
            out[start : start + ext] = o[0].transpose(0, 1)
            start += ext
        return out


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, layer: RadixAttention
) -> torch.Tensor:
    """q: [b, h, s, d]; k, v: [b, kvh, L, d]; mask broadcastable to [b, h, s, L] (True = attend)."""
    if layer.logit_cap > 0 or layer.sinks is not None:
        return _explicit_attention(q, k, v, mask, layer)
    # enable_gqa: each KV head serves its group of query heads without copying K/V per head
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        scale=layer.scaling,
        enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
    )


def _explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, layer: RadixAttention
) -> torch.Tensor:
    """Explicit softmax: the scores, soft-capped if the layer caps them (cap * tanh(q.k *
    scale / cap), Gemma 2), masked, then a float32 softmax rounded to q's dtype; with sinks,
    each head's sink logit is one more column of that softmax whose weight is dropped
    (gpt-oss's eager attention)."""
    group = layer.tp_q_head_num // layer.tp_k_head_num
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * layer.scaling
    if layer.logit_cap > 0:
        cap = layer.logit_cap
        scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~mask, float("-inf")).float()
    if layer.sinks is not None:
        sinks = layer.sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights.to(q.dtype), v)
