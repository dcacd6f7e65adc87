"""A pass's inputs on the device: `ForwardBatch` built from a `ModelWorkerBatch`.

This is where the scheduler's CPU tensors move to the device, in one place, and where the
device copy of req_to_token is written, for every kind of pass (`write_req_to_token`): an
extend or mixed pass applies the writes the scheduler queued in the pool's host mirror; a
decode pass stores its one new KV slot per row from its packed inputs, in one kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixserve.forward.forward_batch import ForwardBatch, PassAttention
from radixserve.forward.mode import ForwardMode
from radixserve.kernels import fused_ops
from radixserve.utils import device_tensor

if TYPE_CHECKING:
    from radixserve.forward.worker_batch import ModelWorkerBatch
    from radixserve.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixserve.model_executor.future_tokens import FutureSlots

# a decode pass's per-request inputs, packed as rows for one host-to-device copy:
# input ids, positions, request rows, sequence lengths, KV slots, future-token slots
DECODE_INPUT_ROWS = 6


def write_req_to_token(
    pool: ReqToTokenPool,
    decode_cells: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """The one writer of the device req_to_token table, called as each pass is prepared.

    First the writes queued in the host mirror since the last pass (extend rows, prefix-cache
    rewrites, a mixed pass's decode cells), in order, from one host-to-device copy; then, for
    a decode pass, `decode_cells` = (rows, columns, slots) device tensors taken from its packed
    inputs, which the scheduler wrote to the mirror only."""
    if pool.mirror_is_table:
        return  # the host writes already made the table
    writes = pool.take_device_writes()
    if writes:
        packed = device_tensor(torch.cat(writes, dim=1), torch.int32, pool.device)
        offset = 0
        for write in writes:
            part = packed[:, offset : offset + write.shape[1]]
            pool.req_to_token.index_put_((part[0], part[1]), part[2])
            offset += write.shape[1]
    if decode_cells is not None:
        fused_ops.store_cells(pool.req_to_token, *decode_cells)


def build_forward_batch(
    batch: ModelWorkerBatch,
    req_to_token_pool: ReqToTokenPool,
    token_to_kv_pool: TokenToKVPool,
    attn_backend: PassAttention,
    device: torch.device | str,
    future: FutureSlots,
) -> ForwardBatch:
    """An eager pass's ForwardBatch; decode batches go through `build_decode_batch`."""
    if batch.forward_mode.is_decode():
        return build_decode_batch(
            batch, req_to_token_pool, token_to_kv_pool, attn_backend, device, future
        )

    def dev(t: torch.Tensor) -> torch.Tensor:
        return device_tensor(t, torch.int64, device)

    write_req_to_token(req_to_token_pool)
    seq_lens_cpu = batch.seq_lens
    ext = torch.tensor(batch.extend_seq_lens, dtype=torch.int64)
    pre = torch.tensor(batch.extend_prefix_lens, dtype=torch.int64)
    start = torch.cumsum(ext, 0) - ext
    # positions: prefix_len .. prefix_len + extend_len - 1 for each request
    positions_cpu = torch.repeat_interleave(pre - start, ext) + torch.arange(int(ext.sum()))
    return ForwardBatch(
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


def build_decode_batch(
    batch: ModelWorkerBatch,
    req_to_token_pool: ReqToTokenPool,
    token_to_kv_pool: TokenToKVPool,
    attn_backend: PassAttention,
    device: torch.device | str,
    future: FutureSlots,
    staging: torch.Tensor | None = None,
    padded_size: int | None = None,
    seq_len_fill: int = 1,
) -> ForwardBatch:
    """A decode pass's per-request inputs reach the device in one copy: packed on the host
    as rows of one tensor, copied once, used as views. From them the pass also stores its new
    KV slots into the device req_to_token (the scheduler wrote only the host mirror), and row
    i's next token is bound for the future slot `future` reserved for it.

    A CUDA graph runner passes its static `staging` buffer and the captured size to pad to:
    the copy then lands where the graph's kernels read, and padded rows get request row 0,
    KV slot 0 (reserved), `seq_len_fill` and future slot 0 (never read). `batch_size` is the
    padded size."""
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
    future.write_slots(host[5, :bs])
    if staging is None:
        packed = device_tensor(host, torch.int64, device)
    else:
        packed = staging[: DECODE_INPUT_ROWS * n].view(DECODE_INPUT_ROWS, n)
        packed.copy_(host.pin_memory() if packed.is_cuda else host, non_blocking=True)
    if bs:
        write_req_to_token(req_to_token_pool, (packed[2, :bs], packed[1, :bs], packed[4, :bs]))
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=n,
        input_ids=packed[0],
        positions=packed[1],
        req_pool_indices=packed[2],
        seq_lens=packed[3],
        seq_lens_cpu=host[3],
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
