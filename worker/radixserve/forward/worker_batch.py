"""`ModelWorkerBatch`: what the scheduler hands the model worker for one pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.forward.mode import ForwardMode

if TYPE_CHECKING:
    from radixserve.mem_cache.kv_restore import KVRestore
    from radixserve.sampling.sampling_batch_info import SamplingBatchInfo


@dataclass(frozen=True)
class ModelWorkerBatch:
    """The minimum a model worker needs for one pass: CPU tensors and lists that the scheduler
    builds fresh for each pass and never changes afterwards.

    `sampling_info` is the exception, and is shared, not copied: it is the running batch's
    per-request sampling state (see SamplingBatchInfo for who changes it and when)."""

    forward_mode: ForwardMode
    input_ids: torch.Tensor  # CPU int64 [num_tokens]; may hold FutureTokens placeholders
    req_pool_indices: torch.Tensor  # CPU int64 [bs]
    seq_lens: torch.Tensor  # CPU int64 [bs]
    seq_lens_sum: int
    out_cache_loc: torch.Tensor  # CPU int64 [num_tokens]
    sampling_info: SamplingBatchInfo | None
    extend_seq_lens: list[int] | None = None
    extend_prefix_lens: list[int] | None = None
    return_logprob: bool = False
    top_logprobs_nums: list[int] | None = None
    has_future_ids: bool = False  # some input ids name tokens of a batch still in flight
    # with LoRA adapters served: each request's adapter slot (-1: the base model)
    lora_slots: list[int] | None = None
    # a verify step (speculative decoding) runs as a decode pass over k_i + 1 rows per request
    # (its last token, then its k_i proposed ones); k_i per request, for the acceptance
    verify_draft_lens: list[int] | None = None
    # the KV tiers' copies of this round's restored prefixes, in flight: each layer waits for
    # its own before reading the pool (None: nothing restored, always with the tiers off)
    kv_restore: KVRestore | None = None
