"""The tensor-parallel group of one worker: which rank this process is, and the collectives
the model and the scheduler use. With one rank every collective is the identity, so single-GPU
and CPU serving pay nothing.

Device collectives (all-reduce of partial matmul sums, all-gather of vocab-sharded logits,
broadcast of sampled tokens) run on the device group (NCCL on GPUs, gloo on the CPU); a gloo
group on the CPU carries the one host-side collective, the KV capacity agreed at start. The
requests rank 0 receives reach the other ranks over ZMQ, not a collective (scheduler.py).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class _TensorParallelState:
    rank: int = 0
    size: int = 1
    cpu_group: Any = None


_state = _TensorParallelState()


def init_tensor_parallel(rank: int, size: int, init_method: str, device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=init_method,
        world_size=size,
        rank=rank,
        # no batch takes minutes: a collective waiting this long has lost a peer
        timeout=datetime.timedelta(minutes=10),
    )
    _state.rank, _state.size = rank, size
    _state.cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD


def destroy_tensor_parallel() -> None:
    """Take the process group down (every rank, in order, at shutdown); a no-op with one rank."""
    if _state.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
    _state.rank, _state.size, _state.cpu_group = 0, 1, None


def tp_rank() -> int:
    return _state.rank


def tp_size() -> int:
    return _state.size


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _state.size > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    if _state.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_state.size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def broadcast_from_first(x: torch.Tensor) -> torch.Tensor:
    if _state.size > 1:
        dist.broadcast(x, src=0)
    return x


def barrier() -> None:
    """Every rank waits here for the others (on the CPU group): for work one rank does for all."""
    if _state.size > 1:
        dist.barrier(group=_state.cpu_group)


def min_across_ranks(value: int) -> int:
    if _state.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_state.cpu_group)
    return int(t.item())


@dataclass(frozen=True)
class HeadShard:
    """The attention heads one rank owns: query heads [q_start, q_start + q_count) and key/value
    heads [kv_start, kv_start + kv_count)."""

    q_start: int
    q_count: int
    kv_start: int
    kv_count: int


def head_shard(num_heads: int, num_kv_heads: int, rank: int, size: int) -> HeadShard:
    """Split heads by key/value group, so each rank's query heads read only its own KV heads.

    With at least as many KV heads as ranks, KV heads are split as evenly as possible (uneven
    counts allowed: SmolLM2's 3 KV heads over 2 ranks are 2 + 1) and query heads follow their
    groups. With fewer KV heads than ranks, query heads split evenly and each rank keeps a copy
    of the one KV head its queries use.
    """
    group = num_heads // num_kv_heads
    if num_kv_heads >= size:
        base, extra = divmod(num_kv_heads, size)
        kv_count = base + (1 if rank < extra else 0)
        kv_start = rank * base + min(rank, extra)
        return HeadShard(kv_start * group, kv_count * group, kv_start, kv_count)
    if num_heads % size:
        raise ValueError(f"{num_heads} attention heads do not split over {size} ranks")
    per_rank = num_heads // size
    q_start = rank * per_rank
    return HeadShard(q_start, per_rank, q_start // group, 1)


def even_shard(total: int, rank: int, size: int) -> tuple[int, int]:
    """[start, end) of an even split of `total` rows (the last ranks may hold padding)."""
    per_rank = -(-total // size)
    start = rank * per_rank
    return start, min(start + per_rank, total)
