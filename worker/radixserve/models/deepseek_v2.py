"""DeepSeek V2 and V3 (`DeepseekV2ForCausalLM`: V2, V2-Lite, V2.5; `DeepseekV3ForCausalLM`:
V3, R1 and the models built on them): multi-head latent attention (MLA) and a mixture of
experts with shared experts.

Attention (MLA): a token's keys and values are compressed into one latent
(`kv_a_proj_with_mqa` then `kv_a_layernorm`: kv_lora_rank values) plus one rotated key part
shared by the heads (qk_rope_head_dim values); the pool caches exactly those
(mem_cache/mla_memory_pool.py). Prefill expands the latents into heads with `kv_b_proj`;
decode folds its key half (W_UK) into the query and its value half (W_UV) after the attention
(the "absorbed" form), so it reads only the latents (layers/mla.py). The query comes through a
low-rank pair (`q_a_proj`, `q_a_layernorm`, `q_b_proj`: V3, V2) or one `q_proj` (V2-Lite).
The rotary part is interleaved in the checkpoints (V2 always, V3 with `rope_interleave`):
its pairs are de-interleaved before the rotation, in the query and in the cached key alike,
which leaves every score as the reference computes it. YaRN's attention scale is in the
softmax scale, as transformers applies it.

MoE: layers from `first_k_dense_replace` on; a float32 router; V3's `noaux_tc` (sigmoid
scores, the correction bias used to choose, not to weight; the best `topk_group` of `n_group`
groups by the sum of their two best experts), V2's softmax `greedy` or `group_limited_greedy`;
renormalised when `norm_topk_prob`, times `routed_scaling_factor`; plus the shared experts, a
dense MLP of `n_shared_experts` x `moe_intermediate_size`, added to every token.

Weights: bf16 checkpoints or FP8 ones with 128 x 128 block scales (`weight_scale_inv`, as
published), dequantized at load and re-quantized per channel (layers/quantization/fp8.py).
V3's multi-token-prediction layers (`model.layers.{num_hidden_layers}...`) are read and
dropped. One GPU (no tensor parallelism yet); the KV cache in the model dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from radixserve.catalog.architectures import UnsupportedModelError
from radixserve.catalog.model_layouts import check_layout as check_config_layout
from radixserve.distributed.parallel_state import all_reduce, tp_size
from radixserve.forward.forward_batch import ForwardBatch
from radixserve.kernels import triton_support
from radixserve.kernels.fused_moe import select_experts, select_experts_noaux_tc
from radixserve.kernels.mla_absorb import MAX_K as MAX_ABSORB_K
from radixserve.kernels.mla_absorb import MAX_ROWS as MAX_ABSORB_ROWS
from radixserve.kernels.mla_absorb import per_head_gemv
from radixserve.kernels.mla_rope_store import mla_rope_store
from radixserve.kernels.moe_gemv import router_gemv, uses_moe_gemv
from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.mla import mla_decode, mla_extend
from radixserve.layers.moe.layer import FusedMoE
from radixserve.layers.moe.router import LogitsAfterNorm
from radixserve.layers.moe.routing import grouped_topk
from radixserve.layers.quantization.base import QuantizationConfig, make_linear
from radixserve.layers.quantization.fp8 import dequantize_rows
from radixserve.layers.rotary_embedding import RotaryEmbedding
from radixserve.model_loader.config import is_moe_layer
from radixserve.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel


def check_layout(config: PretrainedConfig) -> None:
    """Refuse what is not built, in one line each: the config's routing (catalog's torch-free
    check, which the start runs first) and tensor parallelism."""
    check_config_layout(config.to_dict())
    if tp_size() > 1:
        raise UnsupportedModelError(
            "DeepSeek (MLA) models are served on one GPU for now: --tp-size 1"
        )


def _deinterleave(x: torch.Tensor) -> torch.Tensor:
    """Pairs (x0, x1), (x2, x3), ... -> (x0, x2, ..., x1, x3, ...): the checkpoints'
    interleaved rotary layout as the rotate-half rotation takes it."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


class DeepseekMLA(nn.Module):
    """MLA with the latent KV cache; absorbed in decode, expanded in extend (module docstring)."""

    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        rotary: RotaryEmbedding,
        quant: QuantizationConfig | None,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = 1  # one latent row per token: what the pool and the runner size
        self.qk_nope = config.qk_nope_head_dim
        self.qk_rope = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        # both absorbed products' K (qk_nope into W_UK, the latent into W_UV) fit the per-head
        # GEMV's one chunk: decode's few rows take it (kernels/mla_absorb.py), else torch.bmm
        self.absorb_per_head = max(self.qk_nope, self.kv_lora_rank) <= MAX_ABSORB_K
        qk_head_dim = self.qk_nope + self.qk_rope
        hidden = config.hidden_size
        bias = bool(getattr(config, "attention_bias", False))
        # the two projections of the hidden state, the query's (q_proj, or q-LoRA's q_a_proj)
        # and the latent's (kv_a_proj_with_mqa), as one: at batch 1 one GEMV instead of two
        # (each GEMV costs ~2 us over its bytes). The loader writes each checkpoint tensor
        # into its rows; a query without a bias (q_proj's) keeps its bias rows zero.
        self.q_width = (
            self.num_heads * qk_head_dim if self.q_lora_rank is None else self.q_lora_rank
        )
        self.kv_a_width = self.kv_lora_rank + self.qk_rope
        self.q_kv_a_proj = make_linear(hidden, self.q_width + self.kv_a_width, bias, quant)
        if self.q_lora_rank is not None:
            self.q_a_layernorm = RMSNorm(self.q_lora_rank)
            self.q_b_proj = make_linear(
                self.q_lora_rank, self.num_heads * qk_head_dim, False, quant
            )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank)
        self.kv_b_proj = make_linear(
            self.kv_lora_rank, self.num_heads * (self.qk_nope + self.v_head_dim), False, quant
        )
        self.o_proj = make_linear(self.num_heads * self.v_head_dim, hidden, bias, quant)
        self.rotary = rotary
        self.interleaved = bool(getattr(config, "rope_interleave", True))
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
        self.scaling = yarn_softmax_scale(params, qk_head_dim**-0.5)
        # kv_b_proj split per head for the absorbed decode, refreshed after every load (in
        # place: captured graphs hold their addresses), each output-major (its input dim
        # contiguous, as kernels/mla_absorb.py streams it; cuBLAS takes the transposed views):
        # W_UK^T [H, latent, qk_nope] and W_UV [H, v_head_dim, latent], kv_b_proj's own rows
        self.w_uk_t: torch.Tensor
        self.w_uv: torch.Tensor
        self.register_buffer(
            "w_uk_t", torch.zeros(self.num_heads, self.kv_lora_rank, self.qk_nope), persistent=False
        )
        self.register_buffer(
            "w_uv",
            torch.zeros(self.num_heads, self.v_head_dim, self.kv_lora_rank),
            persistent=False,
        )

    @torch.no_grad()
    def absorb_weights(self) -> None:
        """Split kv_b_proj (dequantized if FP8) into the decode's W_UK^T and W_UV."""
        weight = self.kv_b_proj.weight
        scale = getattr(self.kv_b_proj, "weight_scale", None)
        dense = weight if scale is None else dequantize_rows(weight, scale, self.w_uv.dtype)
        per_head = dense.view(self.num_heads, self.qk_nope + self.v_head_dim, self.kv_lora_rank)
        self.w_uk_t.copy_(per_head[:, : self.qk_nope].transpose(1, 2))
        self.w_uv.copy_(per_head[:, self.qk_nope :])

    def _expand(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.kv_b_proj(latent).view(-1, self.num_heads, self.qk_nope + self.v_head_dim)
        return kv[..., : self.qk_nope], kv[..., self.qk_nope :]

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, kv_a = self.q_kv_a_proj(hidden).split([self.q_width, self.kv_a_width], dim=-1)
        if self.q_lora_rank is not None:
            q = self.q_b_proj(self.q_a_layernorm(q))
        q = q.view(-1, self.num_heads, self.qk_nope + self.qk_rope)
        kv_buffer = forward_batch.token_to_kv_pool.get_latent_buffer(self.layer_id)
        if triton_support.enabled_for(kv_a):
            q_rope = mla_rope_store(
                q,
                kv_a,
                positions,
                self.rotary.cos_cache,
                self.rotary.sin_cache,
                self.kv_a_layernorm.weight,
                self.kv_a_layernorm.variance_epsilon,
                kv_buffer,
                forward_batch.out_cache_loc,
                self.qk_nope,
                self.interleaved,
            )
        else:
            q_rope = self._rope_and_store(positions, q, kv_a, forward_batch)
        q_nope = q[..., : self.qk_nope]
        if forward_batch.kv_restore is not None:  # the prefix's latents restored from the host
            forward_batch.kv_restore.wait(self.layer_id)
        if forward_batch.forward_mode.is_decode():
            # a few rows: both absorbed products as dependent launches (kernels/mla_absorb.py)
            few = (
                self.absorb_per_head
                and q.shape[0] <= MAX_ABSORB_ROWS
                and triton_support.enabled_for(q)
            )
            # W_UK into the query: [H, bs, qk_nope] x [H, qk_nope, latent]
            if few:
                q_latent = per_head_gemv(q_nope, self.w_uk_t)
            else:
                w_uk = self.w_uk_t.transpose(1, 2)
                q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
            out_latent = mla_decode(q_latent, q_rope, kv_buffer, forward_batch, self.scaling)
            # W_UV after: [H, bs, latent] x [H, latent, v_head_dim], written token-major
            # (o_proj's input layout) by the product itself, not by a copy after it
            out = q.new_empty(q.shape[0], self.num_heads, self.v_head_dim)
            if few:
                per_head_gemv(out_latent, self.w_uv, out)
            else:
                w_uv_t = self.w_uv.transpose(1, 2)
                torch.bmm(out_latent.transpose(0, 1), w_uv_t, out=out.transpose(0, 1))
        else:
            q_full = torch.cat([q_nope, q_rope], dim=-1)
            out = mla_extend(
                q_full, kv_buffer, forward_batch, self._expand, self.kv_lora_rank, self.scaling
            )
        return all_reduce(self.o_proj(out.reshape(-1, self.num_heads * self.v_head_dim)))

    def _rope_and_store(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        kv_a: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """The torch path of `mla_rope_store` (the CPU's, and its reference): the latent
        normalised, the rope parts de-interleaved and rotated, the latent row stored; returns
        the query's rotated rope parts [T, heads, rope]."""
        latent = self.kv_a_layernorm(kv_a[:, : self.kv_lora_rank].contiguous())
        q_rope, k_rope = q[..., self.qk_nope :], kv_a[:, None, self.kv_lora_rank :]
        if self.interleaved:
            q_rope, k_rope = _deinterleave(q_rope), _deinterleave(k_rope)
        q_rope, k_rope = self.rotary(positions, q_rope.contiguous(), k_rope.contiguous())
        forward_batch.token_to_kv_pool.set_latent(
            self.layer_id, forward_batch.out_cache_loc, latent, k_rope[:, 0]
        )
        return q_rope


class DeepseekRouter(LogitsAfterNorm, nn.Module):
    """The float32 router (`gate.weight`) and V3's correction bias, named as the checkpoints
    name them; its float32 logits may come from the norm's launch (layers/moe/router.py)."""

    def __init__(self, config: PretrainedConfig, num_experts: int) -> None:
        super().__init__()
        self.method = getattr(config, "topk_method", None) or "noaux_tc"
        self.weight = nn.Parameter(
            torch.zeros(num_experts, config.hidden_size, dtype=torch.float32), requires_grad=False
        )
        self.e_score_correction_bias: nn.Parameter | None = None
        if self.method == "noaux_tc":
            self.e_score_correction_bias = nn.Parameter(
                torch.zeros(num_experts, dtype=torch.float32), requires_grad=False
            )
        self.top_k = config.num_experts_per_tok
        self.n_group = getattr(config, "n_group", None) or 1
        self.topk_group = getattr(config, "topk_group", None) or 1
        self.renormalize = bool(getattr(config, "norm_topk_prob", False))
        self.scaling = float(getattr(config, "routed_scaling_factor", 1.0) or 1.0)

    def logits_dtype(self, x: torch.Tensor) -> torch.dtype:
        return torch.float32

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, top_k] float32, expert ids [T, top_k])."""
        logits = self.logits_after_norm(x)  # from the norm's launch, or:
        if (
            logits is None
            and triton_support.enabled_for(x)
            and uses_moe_gemv(x.shape[0], self.top_k)
        ):
            logits = router_gemv(x, self.weight)  # one dependent launch for cast and product
        elif logits is None:
            logits = torch.nn.functional.linear(x.float(), self.weight)
        if self.method == "greedy" and triton_support.enabled_for(logits):
            # plain softmax top-k (V2-Lite): the fused MoE's one-launch routing kernel
            weights, ids = select_experts(logits, self.top_k, self.renormalize, False)
            return (weights if self.scaling == 1.0 else weights * self.scaling), ids
        if self.method == "noaux_tc" and triton_support.enabled_for(logits):
            # V3's grouped choice with the correction bias, in one launch
            return select_experts_noaux_tc(
                logits,
                self.e_score_correction_bias,
                self.top_k,
                self.n_group,
                self.topk_group,
                self.renormalize,
                self.scaling,
            )
        return grouped_topk(
            logits,
            self.top_k,
            method=self.method,
            n_group=self.n_group,
            topk_group=self.topk_group,
            correction_bias=self.e_score_correction_bias,
            renormalize=self.renormalize,
            scaling=self.scaling,
        )


class DeepseekMoE(nn.Module):
    """Routed experts (FusedMoE, weighted by the router) plus the shared experts."""

    def __init__(self, config: PretrainedConfig, quant: QuantizationConfig | None) -> None:
        super().__init__()
        num_experts = config.n_routed_experts
        self.gate = DeepseekRouter(config, num_experts)
        self.experts = FusedMoE(
            num_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.moe_intermediate_size,
            renormalize=False,
            round_weights=False,
            activation=getattr(config, "hidden_act", "silu"),
            fp8=quant is not None and quant.quantize_experts,
        )
        shared = getattr(config, "n_shared_experts", 0) or 0
        self.shared_experts = (
            LlamaMLP(config, quant, config.moe_intermediate_size * shared) if shared else None
        )

    @property
    def input_projection(self) -> nn.Module:
        """The projection right behind the layer's norm (`LlamaDecoderLayer.norm_before`)."""
        return self.gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the shared experts first: their (unreduced) output joins the routed sum, which at a
        # few tokens is the routed GEMV's epilogue, and one all-reduce covers both
        shared = self.shared_experts.partial(x) if self.shared_experts is not None else None
        weights, ids = self.gate(x)
        return self.experts.forward_routed(x, weights, ids, add=shared)


class DeepseekDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm layer with MLA and, from `first_k_dense_replace` on, the MoE."""

    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        rotary: RotaryEmbedding,
        quant: QuantizationConfig | None = None,
    ) -> None:
        nn.Module.__init__(self)
        self.self_attn = DeepseekMLA(config, layer_id, rotary, quant)
        if is_moe_layer(config, layer_id):
            self.mlp: nn.Module = DeepseekMoE(config, quant)
        else:
            self.mlp = LlamaMLP(config, quant)
        self.build_norms(config)


class DeepseekModel(LlamaModel):
    decoder_layer_cls = DeepseekDecoderLayer


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    model_cls = DeepseekModel
    # the query's and the latent's projections load into their rows of q_kv_a_proj
    stacked_params = (
        ("q_proj", "q_kv_a_proj", "q"),
        ("q_a_proj", "q_kv_a_proj", "q"),
        ("kv_a_proj_with_mqa", "q_kv_a_proj", "kv_a"),
        ("gate_proj", "gate_up_proj", 0),
        ("up_proj", "gate_up_proj", 1),
    )
    expert_projections = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}

    def __init__(self, config: PretrainedConfig, quant: QuantizationConfig | None = None) -> None:
        check_layout(config)
        super().__init__(config, quant)

    @property
    def mla_cache_dims(self) -> tuple[int, int]:
        """(kv_lora_rank, qk_rope_head_dim): a token's latent row; the model runner builds the
        latent pool (not K/V heads) for a model that has this."""
        return self.config.kv_lora_rank, self.config.qk_rope_head_dim

    def checkpoint_name(self, name: str) -> str | None:
        """MTP layers (numbered from num_hidden_layers on) are read and dropped."""
        if name.startswith("model.layers."):
            layer = int(name.split(".", 3)[2])
            if layer >= self.config.num_hidden_layers:
                return None
        return super().checkpoint_name(name)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(weights)
        for layer in self.model.layers:
            layer.self_attn.absorb_weights()

    def _load_shard(
        self, target: str, kind: str, shard: str | int, tensor: torch.Tensor
    ) -> set[str]:
        """The query's ("q") or the latent's ("kv_a") rows of q_kv_a_proj; gate/up as Llama's."""
        if not target.endswith(".q_kv_a_proj"):
            return super()._load_shard(target, kind, shard, tensor)
        attention: DeepseekMLA = self._modules_by_name[target.rsplit(".", 1)[0]]
        if shard == "q":
            start, count = 0, attention.q_width
        else:
            start, count = attention.q_width, attention.kv_a_width
        return self._modules_by_name[target].load_rows(kind, start, count, tensor)

    def _expected_loads(self, params: dict[str, torch.Tensor]) -> set[str]:
        """Llama's, with q_kv_a_proj's parameters expected from both of their checkpoint
        tensors (a q_proj has no bias: its rows of the bias stay zero)."""
        expected = set()
        for name in super()._expected_loads(params):
            if not name.rsplit(".", 1)[0].endswith(".q_kv_a_proj"):
                expected.add(name)
                continue
            expected.add(f"{name}:kv_a")
            if not name.endswith(".bias") or self.config.q_lora_rank is not None:
                expected.add(f"{name}:q")
        return expected


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    pass


def yarn_softmax_scale(rope_parameters: dict | None, scale: float) -> float:
    """The softmax scale with YaRN's `mscale_all_dim` folded in twice, as DeepSeek's reference
    does (`softmax_scale * mscale**2`): MLA scales the non-rotary dims of q·k too. Written out
    here because transformers grew its own helper for this only in later 5.x releases."""
    params = rope_parameters or {}
    factor = params.get("factor", 1.0)
    mscale_all_dim = params.get("mscale_all_dim", 0)
    if params.get("rope_type", params.get("type", "default")) == "default" or not mscale_all_dim:
        return scale
    mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0 if factor > 1 else 1.0
    return scale * mscale * mscale
