"""RadixAttention: the attention layer models call. It owns only shapes, the layer id, the
layer's attention variant (scale, sliding window, logit soft-cap, sinks) and, with sinks, their
learned per-head logits; the work is the backend's, so a new backend never touches a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.model_loader.config import NO_WINDOW

if TYPE_CHECKING:
    from radixserve.forward.forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttentionVariant:
    """What distinguishes one layer's attention maths from another's in the same model.

    `sliding_window`: a query at position p sees the keys at positions p - W < j <= p (W keys,
    itself included: Hugging Face's `sliding_window`), NO_WINDOW for all of them. The KV of
    every token is kept whatever the window (the radix cache shares prefixes of any length);
    the window is a mask. `logit_cap`: scores become cap * tanh(score / cap) before the
    softmax (Gemma 2), 0 for none. `sinks`: each head has a learned logit that joins the
    softmax's denominator and attends to nothing (gpt-oss): outputs are scaled by
    sum(exp(s)) / (sum(exp(s)) + exp(sink))."""

    scaling: float
    sliding_window: int = NO_WINDOW
    logit_cap: float = 0.0
    sinks: bool = False

    @property
    def windowed(self) -> bool:
        return self.sliding_window > 0


class RadixAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        sliding_window_size: int = NO_WINDOW,
        logit_cap: float = 0.0,
        has_sinks: bool = False,
    ) -> None:
        super().__init__()
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.tp_v_head_num = num_kv_heads
        self.head_dim = head_dim
        self.qk_head_dim = head_dim
        self.v_head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id
        self.sliding_window_size = sliding_window_size if sliding_window_size > 0 else NO_WINDOW
        self.logit_cap = logit_cap
        self.variant = AttentionVariant(scaling, self.sliding_window_size, logit_cap, has_sinks)
        # [this rank's heads] in natural-log units, compared with the scaled scores (the
        # checkpoint's `self_attn.sinks`); every backend reads it as float32
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if has_sinks else None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)


def attention_variants(model: nn.Module) -> tuple[AttentionVariant, ...]:
    """The distinct variants of a model's attention layers, in first-use order: what a backend
    that plans per variant (FlashInfer) prepares once per pass."""
    seen: dict[AttentionVariant, None] = {}
    for module in model.modules():
        if isinstance(module, RadixAttention):
            seen.setdefault(module.variant)
    return tuple(seen)
