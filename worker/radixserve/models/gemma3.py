"""Gemma 3 text models (`Gemma3ForCausalLM`): Gemma 2's layer (four norms, scaled embedding,
query_pre_attn_scalar, GELU-tanh MLP) with per-head q/k norms (Gemma's (1 + w) form), local
layers every `sliding_window_pattern`-th excepted (config.layer_types), a RoPE base of its own
for the local layers (10k) and the global ones' (1M, often with linear scaling), and no
attention soft-cap."""

from __future__ import annotations

from transformers import PretrainedConfig

from radixserve.layers.layernorm import GemmaRMSNorm
from radixserve.layers.rotary_embedding import per_layer_type_rope
from radixserve.models.gemma2 import Gemma2DecoderLayer, Gemma2ForCausalLM, Gemma2Model


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    qk_norm = GemmaRMSNorm


class Gemma3Model(Gemma2Model):
    decoder_layer_cls = Gemma3DecoderLayer

    def rope_layer_type(self, config: PretrainedConfig, layer_id: int) -> str | None:
        return config.layer_types[layer_id] if per_layer_type_rope(config) else None


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    model_cls = Gemma3Model
