"""Turn the final hidden states into next-token logits for the rows that need them.

An extend pass computes hidden states for every prompt token but samples only at each request's
last one, so the LM head runs on `bs` rows instead of `num_tokens`. Models with a final logit
soft-cap (Gemma 2) get cap * tanh(logits / cap), in float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.distributed.parallel_state import all_gather_last_dim
from radixserve.layers.linear import linear

if TYPE_CHECKING:
    from radixserve.forward.forward_batch import ForwardBatch


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int, final_logit_softcapping: float | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.soft_cap = final_logit_softcapping or 0.0

    def forward(
        self, hidden: torch.Tensor, lm_head_weight: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if forward_batch.forward_mode.is_extend():
            last = forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1
            hidden = hidden[last]
        # vocab-parallel head: each rank has a slice of the vocabulary (one rank: all of it);
        # float32 out of the product itself (the model-dtype values, widened)
        logits = all_gather_last_dim(linear(hidden, lm_head_weight, out_dtype=torch.float32))
        logits = logits[:, : self.vocab_size]
        if self.soft_cap > 0:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        return logits
