"""The attention backend interface.

A backend turns (q, k, v) of one layer into attention output over the paged KV pool: it stores
this pass's K/V at `forward_batch.out_cache_loc`, then reads every token of each request
through `req_to_token_pool.req_to_token[req_pool_idx, :seq_len]`. Per-pass metadata (index
arrays, planned kernels) is built once in `init_forward_metadata` and reused by every layer;
the CUDA-graph methods do the same into static buffers so a captured graph can be replayed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.forward.forward_batch import ForwardBatch
from radixserve.forward.mode import ForwardMode

if TYPE_CHECKING:
    from radixserve.layers.radix_attention import RadixAttention


@dataclass(frozen=True)
class AttentionContext:
    """What a backend is built from: this rank's attention shape, the dtypes, and the
    req_to_token table it reads KV slots through. The model runner makes one; backends never
    see the runner itself."""

    device: torch.device
    dtype: torch.dtype  # of q, k, v
    kv_dtype: torch.dtype  # of the KV pool
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank
    head_dim: int
    req_to_token: torch.Tensor  # [rows, max_context_len] int32 on `device`


class AttentionBackend(ABC):
    # Whether decode can be captured in a CUDA graph (static shapes, no host reads per pass).
    supports_cuda_graph: bool = True

    @abstractmethod
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Prepare metadata shared by all layers of one forward pass."""

    def init_cuda_graph_state(self, max_bs: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        forward_mode: ForwardMode,
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> None:
        """seq_lens_cpu: the same padded lengths on the host, so planning needs no device sync."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """seq_len given to padded rows of a captured batch (they read slot 0 only)."""
        return 1

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """q: [tokens, heads*head_dim]; k, v: [tokens, kv_heads*head_dim] -> [tokens, heads*head_dim]."""
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> None:
        """Write this pass's K/V ([tokens, kv_heads * head_dim]) at its slots: what each backend
        does first unless the caller has already stored them (`save_kv_cache=False`, as the
        fused rotary + KV-store kernel does on CUDA)."""
        forward_batch.token_to_kv_pool.set_kv_buffer(
            layer.layer_id,
            forward_batch.out_cache_loc,
            k.view(-1, layer.tp_k_head_num, layer.head_dim),
            v.view(-1, layer.tp_v_head_num, layer.head_dim),
        )

    @abstractmethod
    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor: ...

    @abstractmethod
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor: ...
