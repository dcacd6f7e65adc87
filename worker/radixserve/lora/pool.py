"""`LoRASlotPool`: `--max-loras` slots of adapter weights on the device, read by the model's
wrapped projections.

Building the pool wraps q/k/v, o, gate/up and down of every decoder layer (the Llama family's
blocks) in a `LoRALinear` and allocates its slot-stacked A and B, before the KV pool is sized:
the KV pool takes what the adapters leave.

Under tensor parallelism each rank holds the part of an adapter that its part of the base
needs, cut where the checkpoint loader cuts the base (models/llama.py: heads by KV group,
the MLP's rows evenly): for a column-parallel projection (q/k/v, gate/up; every rank sees all
of x) A whole and B's rows of the rank's output columns; for a row-parallel one (o, down; each
rank sees its slice of x) A's columns of that slice and B whole. A rank's shrink of o or down
is then a partial sum, and its expand adds `partial · Bᵀ` to its partial output before the
layer's all-reduce, which sums the adapter's term with the base's: no communication of its
own.

Writing an adapter into a slot is a few copies per projection, queued on the compute stream
from pinned host memory, so it never waits for the device and is ordered after every pass
launched before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radixserve.layers.lora_linear import LoRABatch, LoRALinear
from radixserve.lora.adapter import LoRAWeights

# the model's fused projections -> the PEFT projections in them, in their output order
ATTENTION = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",)}
MLP = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def projection_shapes(hf_config) -> dict[str, tuple[int, int]]:
    """Each projection's full (in, out) features: what an adapter's A and B must match."""
    hidden = hf_config.hidden_size
    head_dim = getattr(hf_config, "head_dim", None) or hidden // hf_config.num_attention_heads
    q = hf_config.num_attention_heads * head_dim
    kv = hf_config.num_key_value_heads * head_dim
    inter = hf_config.intermediate_size
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


@dataclass(frozen=True)
class RankPart:
    """This rank's part of one PEFT projection's adapter: B's rows [lo, hi) of a
    column-parallel base (`cut` "b"), or A's columns [lo, hi) of a row-parallel one ("a")."""

    cut: str
    lo: int
    hi: int

    def of(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(A [rank, in], B [out, rank]) of the whole adapter -> this rank's."""
        if self.cut == "a":
            return a[:, self.lo : self.hi], b
        return a, b[self.lo : self.hi]


def rank_parts(attn: nn.Module, mlp: nn.Module) -> dict[str, RankPart]:
    """Where this rank's base rows and columns lie, per PEFT projection: the attention's
    heads (`HeadShard`: query heads follow their KV group) and the MLP's even row split, as
    the checkpoint loader cuts them (the whole projection with one rank)."""
    hd, heads = attn.head_dim, attn.shard
    q = (heads.q_start * hd, heads.q_start * hd + attn.q_size)
    kv = (heads.kv_start * hd, heads.kv_start * hd + attn.kv_size)
    rows = mlp.rows
    return {
        "q_proj": RankPart("b", *q),
        "k_proj": RankPart("b", *kv),
        "v_proj": RankPart("b", *kv),
        "o_proj": RankPart("a", *q),
        "gate_proj": RankPart("b", *rows),
        "up_proj": RankPart("b", *rows),
        "down_proj": RankPart("a", *rows),
    }


class LoRASlotPool:
    def __init__(
        self,
        model: nn.Module,
        max_loras: int,
        max_rank: int,
        max_rows: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.slots = max_loras
        self.max_rank = max_rank
        self.batch = LoRABatch(device, max_rows, max_loras)
        # (layer id, wrapper, the PEFT projections it holds, each one's part on this rank)
        self.wrapped: list[tuple[int, LoRALinear, tuple[str, ...], tuple[RankPart, ...]]] = []
        for layer_id, layer in enumerate(model.model.layers):
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if not all(hasattr(attn, n) for n in ATTENTION) or not all(
                hasattr(mlp, n) for n in MLP
            ):
                raise ValueError(
                    f"LoRA adapters need the Llama family's projections; "
                    f"{type(model).__name__} layer {layer_id} lacks them"
                )
            sizes = {
                "qkv_proj": [attn.q_size, attn.kv_size, attn.kv_size],
                "o_proj": [attn.o_proj.weight.shape[0]],
                "gate_up_proj": [mlp.gate_up_proj.weight.shape[0] // 2] * 2,
                "down_proj": [mlp.down_proj.weight.shape[0]],
            }
            parts = rank_parts(attn, mlp)
            for parent, table in ((attn, ATTENTION), (mlp, MLP)):
                for name, peft_names in table.items():
                    base = getattr(parent, name)
                    wrapper = LoRALinear(
                        base,
                        base.weight.shape[1],
                        sizes[name],
                        max_loras,
                        max_rank,
                        self.batch,
                        dtype,
                    )
                    setattr(parent, name, wrapper)
                    self.wrapped.append(
                        (layer_id, wrapper, peft_names, tuple(parts[n] for n in peft_names))
                    )

    @property
    def nbytes(self) -> int:
        return sum(w.lora_a.nbytes + w.lora_b.nbytes for _, w, _, _ in self.wrapped)

    @torch.no_grad()
    def write(self, slot: int, weights: LoRAWeights) -> None:
        """Put `weights` in `slot` (whose previous adapter no running request uses), zeros
        where the adapter has no tensor or a smaller rank."""
        rank = self.max_rank
        for layer_id, wrapper, peft_names, parts in self.wrapped:
            wrapper.lora_a[slot].zero_()
            wrapper.lora_b[slot].zero_()
            offset = 0
            for i, name in enumerate(peft_names):
                size = wrapper.sub_sizes[i]
                pair = weights.tensors.get((layer_id, name))
                if pair is not None:
                    a, b = parts[i].of(*pair)
                    r = a.shape[0]
                    wrapper.lora_a[slot, i * rank : i * rank + r].copy_(a, non_blocking=True)
                    wrapper.lora_b[slot, offset : offset + size, :r].copy_(b, non_blocking=True)
                offset += size
