"""The Triton attention backend: paged decode and extend kernels of our own (`kernels/`).

Per forward pass it only sizes scratch space and picks the number of KV splits; the kernels
read req_to_token, seq_lens and the extend offsets straight from the ForwardBatch tensors.
That is what makes CUDA graphs cheap here: capture points the kernels at the graph runner's
static tensors, and replay has nothing to recompute (the split count depends on the batch
size only, never on the lengths).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.kernels.decode_attention import (
    choose_num_kv_splits,
    decode_attention_fwd,
    scratch_rows,
)
from radixserve.kernels.extend_attention import extend_attention_fwd
from radixserve.layers.attention.base import AttentionBackend, AttentionContext, split_heads

if TYPE_CHECKING:
    from radixserve.forward.forward_batch import ForwardBatch
    from radixserve.layers.radix_attention import RadixAttention

# Stands in for the SM count where there is no CUDA device (the Triton interpreter on a CPU).
_SMS_WITHOUT_CUDA = 8


@dataclass
class DecodeMetadata:
    """Split-KV scratch for one decode pass: partial outputs and their log-sum-exp."""

    mid_o: torch.Tensor  # [bs, q_heads, splits, head_dim] float32
    mid_lse: torch.Tensor  # [bs, q_heads, splits] float32
    num_kv_splits: int


@dataclass
class ExtendMetadata:
    max_extend_len: int  # sizes the kernel grid; known on the host from the scheduler


class TritonAttnBackend(AttentionBackend):
    name = "triton"
    decode_metadata_type = DecodeMetadata
    extend_metadata_type = ExtendMetadata

    def __init__(self, context: AttentionContext) -> None:
        super().__init__(context)
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            self.num_sms = props.multi_processor_count
        else:
            self.num_sms = _SMS_WITHOUT_CUDA
        # flat split-KV scratch shared by every captured batch size (graphs replay one at a time)
        self._graph_scratch_o: torch.Tensor | None = None
        self._graph_scratch_lse: torch.Tensor | None = None
        # captured batch size -> its metadata (views of the scratch), which replay reuses
        self._graph_metadata: dict[int, DecodeMetadata] = {}

    def _decode_metadata(self, bs: int, in_graph: bool = False) -> DecodeMetadata:
        splits = choose_num_kv_splits(bs, self.num_kv_heads, self.num_sms)
        rows = bs * splits * self.num_heads
        if in_graph:
            if self._graph_scratch_o is None or self._graph_scratch_lse is None:
                raise RuntimeError("init_cuda_graph_state must run before capture")
            flat_o, flat_lse = self._graph_scratch_o[:rows], self._graph_scratch_lse[:rows]
        else:
            flat_o = torch.empty((rows, self.head_dim), dtype=torch.float32, device=self.device)
            flat_lse = torch.empty(rows, dtype=torch.float32, device=self.device)
        return DecodeMetadata(
            mid_o=flat_o.view(bs, self.num_heads, splits, self.head_dim),
            mid_lse=flat_lse.view(bs, self.num_heads, splits),
            num_kv_splits=splits,
        )

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode.is_decode():
            self.forward_metadata = self._decode_metadata(forward_batch.batch_size)
        else:
            self.forward_metadata = ExtendMetadata(
                max_extend_len=max(forward_batch.extend_seq_lens_cpu, default=0)
            )

    def init_cuda_graph_state(self, max_bs: int) -> None:
        rows = scratch_rows(max_bs, self.num_kv_heads, self.num_sms) * self.num_heads
        self._graph_scratch_o = torch.empty(
            (rows, self.head_dim), dtype=torch.float32, device=self.device
        )
        self._graph_scratch_lse = torch.empty(rows, dtype=torch.float32, device=self.device)
        self._graph_metadata = {}

    def capture_decode_metadata(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> DecodeMetadata:
        meta = self._graph_metadata[bs] = self._decode_metadata(bs, in_graph=True)
        return meta

    def replay_decode_metadata(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor | None,
    ) -> DecodeMetadata:
        # The captured kernels read the runner's static req_pool_indices/seq_lens themselves,
        # and the split count and scratch are functions of bs: nothing to refill.
        return self._graph_metadata[bs]

    def run_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        meta: DecodeMetadata,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        k_scale: float,
        v_scale: float,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        decode_attention_fwd(
            q,
            k_buffer,
            v_buffer,
            out,
            forward_batch.req_to_token_pool.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            meta.mid_o,
            meta.mid_lse,
            meta.num_kv_splits,
            layer.scaling,
            sliding_window=layer.sliding_window_size,
            logit_cap=layer.logit_cap,
            k_scale=k_scale,
            v_scale=v_scale,
            sinks=layer.sinks,
        )
        return out

    def run_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        meta: ExtendMetadata,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        k_scale: float,
        v_scale: float,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        extend_attention_fwd(
            q,
            split_heads(k, layer.tp_k_head_num, layer.head_dim),
            split_heads(v, layer.tp_v_head_num, layer.head_dim),
            out,
            k_buffer,
            v_buffer,
            forward_batch.req_to_token_pool.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.extend_prefix_lens,
            forward_batch.extend_seq_lens,
            forward_batch.extend_start_loc,
            meta.max_extend_len,
            layer.scaling,
            sliding_window=layer.sliding_window_size,
            logit_cap=layer.logit_cap,
            k_scale=k_scale,
            v_scale=v_scale,
            sinks=layer.sinks,
        )
        return out
