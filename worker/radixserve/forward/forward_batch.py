"""`ForwardBatch`: the device-side description of one forward pass.

The model runner builds it from a `ModelWorkerBatch` (model_executor/forward_inputs.py) and it
lives for one pass: models and layers read its tensors, and `RadixAttention` hands it to the
pass's attention backend, which it carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from radixserve.forward.mode import ForwardMode

if TYPE_CHECKING:
    from radixserve.mem_cache.kv_restore import KVRestore
    from radixserve.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixserve.sampling.sampling_batch_info import SamplingBatchInfo


class PassAttention(Protocol):
    """What a layer asks of the pass's attention backend (layers/attention/base.py implements
    it): attention of one layer's q, k, v over the paged KV pool."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Any,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor: ...


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    req_pool_indices: torch.Tensor  # [bs] int64
    seq_lens: torch.Tensor  # [bs] int64, total length including this pass's tokens
    seq_lens_cpu: torch.Tensor  # [bs] int64 on the CPU
    seq_lens_sum: int
    out_cache_loc: torch.Tensor  # [num_tokens] int64 KV slots written by this pass
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool
    attn_backend: PassAttention
    # extend only (EXTEND and MIXED)
    extend_num_tokens: int = 0
    extend_seq_lens: torch.Tensor | None = None  # [bs] new tokens per request
    extend_prefix_lens: torch.Tensor | None = None  # [bs] cached tokens per request
    extend_start_loc: torch.Tensor | None = None  # [bs] offset of each request in input_ids
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    # MLA models' extend passes on CUDA: the packed key groups (layers/mla.py's KeyGroup),
    # made at the first MLA layer, read by every one
    mla_key_groups: list[Any] | None = None
    # decode only: the FutureTokens slot each row's next token goes to
    future_slots: torch.Tensor | None = None
    # logits: which rows to keep (the last token of each request unless logprobs need all)
    sampling_info: SamplingBatchInfo | None = None
    return_logprob: bool = False
    top_logprobs_nums: list[int] | None = None
    # a restore from the host KV tier still copying (an eager pass): each layer waits for its
    # own layers' copies before it reads the pool (layers/attention/base.py); None otherwise
    kv_restore: KVRestore | None = None
