"""Gather each request's KV slots from req_to_token into one flat index array, on the GPU.

Page-table kernels (FlashInfer) want `kv_indices[kv_indptr[b] : kv_indptr[b + 1]] =
req_to_token[req_pool_indices[b], :seq_lens[b]]`. Doing this with torch would need the
lengths on the host (a sync) or a Python loop over requests; one program per request does
it without either, so it also runs inside a captured CUDA graph's preparation.
"""

from __future__ import annotations

import torch

from radixserve.kernels.triton_support import jit, tl

_BLOCK = 512


@jit
def _gather_kv_indices_kernel(
    Req_to_token,
    Req_pool_indices,
    Seq_lens,
    Kv_indptr,
    Kv_indices,
    stride_r2t,
    BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    req_row = tl.load(Req_pool_indices + req).to(tl.int64)
    seq_len = tl.load(Seq_lens + req).to(tl.int32)
    out_start = tl.load(Kv_indptr + req).to(tl.int64)
    for start in range(0, seq_len, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < seq_len
        slots = tl.load(Req_to_token + req_row * stride_r2t + offs, mask=mask)
        tl.store(Kv_indices + out_start + offs, slots.to(Kv_indices.dtype.element_ty), mask=mask)


def gather_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> None:
    """Fill kv_indices (int32, at least kv_indptr[-1] long) from req_to_token rows."""
    bs = req_pool_indices.shape[0]
    if bs == 0:
        return
    _gather_kv_indices_kernel[(bs,)](
        req_to_token,
        req_pool_indices,
        seq_lens,
        kv_indptr,
        kv_indices,
        req_to_token.stride(0),
        BLOCK=_BLOCK,
    )
