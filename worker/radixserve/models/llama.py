"""The Llama family: Llama (incl. Llama-3 rope scaling), Mistral, Qwen2 (qkv bias), Qwen3
(per-head q/k RMSNorm), SmolLM2 — one definition, switched by the Hugging Face config.

Projections are fused (QKV in one matmul, gate/up in one matmul); `load_weights` takes the
checkpoint's separate Hugging Face tensors and writes them into the fused shards.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from radixserve.distributed.parallel_state import (
    all_reduce,
    even_shard,
    head_shard,
    tp_rank,
    tp_size,
)
from radixserve.forward.forward_batch import ForwardBatch
from radixserve.layers import fused_ops
from radixserve.layers.gemv import Linear, linear_silu_and_mul
from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.logits_processor import LogitsProcessor
from radixserve.layers.radix_attention import RadixAttention
from radixserve.layers.rotary_embedding import RotaryEmbedding


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaAttention(nn.Module):
    """Column-parallel QKV (this rank's heads), row-parallel output projection (all-reduced)."""

    def __init__(self, config: PretrainedConfig, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.head_dim = head_dim_of(config)
        self.shard = head_shard(
            config.num_attention_heads, config.num_key_value_heads, tp_rank(), tp_size()
        )
        self.num_heads = self.shard.q_count
        self.num_kv_heads = self.shard.kv_count
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        o_bias = bool(getattr(config, "attention_bias", False))
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=o_bias)
        # Qwen3 normalises each head of q and k before the rotary embedding.
        self.qk_norm = config.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.rotary = rotary
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        if fused_ops.enabled_for(qkv):
            out = self._attend_fused(positions, qkv, forward_batch)
        else:
            out = self._attend_native(positions, qkv, forward_batch)
        return all_reduce(self.o_proj(out))

    def _attend_native(
        self, positions: torch.Tensor, qkv: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return self.attn(q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, forward_batch)

    def _attend_fused(
        self, positions: torch.Tensor, qkv: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """q/k norm, rotary and the K/V store as kernels working in place on qkv, so q, k and v
        stay views of it and the backend is spared its own store of K/V."""
        if self.qk_norm:
            heads = qkv.view(-1, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
            q_heads = heads[:, : self.num_heads]
            k_heads = heads[:, self.num_heads : self.num_heads + self.num_kv_heads]
            fused_ops.rms_norm(q_heads, self.q_norm.weight, self.q_norm.variance_epsilon, q_heads)
            fused_ops.rms_norm(k_heads, self.k_norm.weight, self.k_norm.variance_epsilon, k_heads)
        k_cache, v_cache = forward_batch.token_to_kv_pool.get_kv_buffer(self.attn.layer_id)
        self.rotary.rotate_and_store_kv(
            positions,
            qkv,
            self.num_heads,
            self.num_kv_heads,
            k_cache,
            v_cache,
            forward_batch.out_cache_loc,
        )
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return self.attn(q, k, v, forward_batch, save_kv_cache=False)


class LlamaMLP(nn.Module):
    """Column-parallel gate/up, row-parallel down (all-reduced)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.rows = even_shard(config.intermediate_size, tp_rank(), tp_size())
        local = self.rows[1] - self.rows[0]
        self.gate_up_proj = Linear(config.hidden_size, 2 * local, bias=bias)
        self.down_proj = Linear(local, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.gate_up_proj
        return all_reduce(self.down_proj(linear_silu_and_mul(x, up.weight, up.bias)))


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary; a token's row comes from the rank
    that holds it (the others contribute zeros to the all-reduce)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.rows = even_shard(vocab_size, tp_rank(), tp_size())
        self.per_rank = -(-vocab_size // tp_size())
        self.weight = nn.Parameter(torch.zeros(self.per_rank, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        start, end = self.rows
        mine = (input_ids >= start) & (input_ids < end)
        out = F.embedding(torch.where(mine, input_ids - start, 0), self.weight)
        return all_reduce(out * mine.unsqueeze(-1).to(out.dtype))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, rotary)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # On CUDA the add+norm runs in place, overwriting hidden and residual. Both are ours to
        # overwrite: the first residual is the embedding's fresh output (the norm without a
        # residual writes a new tensor, leaving it intact); every other hidden is a projection's.
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, forward_batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        rotary = RotaryEmbedding(config, head_dim_of(config), config.max_position_embeddings)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, rotary) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, forward_batch)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    # HF checkpoint name fragment -> (fused parameter fragment, shard id)
    stacked_params = (
        ("q_proj", "qkv_proj", "q"),
        ("k_proj", "qkv_proj", "k"),
        ("v_proj", "qkv_proj", "v"),
        ("gate_proj", "gate_up_proj", 0),
        ("up_proj", "gate_up_proj", 1),
    )

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            # vocab-parallel like the embedding: each rank computes its slice of the logits
            self.lm_head = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        if self.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        hidden = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(hidden, self.lm_head_weight, forward_batch)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            for hf_part, fused_part, shard in self.stacked_params:
                if f".{hf_part}." in name:
                    target = name.replace(hf_part, fused_part)
                    self._load_shard(params[target], tensor, shard)
                    loaded.add(f"{target}:{shard}")
                    break
            else:
                if name not in params:
                    raise KeyError(
                        f"checkpoint tensor {name!r} has no parameter in {type(self).__name__}"
                    )
                param = params[name]
                tensor = self._local_part(name, tensor)
                if param.shape != tensor.shape:
                    raise ValueError(
                        f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}"
                    )
                param.copy_(tensor)
                loaded.add(name)
        expected = self._expected_loads(params)
        missing = expected - loaded
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:4]}")

    def _load_shard(self, param: torch.Tensor, tensor: torch.Tensor, shard: str | int) -> None:
        """Copy this rank's rows of a q/k/v or gate/up tensor into its fused parameter."""
        if isinstance(shard, int):  # gate (0) / up (1) halves of gate_up_proj
            lo, hi = self.model.layers[0].mlp.rows
            size = param.shape[0] // 2
            param[shard * size : (shard + 1) * size].copy_(tensor[lo:hi])
            return
        attn = self.model.layers[0].self_attn
        hd, heads = attn.head_dim, attn.shard
        q, kv = attn.q_size, attn.kv_size
        first = heads.q_start if shard == "q" else heads.kv_start
        rows = tensor[first * hd : first * hd + (q if shard == "q" else kv)]
        start, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard]
        param[start : start + size].copy_(rows)

    def _local_part(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of an unfused checkpoint tensor (all of it with one rank)."""
        if tp_size() == 1:
            return tensor
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            if name.endswith("o_proj.weight"):
                attn = self.model.layers[0].self_attn
                lo = attn.shard.q_start * attn.head_dim
                hi = lo + attn.q_size
            else:
                lo, hi = self.model.layers[0].mlp.rows
            return tensor[:, lo:hi]
        if name.endswith(("o_proj.bias", "down_proj.bias")):
            # row-parallel outputs are summed across ranks: add the bias once
            return tensor if tp_rank() == 0 else torch.zeros_like(tensor)
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            embedding = self.model.embed_tokens
            lo, hi = embedding.rows
            part = torch.zeros(embedding.per_rank, tensor.shape[1], dtype=tensor.dtype)
            part[: hi - lo] = tensor[lo:hi]
            return part
        return tensor

    def _expected_loads(self, params: dict[str, torch.Tensor]) -> set[str]:
        expected = set()
        for name in params:
            if ".qkv_proj." in name:
                expected |= {f"{name}:q", f"{name}:k", f"{name}:v"}
            elif ".gate_up_proj." in name:
                expected |= {f"{name}:0", f"{name}:1"}
            else:
                expected.add(name)
        return expected


class MistralForCausalLM(LlamaForCausalLM):
    pass


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass
