"""The attention backend interface.

A backend turns (q, k, v) of one layer into attention output over the paged KV pool: it stores
this pass's K/V at `forward_batch.out_cache_loc`, then reads every token of each request
through `req_to_token_pool.req_to_token[req_pool_idx, :seq_len]`. Per-pass metadata (index
arrays, planned kernels) is built once in `init_forward_metadata` and reused by every layer;
the CUDA-graph methods do the same into static buffers so a captured graph can be replayed.

The steps every backend takes around its kernels (store K/V, the layer's pool buffers and FP8
scales, the metadata check, heads split and joined) are `AttentionBackend.forward`'s, once; a
backend writes its metadata and its kernel calls (`run_decode`, `run_extend`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from radixserve.forward.forward_batch import ForwardBatch
from radixserve.forward.mode import ForwardMode
from radixserve.layers.radix_attention import AttentionVariant

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
    # the model's distinct attention variants (scale, window, soft-cap); empty means one,
    # plain causal attention at head_dim ** -0.5. Backends that plan per pass plan each.
    variants: tuple[AttentionVariant, ...] = ()

    def planned_variants(self) -> tuple[AttentionVariant, ...]:
        return self.variants or (AttentionVariant(self.head_dim**-0.5),)


def split_heads(x: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """[tokens, heads * head_dim] -> [tokens, heads, head_dim], unit stride on the last axis."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.view(-1, num_heads, head_dim)


class AttentionBackend(ABC):
    """A backend writes what is its own: its metadata (`init_forward_metadata`, and for CUDA
    graphs `init_cuda_graph_state`, `capture_decode_metadata`, `replay_decode_metadata`) and
    its kernel calls (`run_decode`, `run_extend`). The steps every backend takes around them
    are here, once: `forward`'s per-layer preamble and the graph methods' checks."""

    # Whether decode can be captured in a CUDA graph (static shapes, no host reads per pass).
    supports_cuda_graph: bool = True
    # the backend's name in messages (its key in catalog/attention_backends.py)
    name: str = "attention"
    # what init_forward_metadata leaves in `forward_metadata` for a decode pass and for an
    # extend pass (MIXED is an extend): `forward` checks it before each kernel call
    decode_metadata_type: type = object
    extend_metadata_type: type = object

    def __init__(self, context: AttentionContext) -> None:
        self.device = context.device
        self.num_heads, self.num_kv_heads = context.num_heads, context.num_kv_heads
        self.head_dim = context.head_dim
        # this pass's metadata, shared by every layer
        self.forward_metadata: Any = None

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
        if not forward_mode.is_decode():
            raise NotImplementedError(f"the {self.name} backend captures decode passes only")
        self.forward_metadata = self.capture_decode_metadata(bs, req_pool_indices, seq_lens)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> None:
        """seq_lens_cpu: the same padded lengths on the host, so planning needs no device sync."""
        self.forward_metadata = self.replay_decode_metadata(
            bs, req_pool_indices, seq_lens, seq_lens_cpu
        )

    def capture_decode_metadata(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> Any:
        """The metadata of a decode graph of `bs` rows over the runner's static inputs."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def replay_decode_metadata(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor | None,
    ) -> Any:
        """The metadata of a captured size's replay (the step's lengths): once per step."""
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
        """q: [tokens, heads*head_dim]; k, v: [tokens, kv_heads*head_dim] -> [tokens, heads*head_dim].

        Once per layer, for every backend: store this pass's K/V (unless the caller has already,
        `save_kv_cache=False`, as the fused rotary + KV-store kernel does on CUDA), take the
        layer's pool buffers and FP8 scales, check that this pass's metadata is there, split q
        into heads; then the backend's kernel call (`run_decode` or `run_extend`), whose
        [tokens, heads, head_dim] (or [tokens, heads * head_dim]) output is joined back. This
        is the hot path (every layer of a captured decode, every layer of an extend): it makes
        only the calls a backend would make itself; with a host-tier restore in flight, the
        wait for this layer's copies (the KV store may go first: it writes slots no copy
        targets)."""
        restore = forward_batch.kv_restore
        if restore is not None:
            restore.wait(layer.layer_id)
        if save_kv_cache:
            self.store_kv(k, v, layer, forward_batch)
        pool = forward_batch.token_to_kv_pool
        k_buffer, v_buffer = pool.get_kv_buffer(layer.layer_id)
        k_scale, v_scale = pool.scales(layer.layer_id)
        meta = self.forward_metadata
        q_heads = split_heads(q, layer.tp_q_head_num, layer.head_dim)
        if forward_batch.forward_mode.is_decode():
            assert isinstance(meta, self.decode_metadata_type), (
                "init_forward_metadata did not run for decode"
            )
            out = self.run_decode(
                q_heads, k, v, layer, forward_batch, meta, k_buffer, v_buffer, k_scale, v_scale
            )
        else:
            assert isinstance(meta, self.extend_metadata_type), (
                "init_forward_metadata did not run for extend"
            )
            out = self.run_extend(
                q_heads, k, v, layer, forward_batch, meta, k_buffer, v_buffer, k_scale, v_scale
            )
        return out.view(-1, layer.tp_q_head_num * layer.head_dim)

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> None:
        """Write this pass's K/V ([tokens, kv_heads * head_dim]) at its slots: what `forward`
        does first unless the caller has already stored them (`save_kv_cache=False`)."""
        forward_batch.token_to_kv_pool.set_kv_buffer(
            layer.layer_id,
            forward_batch.out_cache_loc,
            k.view(-1, layer.tp_k_head_num, layer.head_dim),
            v.view(-1, layer.tp_v_head_num, layer.head_dim),
        )

    @abstractmethod
    def run_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        meta: Any,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        k_scale: float,
        v_scale: float,
    ) -> torch.Tensor:
        """The decode kernel call. q: [bs, heads, head_dim], unit stride on the last axis;
        k, v: this pass's own [bs, kv_heads * head_dim] (for a kernel that reads them there);
        meta: `forward_metadata`, checked; k_buffer, v_buffer: the layer's pool
        ([slots, kv_heads, head_dim], this pass's K/V in it); k_scale, v_scale: its FP8 scales
        (1.0 otherwise). Returns [bs, heads, head_dim] or [bs, heads * head_dim]."""

    # The extend (and MIXED) kernel call: run_decode's arguments, over [tokens, ...]. Abstract
    # too: a backend defines it, or says `run_extend = run_decode` where one call does both.
    run_extend = run_decode
