"""Qwen3-MoE (`Qwen3MoeForCausalLM`, e.g. Qwen3-30B-A3B): Qwen3's attention (per-head q/k
RMSNorm) with mixture-of-experts MLPs and no shared expert. Each token goes to its top
`num_experts_per_tok` of `num_experts` experts, weights renormalised when `norm_topk_prob`
and rounded to the model dtype (as transformers does); layers in `mlp_only_layers` or off the
`decoder_sparse_step` keep a dense MLP."""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from radixserve.layers.quantization.base import QuantizationConfig
from radixserve.model_loader.config import is_moe_layer
from radixserve.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    SparseMoeBlock,
)


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    def build_mlp(
        self, config: PretrainedConfig, layer_id: int, quant: QuantizationConfig | None
    ) -> nn.Module:
        if not is_moe_layer(config, layer_id):
            return LlamaMLP(config, quant)
        return SparseMoeBlock(
            config,
            quant,
            config.num_experts,
            config.moe_intermediate_size,
            renormalize=bool(config.norm_topk_prob),
            round_weights=True,
        )


class Qwen3MoeModel(LlamaModel):
    decoder_layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3MoeModel
    expert_projections = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
