"""Inputs for MLA's extend attention (layers/mla.py's `mla_extend`) and its float64 reference,
shared by the Triton interpreter check on the CPU (tests/unit/mla_interpret_check.py) and the
GPU test at DeepSeek's sizes (test_mla_gpu.py)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch


@dataclass
class ExtendCase:
    q: torch.Tensor  # [new tokens, heads, nope + rope]
    pool: torch.Tensor  # [slots, 1, latent + rope], each request's rows scattered over it
    batch: SimpleNamespace  # the ForwardBatch fields mla_extend reads
    kv_b: torch.Tensor  # kv_b_proj's weight [heads * (nope + v), latent]
    latent: int
    nope: int
    v_dim: int

    def expand(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        heads = self.q.shape[1]
        kv = (x @ self.kv_b.T).view(-1, heads, self.nope + self.v_dim)
        return kv[..., : self.nope], kv[..., self.nope :]


def extend_case(
    prefix_lens: list[int],
    extend_lens: list[int],
    heads: int,
    latent: int,
    rope: int,
    nope: int,
    v_dim: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> ExtendCase:
    generator = torch.Generator().manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    slots = sum(seq_lens)
    pool = torch.randn(slots + 1, 1, latent + rope, generator=generator)
    bs = len(seq_lens)
    # rows a multiple of 16 wide: Triton specializes on the row stride
    width = -(-(max(seq_lens) + 8) // 16) * 16
    req_to_token = torch.zeros(bs + 2, width, dtype=torch.int32)
    order = torch.randperm(slots, generator=generator) + 1
    req_pool_indices = torch.arange(bs, dtype=torch.int64).flip(0) + 1
    start = 0
    for b, n in enumerate(seq_lens):
        req_to_token[req_pool_indices[b], :n] = order[start : start + n].to(torch.int32)
        start += n
    kv_b = torch.randn(heads * (nope + v_dim), latent, generator=generator) / latent**0.5
    ext = torch.tensor(extend_lens)
    q = torch.randn(int(ext.sum()), heads, nope + rope, generator=generator)
    batch = SimpleNamespace(
        batch_size=bs,
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token.to(device)),
        req_pool_indices=req_pool_indices.to(device),
        extend_prefix_lens_cpu=prefix_lens,
        extend_seq_lens_cpu=extend_lens,
        extend_prefix_lens=torch.tensor(prefix_lens, device=device),
        extend_seq_lens=ext.to(device),
        extend_start_loc=(torch.cumsum(ext, 0) - ext).to(device),
        mla_key_groups=None,
    )
    return ExtendCase(
        q.to(device, dtype),
        pool.to(device, dtype),
        batch,
        kv_b.to(device, dtype),
        latent,
        nope,
        v_dim,
    )


def dense_extend(case: ExtendCase, scale: float) -> torch.Tensor:
    """float64, request by request: query j of request b, at position prefix + j, sees keys
    0 .. prefix + j of its expanded rows."""
    batch, latent, nope = case.batch, case.latent, case.nope
    heads = case.q.shape[1]
    req_to_token = batch.req_to_token_pool.req_to_token
    kv_b = case.kv_b.double()
    out, start = [], 0
    for b, (p, e) in enumerate(
        zip(batch.extend_prefix_lens_cpu, batch.extend_seq_lens_cpu, strict=True)
    ):
        rows = case.pool[req_to_token[batch.req_pool_indices[b], : p + e].long(), 0].double()
        kv = (rows[:, :latent] @ kv_b.T).view(-1, heads, nope + case.v_dim)
        k = torch.cat([kv[..., :nope], rows[:, None, latent:].expand(-1, heads, -1)], -1)
        scores = torch.einsum("thd,khd->htk", case.q[start : start + e].double(), k) * scale
        hidden = (
            torch.arange(p + e, device=k.device)[None, :]
            > (p + torch.arange(e, device=k.device))[:, None]
        )
        weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        out.append(torch.einsum("htk,khd->thd", weights, kv[..., nope:]))
        start += e
    return torch.cat(out)
