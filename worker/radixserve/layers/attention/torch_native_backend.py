"""The reference backend: plain torch over the paged KV pool, on any device.

It stores this pass's K/V into the pool first and then reads every request's keys and values
back through `req_to_token`, exactly as the fast backends must; so it checks the paging, not
just the maths. Decode runs all requests as one padded, masked batch (one SDPA call per
layer); extend runs request by request with a causal mask offset by the cached prefix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixserve.layers.attention.base import AttentionBackend, AttentionContext

if TYPE_CHECKING:
    from radixserve.forward.forward_batch import ForwardBatch
    from radixserve.layers.radix_attention import RadixAttention


class TorchNativeAttnBackend(AttentionBackend):
    # pads decode to the longest sequence of the pass: shapes change every step
    supports_cuda_graph = False

    def __init__(self, context: AttentionContext) -> None:
        self.device = context.device
        self._decode_index: torch.Tensor | None = None
        self._decode_mask: torch.Tensor | None = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if not forward_batch.forward_mode.is_decode():
            return
        # Padded [bs, max_len] slot index and validity mask, shared by every layer.
        seq_lens = forward_batch.seq_lens
        max_len = int(forward_batch.seq_lens_cpu.max())
        rows = forward_batch.req_to_token_pool.req_to_token[
            forward_batch.req_pool_indices, :max_len
        ]
        mask = torch.arange(max_len, device=seq_lens.device)[None, :] < seq_lens[:, None]
        self._decode_index = torch.where(mask, rows.long(), 0)
        self._decode_mask = mask

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if save_kv_cache:
            self.store_kv(k, v, layer, forward_batch)
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        bs = forward_batch.batch_size
        keys = k_buf[self._decode_index].to(q.dtype)  # [bs, L, kvh, d]
        values = v_buf[self._decode_index].to(q.dtype)
        qh = q.view(bs, layer.tp_q_head_num, 1, layer.head_dim)
        out = _sdpa(
            qh,
            keys.transpose(1, 2),
            values.transpose(1, 2),
            self._decode_mask[:, None, None, :],
            layer,
        )
        return out.reshape(bs, layer.tp_q_head_num * layer.head_dim)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if save_kv_cache:
            self.store_kv(k, v, layer, forward_batch)
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        out = torch.empty_like(q)
        start = 0
        for i in range(forward_batch.batch_size):
            ext = forward_batch.extend_seq_lens_cpu[i]
            prefix = forward_batch.extend_prefix_lens_cpu[i]
            seq_len = prefix + ext
            slots = req_to_token[forward_batch.req_pool_indices[i], :seq_len].long()
            keys = k_buf[slots].to(q.dtype).transpose(0, 1)[None]  # [1, kvh, L, d]
            values = v_buf[slots].to(q.dtype).transpose(0, 1)[None]
            qi = q[start : start + ext].view(ext, layer.tp_q_head_num, layer.head_dim)
            qi = qi.transpose(0, 1)[None]  # [1, h, ext, d]
            # query j (absolute position prefix + j) sees keys 0..prefix + j
            causal = (
                torch.arange(seq_len, device=q.device)[None, :]
                <= (torch.arange(ext, device=q.device) + prefix)[:, None]
            )
            o = _sdpa(qi, keys, values, causal[None, None], layer)
            out[start : start + ext] = o[0].transpose(0, 1).reshape(ext, -1)
            start += ext
        return out


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, layer: RadixAttention
) -> torch.Tensor:
    """q: [b, h, s, d]; k, v: [b, kvh, L, d]; mask broadcastable to [b, h, s, L] (True = attend)."""
    # enable_gqa: each KV head serves its group of query heads without copying K/V per head
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        scale=layer.scaling,
        enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
    )
