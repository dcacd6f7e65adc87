"""The Llama family: Llama (incl. Llama-3 rope scaling), Mistral (sliding window), Qwen2 (qkv
bias), Qwen3 (per-head q/k RMSNorm), SmolLM2 — one definition, switched by the Hugging Face
config; and the building blocks and weight loading the other architectures (Qwen3-MoE,
Mixtral, Gemma 2 and 3) extend.

Projections are fused (QKV in one matmul, gate/up in one matmul) and built by the model's
quantization method (`make_linear`: plain, or FP8); `load_weights` takes the checkpoint's
separate Hugging Face tensors (weights, biases and, for quantized checkpoints, their scales)
and writes each into its rows of the fused shard this rank holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

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
from radixserve.kernels import fused_ops, triton_support
from radixserve.layers.activation import gated_activation
from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.logits_processor import LogitsProcessor
from radixserve.layers.moe.layer import FusedMoE
from radixserve.layers.moe.router import RouterLinear
from radixserve.layers.quantization.base import QuantizationConfig, make_linear
from radixserve.layers.radix_attention import NO_WINDOW, RadixAttention
from radixserve.layers.rotary_embedding import RotaryEmbedding
from radixserve.model_loader.config import sliding_window_of

# checkpoint names of the per-layer KV-cache scales (compressed-tensors kv_cache_scheme)
_KV_SCALE = re.compile(r"layers\.(\d+)\.self_attn\.(?:([kv])_scale|([kv])_proj\.output_scale)$")


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaAttention(nn.Module):
    """Column-parallel QKV (this rank's heads), row-parallel output projection (all-reduced).

    The variant knobs are arguments so other families reuse the block: `scaling` (Gemma's
    query_pre_attn_scalar), `sliding_window`, `logit_cap`, and `qk_norm` (the norm class
    applied per head to q and k before the rotary embedding: Qwen3's, Gemma 3's), and `sinks`
    (a learned per-head logit in the softmax: gpt-oss)."""

    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        rotary: RotaryEmbedding,
        quant: QuantizationConfig | None = None,
        *,
        scaling: float | None = None,
        sliding_window: int = NO_WINDOW,
        logit_cap: float = 0.0,
        qk_norm: type[RMSNorm] | None = None,
        sinks: bool = False,
    ) -> None:
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
        hidden = config.hidden_size
        self.qkv_proj = make_linear(hidden, self.q_size + 2 * self.kv_size, bias, quant)
        o_bias = bool(getattr(config, "attention_bias", False))
        self.o_proj = make_linear(self.q_size, hidden, o_bias, quant)
        self.qk_norm = qk_norm is not None
        if qk_norm is not None:
            self.q_norm = qk_norm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = qk_norm(self.head_dim, eps=config.rms_norm_eps)
        self.rotary = rotary
        self.attn = RadixAttention(
            self.num_heads,
            self.head_dim,
            scaling if scaling is not None else self.head_dim**-0.5,
            self.num_kv_heads,
            layer_id,
            sliding_window_size=sliding_window,
            logit_cap=logit_cap,
            has_sinks=sinks,
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        if triton_support.enabled_for(qkv):
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
        """q/k norm, rotary and the K/V store as one kernel working in place on qkv, so q, k
        and v stay views of it and the backend is spared its own store of K/V."""
        qk_norm = None
        if self.qk_norm:
            qk_norm = fused_ops.QKNorm(
                self.q_norm.weight,
                self.k_norm.weight,
                self.q_norm.variance_epsilon,
                self.q_norm.unit_offset,
            )
        pool = forward_batch.token_to_kv_pool
        k_cache, v_cache = pool.get_kv_buffer(self.attn.layer_id)
        self.rotary.rotate_and_store_kv(
            positions,
            qkv,
            self.num_heads,
            self.num_kv_heads,
            k_cache,
            v_cache,
            forward_batch.out_cache_loc,
            pool.scales(self.attn.layer_id),
            qk_norm,
        )
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return self.attn(q, k, v, forward_batch, save_kv_cache=False)


class LlamaMLP(nn.Module):
    """Column-parallel gate/up, row-parallel down (all-reduced); act(gate) * up between."""

    def __init__(
        self,
        config: PretrainedConfig,
        quant: QuantizationConfig | None = None,
        intermediate_size: int | None = None,
        activation: str = "silu",
    ) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.rows = even_shard(intermediate_size or config.intermediate_size, tp_rank(), tp_size())
        local = self.rows[1] - self.rows[0]
        self.gate_up_proj = make_linear(config.hidden_size, 2 * local, bias, quant)
        self.down_proj = make_linear(local, config.hidden_size, bias, quant)
        self.silu = activation == "silu"
        self.act_and_mul = gated_activation(activation)

    @property
    def input_projection(self) -> nn.Module:
        """The projection right behind the layer's norm (`LlamaDecoderLayer.norm_before`)."""
        return self.gate_up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.partial(x))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's part of the output, before the all-reduce (the whole output on one
        rank): DeepSeek sums its shared experts' part into the routed experts' own."""
        # SiLU: one gated GEMV at batch 1 (the activation in the product's epilogue)
        if self.silu:
            gated = self.gate_up_proj.silu_and_mul(x)
        else:
            gated = self.act_and_mul(self.gate_up_proj(x))
        return self.down_proj(gated)


class SparseMoeBlock(nn.Module):
    """A mixture-of-experts MLP: a replicated router (`gate`, never quantized) and the experts,
    sharded by their intermediate dimension (layers/moe/layer.py)."""

    def __init__(
        self,
        config: PretrainedConfig,
        quant: QuantizationConfig | None,
        num_experts: int,
        intermediate_size: int,
        renormalize: bool,
        round_weights: bool,
    ) -> None:
        super().__init__()
        self.gate = RouterLinear(config.hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(
            num_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            intermediate_size,
            renormalize=renormalize,
            round_weights=round_weights,
            activation=getattr(config, "hidden_act", "silu"),
            fp8=quant is not None and quant.quantize_experts,
        )

    @property
    def input_projection(self) -> nn.Module:
        """The projection right behind the layer's norm (`LlamaDecoderLayer.norm_before`)."""
        return self.gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))


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
    """Pre-norm attention and MLP with the residual adds folded into the next norm. Families
    change a part through the hooks: the attention's options, the MLP, the norms (and the
    order of them in `forward`)."""

    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        rotary: RotaryEmbedding,
        quant: QuantizationConfig | None = None,
    ) -> None:
        super().__init__()
        options = self.attention_options(config, layer_id)
        self.self_attn = LlamaAttention(config, layer_id, rotary, quant, **options)
        self.mlp = self.build_mlp(config, layer_id, quant)
        self.build_norms(config)

    def attention_options(self, config: PretrainedConfig, layer_id: int) -> dict[str, Any]:
        qk_norm = RMSNorm if config.model_type in ("qwen3", "qwen3_moe") else None
        return {"sliding_window": sliding_window_of(config, layer_id), "qk_norm": qk_norm}

    def build_norms(self, config: PretrainedConfig) -> None:
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def build_mlp(
        self, config: PretrainedConfig, layer_id: int, quant: QuantizationConfig | None
    ) -> nn.Module:
        """The layer's MLP (MoE families override this)."""
        return LlamaMLP(config, quant)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self.attend(positions, hidden, residual, forward_batch)
        projection = getattr(self.mlp, "input_projection", None)
        hidden, residual = self.norm_before(
            self.post_attention_layernorm, projection, hidden, residual
        )
        return self.mlp(hidden), residual

    @staticmethod
    def norm_before(
        norm: RMSNorm,
        projection: nn.Module | None,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(hidden + residual), hidden + residual), or (norm(hidden), hidden) without a
        residual (the first layer), as `projection`'s input: the projection runs the norm with
        its own small product of the normed row in one launch where it can (`norm_and_project`
        at batch 1: a LoRA wrapper's shrink, layers/lora_linear.py; a MoE router's logits,
        layers/moe/router.py), else the norm runs alone."""
        fused = getattr(projection, "norm_and_project", None)
        out = fused(norm, hidden, residual) if fused is not None else None
        if out is not None:
            return out
        if residual is None:
            return norm(hidden), hidden
        return norm(hidden, residual)

    def attend(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The input norm (with the residual add of the layer before) and the attention:
        (attention output, residual stream)."""
        # On CUDA the add+norm runs in place, overwriting hidden and residual. Both are ours to
        # overwrite: the first residual is the embedding's fresh output (the norm without a
        # residual writes a new tensor, leaving it intact); every other hidden is a projection's.
        qkv = getattr(self.self_attn, "qkv_proj", None)
        hidden, residual = self.norm_before(self.input_layernorm, qkv, hidden, residual)
        return self.self_attn(positions, hidden, forward_batch), residual


class LlamaModel(nn.Module):
    decoder_layer_cls: type[nn.Module] = LlamaDecoderLayer
    norm_cls: type[RMSNorm] = RMSNorm

    def __init__(self, config: PretrainedConfig, quant: QuantizationConfig | None = None) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        rotaries: dict[str | None, RotaryEmbedding] = {}  # shared by the layers of a type

        def rotary(layer_id: int) -> RotaryEmbedding:
            key = self.rope_layer_type(config, layer_id)
            if key not in rotaries:
                rotaries[key] = RotaryEmbedding(
                    config, head_dim_of(config), config.max_position_embeddings, key
                )
            return rotaries[key]

        self.layers = nn.ModuleList(
            self.decoder_layer_cls(config, i, rotary(i), quant)
            for i in range(config.num_hidden_layers)
        )
        self.norm = self.norm_cls(config.hidden_size, eps=config.rms_norm_eps)

    def rope_layer_type(self, config: PretrainedConfig, layer_id: int) -> str | None:
        """The key of a layer's RoPE parameters in the config: None, one set for every layer
        (families whose layer types have their own override this)."""
        return None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        hidden = self.embed(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, forward_batch)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    model_cls: type[LlamaModel] = LlamaModel
    # HF checkpoint module -> (fused module, shard id)
    stacked_params = (
        ("q_proj", "qkv_proj", "q"),
        ("k_proj", "qkv_proj", "k"),
        ("v_proj", "qkv_proj", "v"),
        ("gate_proj", "gate_up_proj", 0),
        ("up_proj", "gate_up_proj", 1),
    )
    # checkpoint name fragment -> ours (Mixtral's block_sparse_moe, say)
    renames: tuple[tuple[str, str], ...] = ()
    # a per-expert checkpoint projection's name -> gate, up or down
    expert_projections: dict[str, str] = {}

    def __init__(self, config: PretrainedConfig, quant: QuantizationConfig | None = None) -> None:
        super().__init__()
        self.config = config
        self.quant = quant
        self.model = self.model_cls(config, quant)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            # vocab-parallel like the embedding: each rank computes its slice of the logits
            self.lm_head = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(
            config.vocab_size, getattr(config, "final_logit_softcapping", None)
        )
        # layer -> (k_scale, v_scale) from the checkpoint, for an FP8 KV cache
        self.kv_cache_scales: dict[int, list[float]] = {}

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

    # ------------------------------------------------------------------ loading

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream the checkpoint's tensors into this rank's shards; every parameter (every
        shard of a fused one, every expert) must be written, or this raises naming some."""
        if self.quant is not None:
            weights = self.quant.adapt_checkpoint(iter(weights))
        self._modules_by_name = dict(self.named_modules())
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = self.checkpoint_name(name)
            if name is None:
                continue
            if self._load_kv_scale(name, tensor):
                continue
            if ".experts." in name:
                loaded |= self._load_expert(name, tensor)
                continue
            module_name, kind = name.rsplit(".", 1)
            for hf_part, fused_part, shard in self.stacked_params:
                if module_name.endswith(f".{hf_part}"):
                    target = module_name.removesuffix(hf_part) + fused_part
                    written = self._load_shard(target, kind, shard, tensor)
                    loaded |= {f"{target}.{p}:{shard}" for p in written}
                    break
            else:
                loaded |= self._load_whole(name, module_name, kind, tensor, params)
        missing = self._expected_loads(params) - loaded
        del self._modules_by_name
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:4]}")

    def checkpoint_name(self, name: str) -> str | None:
        """Our name for a checkpoint tensor, or None for one that is not loaded."""
        if "rotary_emb.inv_freq" in name:
            return None
        if name == "lm_head.weight" and self.tie_word_embeddings:
            return None
        for old, new in self.renames:
            name = name.replace(old, new)
        return name

    def _load_kv_scale(self, name: str, tensor: torch.Tensor) -> bool:
        match = _KV_SCALE.search(name)
        if match is None:
            return False
        layer = int(match.group(1))
        which = 0 if (match.group(2) or match.group(3)) == "k" else 1
        self.kv_cache_scales.setdefault(layer, [1.0, 1.0])[which] = float(tensor.float().max())
        return True

    def _load_shard(
        self, target: str, kind: str, shard: str | int, tensor: torch.Tensor
    ) -> set[str]:
        """Write this rank's rows of a q/k/v or gate/up checkpoint tensor (weight, bias or
        per-channel scale; a per-tensor scale covers all the shard's rows) into `target`."""
        module = self._modules_by_name[target]
        parent = self._modules_by_name[target.rsplit(".", 1)[0]]
        if isinstance(shard, int):  # gate (0) / up (1) halves of gate_up_proj
            lo, hi = parent.rows
            return module.load_rows(kind, shard * (hi - lo), hi - lo, _rows(tensor, lo, hi))
        hd, heads = parent.head_dim, parent.shard
        q, kv = parent.q_size, parent.kv_size
        first = (heads.q_start if shard == "q" else heads.kv_start) * hd
        count = q if shard == "q" else kv
        start = {"q": 0, "k": q, "v": q + kv}[shard]
        return module.load_rows(kind, start, count, _rows(tensor, first, first + count))

    def _load_whole(
        self,
        name: str,
        module_name: str,
        kind: str,
        tensor: torch.Tensor,
        params: dict[str, torch.Tensor],
    ) -> set[str]:
        tensor = self._local_part(name, tensor)
        module = self._modules_by_name.get(module_name)
        if module is not None and hasattr(module, "load_rows"):
            # a projection: its own loader (quantizes, or takes a checkpoint's scales)
            rows = module.weight.shape[0]
            return {f"{module_name}.{p}" for p in module.load_rows(kind, 0, rows, tensor)}
        if name not in params:
            raise KeyError(f"checkpoint tensor {name!r} has no parameter in {type(self).__name__}")
        param = params[name]
        if param.shape != tensor.shape:
            raise ValueError(
                f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}"
            )
        param.copy_(tensor)
        return {name}

    def _load_expert(self, name: str, tensor: torch.Tensor) -> set[str]:
        """`...mlp.experts.{e}.{projection}.{kind}` (a checkpoint's per-expert tensors) or
        `...mlp.experts.{gate_up_proj|down_proj}` (transformers' stacked in-memory form)."""
        head, tail = name.split(".experts.", 1)
        moe: FusedMoE = self._modules_by_name[f"{head}.experts"]
        parts = tail.split(".")
        if len(parts) == 1:  # stacked, all experts
            projection = {"gate_up_proj": "gate_up", "down_proj": "down"}[parts[0]]
            experts, kind = range(moe.num_experts), "weight"
            written = moe.load_expert(projection, None, kind, tensor)
        else:
            expert, ckpt_projection, kind = int(parts[0]), parts[1], parts[2]
            projection = self.expert_projections[ckpt_projection]
            experts = [expert]
            written = moe.load_expert(projection, expert, kind, tensor)
        halves = ("gate", "up") if projection == "gate_up" else (projection,)
        return {
            f"{head}.experts.{p}:{half}:{e}"
            for p in written
            for half in halves
            if (half == "down") == p.startswith("w2")
            for e in experts
        }

    def _local_part(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of an unfused checkpoint tensor (all of it with one rank)."""
        if tp_size() == 1:
            return tensor
        module_name = name.rsplit(".", 1)[0]
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            parent = self._modules_by_name[module_name.rsplit(".", 1)[0]]
            if name.endswith("o_proj.weight"):
                lo = parent.shard.q_start * parent.head_dim
                hi = lo + parent.q_size
            else:
                lo, hi = parent.rows
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
            module_name, param = name.rsplit(".", 1)
            if module_name.endswith(".experts"):
                moe = self._modules_by_name[module_name]
                halves = ("down",) if param.startswith("w2") else ("gate", "up")
                expected |= {
                    f"{name}:{half}:{e}" for half in halves for e in range(moe.num_experts)
                }
            elif module_name.endswith(".qkv_proj"):
                expected |= {f"{name}:q", f"{name}:k", f"{name}:v"}
            elif module_name.endswith(".gate_up_proj"):
                expected |= {f"{name}:0", f"{name}:1"}
            else:
                expected.add(name)
        return expected


def _rows(tensor: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Rows [lo, hi) of a checkpoint tensor; a one-value (per-tensor) scale as it is."""
    return tensor if tensor.numel() == 1 else tensor[lo:hi]


class MistralForCausalLM(LlamaForCausalLM):
    pass


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass
