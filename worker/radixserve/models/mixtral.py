"""Mixtral (`MixtralForCausalLM`): Mistral's attention (sliding window when the config has
one) with a mixture-of-experts MLP in every layer. Top-k routing weights are always
renormalised and stay in float32; the checkpoint names the MLP `block_sparse_moe` and an
expert's gate, down and up projections `w1`, `w2` and `w3`."""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from radixserve.layers.quantization.base import QuantizationConfig
from radixserve.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    SparseMoeBlock,
)


class MixtralDecoderLayer(LlamaDecoderLayer):
    def build_mlp(
        self, config: PretrainedConfig, layer_id: int, quant: QuantizationConfig | None
    ) -> nn.Module:
        return SparseMoeBlock(
            config,
            quant,
            config.num_local_experts,
            config.intermediate_size,
            renormalize=True,
            round_weights=False,
        )


class MixtralModel(LlamaModel):
    decoder_layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(LlamaForCausalLM):
    model_cls = MixtralModel
    renames = ((".block_sparse_moe.", ".mlp."),)
    expert_projections = {"w1": "gate", "w3": "up", "w2": "down"}
