"""`ForwardMode` and `ForwardBatch`: the device-side description of one forward pass.

`ForwardBatch` is built from a `ModelWorkerBatch` by `ForwardBatch.init_new`, moving the
scheduler's CPU tensors to the device in one place. It lives for one pass. The model runner then
asks the attention backend for the pass's metadata (`init_forward_metadata`), unless a captured
CUDA graph replays the pass, whose metadata the graph runner refills instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import TYPE_CHECKING

import torch

from radixserve.utils import device_tensor

if TYPE_CHECKING:
    from radixserve.layers.attention.base import AttentionBackend
    from radixserve.managers.schedule_batch import ModelWorkerBatch
    from radixserve.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixserve.sampling.sampling_batch_info import SamplingBatchInfo


# a decode pass's per-request inputs, packed as rows for one host-to-device copy:
# input ids, positions, request rows, sequence lengths, KV slots, future-token ring slots
DECODE_INPUT_ROWS = 6


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill, with or without a cached prefix
    DECODE = auto()  # one new token per request
    MIXED = auto()  # chunked prefill and decode requests in one extend-shaped pass
    IDLE = auto()  # nothing to run (kept so every rank steps together under TP)

    def is_extend(self) -> bool:
        """Extend-shaped attention: EXTEND, and MIXED whose decode rows are length-1 extends."""
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_mixed(self) -> bool:
        return self == ForwardMode.MIXED

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    @property
    def metric_label(self) -> str:
        return {ForwardMode.EXTEND: "prefill", ForwardMode.DECODE: "decode"}.get(self, "mixed")


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
    attn_backend: AttentionBackend
    # extend only (EXTEND and MIXED)
    extend_num_tokens: int = 0
    extend_seq_lens: torch.Tensor | None = None  # [bs] new tokens per request
    extend_prefix_lens: torch.Tensor | None = None  # [bs] cached tokens per request
    extend_start_loc: torch.Tensor | None = None  # [bs] offset of each request in input_ids
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    # decode only: the slot of ModelRunner.future_token_ids each row's next token goes to
    future_slots: torch.Tensor | None = None
    # logits: which rows to keep (the last token of each request unless logprobs need all)
    sampling_info: SamplingBatchInfo | None = None
    return_logprob: bool = False
    top_logprobs_nums: list[int] | None = None

    @classmethod
    def init_new(
        cls,
        batch: ModelWorkerBatch,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: TokenToKVPool,
        attn_backend: AttentionBackend,
        device: torch.device | str,
        future_start: int = 0,
    ) -> ForwardBatch:
        if batch.forward_mode.is_decode():
            return cls.init_decode(
                batch, req_to_token_pool, token_to_kv_pool, attn_backend, device, future_start
            )

        def dev(t: torch.Tensor) -> torch.Tensor:
            return device_tensor(t, torch.int64, device)

        seq_lens_cpu = batch.seq_lens
        ext = torch.tensor(batch.extend_seq_lens, dtype=torch.int64)
        pre = torch.tensor(batch.extend_prefix_lens, dtype=torch.int64)
        start = torch.cumsum(ext, 0) - ext
        # positions: prefix_len .. prefix_len + extend_len - 1 for each request
        positions_cpu = torch.repeat_interleave(pre - start, ext) + torch.arange(int(ext.sum()))
        return cls(
            forward_mode=batch.forward_mode,
            batch_size=len(seq_lens_cpu),
            input_ids=dev(batch.input_ids),
            positions=dev(positions_cpu),
            req_pool_indices=dev(batch.req_pool_indices),
            seq_lens=dev(seq_lens_cpu),
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=batch.seq_lens_sum,
            out_cache_loc=dev(batch.out_cache_loc),
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            attn_backend=attn_backend,
            extend_num_tokens=int(ext.sum()),
            extend_seq_lens=dev(ext),
            extend_prefix_lens=dev(pre),
            extend_start_loc=dev(start),
            extend_seq_lens_cpu=list(batch.extend_seq_lens),
            extend_prefix_lens_cpu=list(batch.extend_prefix_lens),
            sampling_info=batch.sampling_info,
            return_logprob=batch.return_logprob,
            top_logprobs_nums=batch.top_logprobs_nums,
        )

    @classmethod
    def init_decode(
        cls,
        batch: ModelWorkerBatch,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: TokenToKVPool,
        attn_backend: AttentionBackend,
        device: torch.device | str,
        future_start: int = 0,
        staging: torch.Tensor | None = None,
        padded_size: int | None = None,
        seq_len_fill: int = 1,
    ) -> ForwardBatch:
        """A decode pass's per-request inputs reach the device in one copy: packed on the
        host as rows of one tensor, copied once, used as views. From them the pass also
        stores its new KV slots into req_to_token on the device (the scheduler wrote only the
        host mirror), and row i's next token is bound for future slot `future_start + i`.

        A CUDA graph runner passes its static `staging` buffer and the captured size to pad to:
        the copy then lands where the graph's kernels read, and padded rows get request row 0,
        KV slot 0 (reserved), `seq_len_fill` and future slot 0 (never read). `batch_size` is
        the padded size."""
        bs = len(batch.seq_lens)
        n = padded_size or bs
        host = torch.empty((DECODE_INPUT_ROWS, n), dtype=torch.int64)
        if n > bs:
            host[:, bs:] = torch.tensor([0, 0, 0, seq_len_fill, 0, 0]).view(-1, 1)
        host[0, :bs] = batch.input_ids
        torch.sub(batch.seq_lens, 1, out=host[1, :bs])  # position of the new token
        host[2, :bs] = batch.req_pool_indices
        host[3, :bs] = batch.seq_lens
        host[4, :bs] = batch.out_cache_loc
        torch.arange(future_start, future_start + bs, out=host[5, :bs])
        if staging is None:
            packed = device_tensor(host, torch.int64, device)
        else:
            packed = staging[: DECODE_INPUT_ROWS * n].view(DECODE_INPUT_ROWS, n)
            packed.copy_(host.pin_memory() if packed.is_cuda else host, non_blocking=True)
        if bs:
            req_to_token_pool.store_decode_slots(packed[2, :bs], packed[1, :bs], packed[4, :bs])
        seq_lens_cpu = host[3]
        return cls(
            forward_mode=ForwardMode.DECODE,
            batch_size=n,
            input_ids=packed[0],
            positions=packed[1],
            req_pool_indices=packed[2],
            seq_lens=packed[3],
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=batch.seq_lens_sum + (n - bs) * seq_len_fill,
            out_cache_loc=packed[4],
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            attn_backend=attn_backend,
            future_slots=packed[5],
            sampling_info=batch.sampling_info,
            return_logprob=batch.return_logprob,
            top_logprobs_nums=batch.top_logprobs_nums,
        )
