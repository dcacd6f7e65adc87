"""Rotary position embedding (neox/"rotate half" layout, as Llama-family checkpoints use).

Inverse frequencies come from transformers' own RoPE initialisers, so every scaling type a
config names (default, llama3, linear, yarn, ...) matches the reference exactly; cos/sin are
precomputed once for all positions and indexed per token. Models whose layer types have their
own RoPE parameters (Gemma 3: a local base for sliding layers, a global one with scaling for
full ones) build one embedding per layer type.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from radixserve.kernels import fused_ops


def _rope_parameters(config: PretrainedConfig, layer_type: str | None) -> dict:
    params = getattr(config, "rope_parameters", None)
    if params:
        return params[layer_type] if layer_type is not None else params
    scaling = getattr(config, "rope_scaling", None) or {}
    return {"rope_type": scaling.get("rope_type", scaling.get("type", "default")), **scaling}


def per_layer_type_rope(config: PretrainedConfig) -> bool:
    """Whether `rope_parameters` is keyed by layer type (Gemma 3) rather than one dict."""
    params = getattr(config, "rope_parameters", None) or {}
    layer_types = set(getattr(config, "layer_types", None) or ())
    return bool(layer_types) and layer_types <= set(params)


def compute_inv_freq(
    config: PretrainedConfig, head_dim: int, layer_type: str | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (on the CPU, whatever the ambient device: a model built on the
    meta device to size it still needs real values here) and the attention scaling.
    `layer_type` picks that type's parameters where the config keys them by type."""
    params = _rope_parameters(config, layer_type)
    rope_type = params.get("rope_type", "default")
    with torch.device("cpu"):
        if rope_type == "default":
            base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
            inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            return inv_freq, 1.0
        extra = {"layer_type": layer_type} if layer_type is not None else {}
        return ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), **extra)


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        head_dim: int,
        max_position: int,
        layer_type: str | None = None,
    ) -> None:
        super().__init__()
        inv_freq, scaling = compute_inv_freq(config, head_dim, layer_type)
        if torch.empty(0).device.type == "meta":
            # a model built to be sized has no values to compute, and the meta device's
            # arange imports torch._dynamo (0.7 s of a start); float32, as computed below
            cos, sin = (
                torch.empty(max_position, inv_freq.numel(), dtype=torch.float) for _ in range(2)
            )
        else:
            positions = torch.arange(max_position, dtype=torch.float)  # on the ambient device
            freqs = positions[:, None] * inv_freq.to(positions.device)[None, :]
            cos, sin = freqs.cos() * scaling, freqs.sin() * scaling
        self.register_buffer("cos_cache", cos, persistent=False)
        self.register_buffer("sin_cache", sin, persistent=False)
        self.head_dim = head_dim

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]."""
        cos = self.cos_cache[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin_cache[positions].to(q.dtype).unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def rotate_and_store_kv(
        self,
        positions: torch.Tensor,
        qkv: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out_cache_loc: torch.Tensor,
        kv_scales: tuple[float, float] = (1.0, 1.0),
        qk_norm: fused_ops.QKNorm | None = None,
    ) -> None:
        """The CUDA path: rotate the q and k heads of qkv [tokens, q | k | v] in place and store
        k and v at out_cache_loc, in one kernel (instead of the gathers, casts and cat of
        `forward` plus the backend's two index_put). Float32 cos/sin, rounded once. `qk_norm`:
        the heads' q/k norms first, in the same kernel."""
        fused_ops.rotary_and_store_kv(
            positions,
            qkv,
            self.cos_cache,
            self.sin_cache,
            num_heads,
            num_kv_heads,
            self.head_dim,
            k_cache,
            v_cache,
            out_cache_loc,
            kv_scales,
            qk_norm,
        )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    # == x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), the reference's arithmetic
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
