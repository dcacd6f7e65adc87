"""Gemma 2 (`Gemma2ForCausalLM`): alternating local (sliding-window) and global attention
layers, attention logits soft-capped (cap * tanh(s / cap)) and the final logits too, scores
scaled by query_pre_attn_scalar ** -0.5 rather than head_dim's, RMSNorm scaling by (1 + w) in
float32, a norm before and after both the attention and the MLP, a GELU-tanh MLP, and the
embedding multiplied by sqrt(hidden_size) (rounded to the model dtype, as transformers does).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from radixserve.forward.forward_batch import ForwardBatch
from radixserve.layers.layernorm import GemmaRMSNorm, RMSNorm
from radixserve.layers.quantization.base import QuantizationConfig
from radixserve.model_loader.config import sliding_window_of
from radixserve.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel


class Gemma2DecoderLayer(LlamaDecoderLayer):
    qk_norm: type[RMSNorm] | None = None

    def attention_options(self, config: PretrainedConfig, layer_id: int) -> dict[str, Any]:
        return {
            "scaling": config.query_pre_attn_scalar**-0.5,
            "sliding_window": sliding_window_of(config, layer_id),
            "logit_cap": getattr(config, "attn_logit_softcapping", None) or 0.0,
            "qk_norm": self.qk_norm,
        }

    def build_mlp(
        self, config: PretrainedConfig, layer_id: int, quant: QuantizationConfig | None
    ) -> nn.Module:
        return LlamaMLP(config, quant, activation=config.hidden_activation)

    def build_norms(self, config: PretrainedConfig) -> None:
        eps, size = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = GemmaRMSNorm(size, eps=eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps=eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps=eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps=eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual adds fold into the next norm: the MLP's output, post-normed, joins the
        residual in the next layer's input norm (or the final norm)."""
        hidden, residual = self.attend(positions, hidden, residual, forward_batch)
        hidden = self.post_attention_layernorm(hidden)
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        hidden = self.mlp(hidden)
        return self.post_feedforward_layernorm(hidden), residual


class Gemma2Model(LlamaModel):
    decoder_layer_cls = Gemma2DecoderLayer
    norm_cls = GemmaRMSNorm

    def __init__(self, config: PretrainedConfig, quant: QuantizationConfig | None = None) -> None:
        super().__init__(config, quant)
        # sqrt(hidden) as the model dtype holds it (built under that default dtype)
        self.embed_scale = float(torch.tensor(config.hidden_size**0.5, device="cpu"))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_cls = Gemma2Model
