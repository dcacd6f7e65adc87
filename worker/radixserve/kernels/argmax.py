"""Greedy token choice: the argmax over the vocabulary of each row of logits.

torch.argmax reduces one row with too few thread blocks: on the H200 a batch-1 argmax over a
128k vocabulary took 27 us of a 1.0 ms Llama-3.2-1B decode step (scripts/gpu/profile_decode.py,
2026-11-29). Here the row is split in chunks reduced by as many programs, then the chunk
winners by one program per row: two launches of a few microseconds, both programmatic
dependents of the kernel before (the LM head's), as the rest of a decode step's kernels are.

Ties and infinities go as in torch.argmax (the first maximal index wins; a row of -inf gives
0), so greedy decoding stays bit-for-bit what transformers picks.
"""

from __future__ import annotations

import torch

from radixserve.kernels import triton_support
from radixserve.kernels.triton_support import (
    dependent_launch,
    jit,
    tl,
    triton,
    wait_for_prior_kernel,
)

# Elements one program of the first stage reduces: 63 programs for a 128k vocabulary
_CHUNK = 2048


@jit
def _chunk_max_kernel(
    X, stride_x, n_cols, ChunkMax, ChunkIdx, n_chunks, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    wait_for_prior_kernel(PDL)
    x = tl.load(X + row * stride_x + cols, mask=cols < n_cols, other=float("-inf"))
    best, at = tl.max(
        x.to(tl.float32), axis=0, return_indices=True, return_indices_tie_break_left=True
    )
    tl.store(ChunkMax + row * n_chunks + chunk, best)
    tl.store(ChunkIdx + row * n_chunks + chunk, (chunk * BLOCK + at).to(tl.int64))


@jit
def _row_max_kernel(
    ChunkMax,
    ChunkIdx,
    Out,
    Table,
    TableIdx,
    n_chunks,
    SCATTER: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, BLOCK)
    wait_for_prior_kernel(PDL)
    best = tl.load(ChunkMax + row * n_chunks + chunks, mask=chunks < n_chunks, other=float("-inf"))
    # the first chunk holding the maximum holds its first index
    _, at = tl.max(best, axis=0, return_indices=True, return_indices_tie_break_left=True)
    winner = tl.load(ChunkIdx + row * n_chunks + at)
    tl.store(Out + row, winner)
    if SCATTER:
        tl.store(Table + tl.load(TableIdx + row), winner)


def argmax(
    logits: torch.Tensor, scatter_to: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) for [rows, vocab] logits: the two-stage kernels on CUDA,
    torch itself elsewhere. `scatter_to=(table, index)` also sets table[index[i]] to row i's
    result (int64 table; where two rows share an index, either may win), in the same launch:
    how a captured decode step puts its tokens into the future-token ring."""
    if not triton_support.enabled_for(logits) or logits.dim() != 2 or logits.stride(-1) != 1:
        out = torch.argmax(logits, dim=-1)
        if scatter_to is not None:
            scatter_to[0][scatter_to[1]] = out
        return out
    rows, vocab = logits.shape
    n_chunks = triton.cdiv(vocab, _CHUNK)
    chunk_max = torch.empty((rows, n_chunks), dtype=torch.float32, device=logits.device)
    chunk_idx = torch.empty((rows, n_chunks), dtype=torch.int64, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    table, index = scatter_to if scatter_to is not None else (out, out)
    _chunk_max_kernel[(rows, n_chunks)](
        logits,
        logits.stride(0),
        vocab,
        chunk_max,
        chunk_idx,
        n_chunks,
        BLOCK=_CHUNK,
        num_warps=8,
        **dependent_launch(logits),
    )
    _row_max_kernel[(rows,)](
        chunk_max,
        chunk_idx,
        out,
        table,
        index,
        n_chunks,
        SCATTER=scatter_to is not None,
        BLOCK=max(16, triton.next_power_of_2(n_chunks)),
        **dependent_launch(logits),
    )
    return out
