"""gpt-oss (`GptOssForCausalLM`, 20B and 120B): Llama's block with attention sinks (a learned
per-head logit in every softmax), q/k/v/o biases, sliding-window layers (128 tokens)
alternating with full ones, YaRN RoPE (transformers' initialiser, as every RoPE type here),
and a mixture-of-experts MLP in every layer: a biased router, top-k of its logits softmaxed,
experts with biases and the clamped SwiGLU.

The published checkpoints store the experts in MXFP4 (`*_blocks` + `*_scales`,
layers/quantization/mxfp4.py), gate and up interleaved row by row; the loader dequantizes
them to the model dtype (or, under `--quantization fp8`, on to FP8) and splits the rows into
the fused layer's [gate; up]; under `--quantization mxfp4` the layer keeps them in MXFP4 (the
values quantize back to themselves) for the fused MoE kernel to decode as it reads them.
transformers' own unquantized layout (`gate_up_proj` [E, H, 2I],
`down_proj` [E, I, H], what random weights and dequantized checkpoints carry) loads too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from radixserve.layers.moe.layer import FusedMoE
from radixserve.layers.moe.router import RouterLinear
from radixserve.layers.quantization.base import QuantizationConfig
from radixserve.layers.quantization.mxfp4 import dequantize_mxfp4
from radixserve.model_loader.config import sliding_window_of
from radixserve.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel

# the dequantized experts' dtype where the layer quantizes them again (FP8, MXFP4): MXFP4 values
# are exact in it
_REQUANTIZED_DTYPE = torch.bfloat16


class GptOssMoE(nn.Module):
    """The router (a biased linear layer, never quantized) and the experts."""

    def __init__(self, config: PretrainedConfig, quant: QuantizationConfig | None) -> None:
        super().__init__()
        experts = config.num_local_experts
        self.router = RouterLinear(config.hidden_size, experts, bias=True)
        # top-k of the logits softmaxed == softmax, top-k, renormalised; rounded to the model
        # dtype as transformers' softmax in that dtype leaves them
        self.experts = FusedMoE(
            experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.intermediate_size,
            renormalize=True,
            round_weights=True,
            activation="swiglu_oai",
            fp8=quant is not None and quant.quantize_experts,
            bias=True,
            swiglu=(getattr(config, "swiglu_alpha", 1.702), config.swiglu_limit),
            mxfp4=quant is not None and quant.keeps_experts_mxfp4,
        )

    @property
    def input_projection(self) -> nn.Module:
        """The projection right behind the layer's norm (`LlamaDecoderLayer.norm_before`)."""
        return self.router

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.router(x))


class GptOssDecoderLayer(LlamaDecoderLayer):
    def attention_options(self, config: PretrainedConfig, layer_id: int) -> dict[str, Any]:
        return {"sliding_window": sliding_window_of(config, layer_id), "sinks": True}

    def build_mlp(
        self, config: PretrainedConfig, layer_id: int, quant: QuantizationConfig | None
    ) -> nn.Module:
        return GptOssMoE(config, quant)


class GptOssModel(LlamaModel):
    decoder_layer_cls = GptOssDecoderLayer


class GptOssForCausalLM(LlamaForCausalLM):
    model_cls = GptOssModel
    renames = ((".self_attn.sinks", ".self_attn.attn.sinks"),)

    def load_weights(self, weights: Any) -> None:
        # an MXFP4 tensor's blocks wait here for its scales (or the other way round)
        self._mxfp4_parts: dict[str, dict[str, torch.Tensor]] = {}
        try:
            super().load_weights(weights)
        finally:
            unpaired = sorted(self._mxfp4_parts)
            del self._mxfp4_parts
        if unpaired:
            raise ValueError(f"MXFP4 tensors without their blocks or scales: {unpaired[:4]}")

    def _local_part(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.endswith(".attn.sinks"):  # this rank's query heads
            attention: LlamaAttention = self._modules_by_name[name.removesuffix(".attn.sinks")]
            first = attention.shard.q_start
            return tensor[first : first + attention.num_heads]
        return super()._local_part(name, tensor)

    def _load_expert(self, name: str, tensor: torch.Tensor) -> set[str]:
        """`...mlp.experts.{gate_up_proj|down_proj}{_blocks|_scales|_bias|}`: every expert,
        MXFP4 pairs once both halves are here, dequantized and written one expert at a time
        (the working copy is one expert's, not the layer's)."""
        head, tail = name.split(".experts.", 1)
        moe: FusedMoE = self._modules_by_name[f"{head}.experts"]
        projection, _, part = tail.partition("_proj")
        part = part.lstrip("_") or "weight"
        written: set[str] = set()
        if part == "bias":
            written = moe.load_expert(projection, None, "bias", _gate_up_halves(projection, tensor))
        elif part == "weight":  # transformers' [E, K, N]
            for expert, weight in enumerate(tensor):
                written |= self._load_one(moe, projection, expert, weight.t())
        else:
            parts = self._mxfp4_parts.setdefault(f"{head}.{projection}", {})
            parts[part] = tensor
            if len(parts) < 2:
                return set()
            del self._mxfp4_parts[f"{head}.{projection}"]
            dtype = moe.w2_weight.dtype if moe.w2_weight_scale is None else _REQUANTIZED_DTYPE
            for expert, (blocks, scales) in enumerate(
                zip(parts["blocks"], parts["scales"], strict=True)
            ):
                weight = dequantize_mxfp4(blocks, scales, dtype)  # [N, K]
                written |= self._load_one(moe, projection, expert, weight)
        halves = ("gate", "up") if projection == "gate_up" else ("down",)
        return {
            f"{head}.experts.{p}:{half}:{e}"
            for p in written
            for half in halves
            if (half == "down") == p.startswith("w2")
            for e in range(moe.num_experts)
        }

    @staticmethod
    def _load_one(moe: FusedMoE, projection: str, expert: int, weight: torch.Tensor) -> set[str]:
        """One expert's [N, K] gate_up (rows alternating gate, up) or down projection."""
        if projection == "down":
            return moe.load_expert("down", expert, "weight", weight)
        gate, up = weight[0::2], weight[1::2]
        return moe.load_expert("gate", expert, "weight", gate) | moe.load_expert(
            "up", expert, "weight", up
        )


def _gate_up_halves(projection: str, bias: torch.Tensor) -> torch.Tensor:
    """[E, 2I] gate_up biases (alternating gate, up) as the layer's [gate; up]; others as
    they are."""
    if projection != "gate_up":
        return bias
    return torch.cat([bias[:, 0::2], bias[:, 1::2]], dim=1)
