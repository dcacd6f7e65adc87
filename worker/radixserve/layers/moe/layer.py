"""FusedMoE: a mixture-of-experts MLP's experts, one tensor for all of them.

Weights: `w13_weight` [E, 2 * I_rank, H] ([gate; up] of every expert) and `w2_weight`
[E, H, I_rank]. Tensor parallelism shards the experts' intermediate dimension like a dense
MLP's: each rank holds rows [lo, hi) of every expert's gate and up and the same columns of
its down projection, so the ranks' outputs are partial sums and one all-reduce finishes the
layer. With FP8 (`--quantization fp8` or an FP8 checkpoint) the weights are float8 with a
float32 scale per (expert, output channel). Experts may have biases (`bias=True`, gpt-oss:
`w13_bias` [E, 2 * I_rank] and `w2_bias` [E, H], the latter added by rank 0 only, since the
ranks' outputs are summed) and gpt-oss's clamped SwiGLU (`activation="swiglu_oai"`, `swiglu`:
its alpha and limit). With `mxfp4` the weights are MXFP4 (layers/quantization/mxfp4.py): uint8
[E, N, K / 2] packed e2m1 pairs and uint8 [E, N, K / 32] power-of-two scales in the `*_scale`
parameters, quantized at load from whatever the checkpoint holds; each rank's intermediate
size must then be a multiple of 32 (down's groups run along it).

Routing (softmax, top-k, renormalisation) is here too, so a model gives the layer its hidden
states and router logits only; a model that routes its own way (DeepSeek) gives the chosen
experts and weights to `forward_routed`. On CUDA the Triton kernels run (fused_moe.py); elsewhere the
torch reference.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.distributed.parallel_state import all_reduce, even_shard, tp_rank, tp_size
from radixserve.kernels import triton_support
from radixserve.kernels.fused_moe import (
    fused_moe,
    select_experts,
    select_experts_native,
)
from radixserve.layers.moe.reference import fused_moe_native
from radixserve.layers.quantization.fp8 import FP8_DTYPE, channel_scales, quantize_rows
from radixserve.layers.quantization.mxfp4 import GROUP, quantize_mxfp4

# checkpoint projection name -> (tensor, offset of its rows in [gate; up] in units of I)
EXPERT_PROJECTIONS = {"gate": ("w13", 0), "up": ("w13", 1), "down": ("w2", None)}


class FusedMoE(nn.Module):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        round_weights: bool,
        activation: str = "silu",
        fp8: bool = False,
        bias: bool = False,
        swiglu: tuple[float, float] = (1.702, 7.0),
        mxfp4: bool = False,
    ) -> None:
        """`round_weights`: round the routing weights to the model dtype before using them
        (Qwen3-MoE does, Mixtral keeps them in float32)."""
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.round_weights = round_weights
        self.activation = activation
        self.swiglu = swiglu
        self.intermediate_size = intermediate_size
        self.rows = even_shard(intermediate_size, tp_rank(), tp_size())
        local = self.rows[1] - self.rows[0]
        self.local_intermediate = local
        self.mxfp4 = mxfp4
        self.w13_weight_scale: nn.Parameter | None = None
        self.w2_weight_scale: nn.Parameter | None = None
        if mxfp4:
            if hidden_size % GROUP or local % GROUP:
                raise ValueError(
                    f"MXFP4 experts need the hidden size ({hidden_size}) and each rank's "
                    f"intermediate size ({local}) to be multiples of {GROUP}"
                )
            self._mxfp4_parameters(num_experts, hidden_size, local)
        dtype = FP8_DTYPE if fp8 else None
        if not mxfp4:
            self.w13_weight = nn.Parameter(
                torch.zeros(num_experts, 2 * local, hidden_size, dtype=dtype), requires_grad=False
            )
            self.w2_weight = nn.Parameter(
                torch.zeros(num_experts, hidden_size, local, dtype=dtype), requires_grad=False
            )
        if fp8:
            self.w13_weight_scale = nn.Parameter(
                torch.ones(num_experts, 2 * local, dtype=torch.float32), requires_grad=False
            )
            self.w2_weight_scale = nn.Parameter(
                torch.ones(num_experts, hidden_size, dtype=torch.float32), requires_grad=False
            )
        self.w13_bias: nn.Parameter | None = None
        self.w2_bias: nn.Parameter | None = None
        if bias:
            self.w13_bias = nn.Parameter(torch.zeros(num_experts, 2 * local), requires_grad=False)
            self.w2_bias = nn.Parameter(torch.zeros(num_experts, hidden_size), requires_grad=False)
        # [experts that got a token, passes], summed over passes: the expert weights a pass
        # actually streams (bench latency reads it). A buffer that moves with the layer, not
        # state: no checkpoint has it.
        self.expert_use: torch.Tensor
        self.register_buffer("expert_use", torch.zeros(2, dtype=torch.int64), persistent=False)

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden [T, H], router_logits [T, E] -> [T, H], summed over the ranks."""
        select = select_experts if triton_support.enabled_for(hidden) else select_experts_native
        weights, ids = select(router_logits, self.top_k, self.renormalize, self.round_weights)
        return self.forward_routed(hidden, weights, ids)

    def forward_routed(
        self,
        hidden: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        add: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The experts for a routing already chosen (by `forward`, or by the model itself:
        DeepSeek's grouped top-k with its correction bias, layers/moe/routing.py): hidden
        [T, H], weights [T, top_k] float32, ids [T, top_k] -> [T, H], summed over the ranks.
        `add` [T, H] (this rank's part of DeepSeek's shared experts) joins the sum before the
        all-reduce: at a few tokens in the routed GEMV's epilogue, with no launch of its own."""
        if triton_support.enabled_for(hidden):
            out = fused_moe(
                hidden,
                self.w13_weight,
                self.w2_weight,
                weights,
                ids,
                self.expert_use,
                self.activation,
                self.w13_weight_scale,
                self.w2_weight_scale,
                w13_bias=self.w13_bias,
                w2_bias=self.w2_bias,
                swiglu=self.swiglu,
                add=add,
            )
        else:
            out = fused_moe_native(
                hidden,
                self.w13_weight,
                self.w2_weight,
                weights,
                ids,
                self.activation,
                self.w13_weight_scale,
                self.w2_weight_scale,
                self.expert_use,
                w13_bias=self.w13_bias,
                w2_bias=self.w2_bias,
                swiglu=self.swiglu,
            )
            if add is not None:
                out = out + add
        return all_reduce(out)

    def _mxfp4_parameters(self, experts: int, hidden: int, local: int) -> None:
        def packed(rows: int, k: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(experts, rows, k, dtype=torch.uint8), False)

        self.w13_weight = packed(2 * local, hidden // 2)
        self.w2_weight = packed(hidden, local // 2)
        self.w13_weight_scale = packed(2 * local, hidden // GROUP)
        self.w2_weight_scale = packed(hidden, local // GROUP)

    def experts_read(self) -> tuple[int, int]:
        """(experts used, passes) summed since the layer was built (a host sync)."""
        used, passes = self.expert_use.tolist()
        return used, passes

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's weights and scales on this rank."""
        tensors = [
            self.w13_weight,
            self.w2_weight,
            self.w13_weight_scale,
            self.w2_weight_scale,
            self.w13_bias,
            self.w2_bias,
        ]
        total = sum(t.numel() * t.element_size() for t in tensors if t is not None)
        return total // self.num_experts

    @torch.no_grad()
    def load_expert(
        self, projection: str, expert: int | None, kind: str, tensor: torch.Tensor
    ) -> set[str]:
        """Load a checkpoint tensor of one expert (`expert`) or of all of them (None: the
        stacked [E, ...] form transformers builds in memory); `projection` is gate, up, down
        or gate_up (stacked only), `kind` weight, weight_scale or bias. This rank takes its
        rows of the intermediate dimension. Returns the parameter names written."""
        lo, hi = self.rows
        experts = slice(None) if expert is None else expert
        if kind == "bias":
            return self._load_bias(projection, experts, tensor)
        if projection == "gate_up":  # [E, 2I, H]: halves are gate and up
            size = self.intermediate_size
            gate, up = tensor[:, lo:hi], tensor[:, size + lo : size + hi]
            return self.load_expert("gate", None, kind, gate) | self.load_expert(
                "up", None, kind, up
            )
        name, half = EXPERT_PROJECTIONS[projection]
        local = self.local_intermediate
        if half is not None:
            if expert is not None:  # a whole checkpoint tensor: this rank's rows
                tensor = tensor[lo:hi] if tensor.shape[0] == self.intermediate_size else tensor
            rows = slice(half * local, (half + 1) * local)
            return self._write(name, experts, rows, kind, tensor)
        if kind == "weight" and tensor.shape[-1] == self.intermediate_size:
            tensor = tensor[..., lo:hi]  # down: this rank's columns of the intermediate dim
        return self._write(name, experts, slice(None), kind, tensor)

    def _load_bias(self, projection: str, experts: int | slice, tensor: torch.Tensor) -> set[str]:
        """A gate_up bias ([E or one, 2I]: [gate; up]) or a down bias ([E or one, H])."""
        if self.w13_bias is None or self.w2_bias is None:
            raise KeyError("these experts have no biases")
        if projection == "down":
            self.w2_bias[experts].copy_(tensor if tp_rank() == 0 else torch.zeros_like(tensor))
            return {"w2_bias"}
        if projection != "gate_up":
            raise KeyError(f"expert biases load as gate_up or down, not {projection}")
        (lo, hi), size = self.rows, self.intermediate_size
        rows = torch.cat([tensor[..., lo:hi], tensor[..., size + lo : size + hi]], dim=-1)
        self.w13_bias[experts].copy_(rows)
        return {"w13_bias"}

    def _write(
        self,
        name: str,
        experts: int | slice,
        rows: slice,
        kind: str,
        tensor: torch.Tensor,
    ) -> set[str]:
        weight = getattr(self, f"{name}_weight")
        scale = getattr(self, f"{name}_weight_scale")
        if kind == "input_scale":
            return set()
        if kind == "weight_scale":
            if scale is None:
                raise KeyError(f"{name}: unquantized experts have no weight_scale")
            target = scale[experts, rows]
            count = target.shape[-1]
            if target.dim() == 2:  # stacked: one scale or one row of scales per expert
                values = torch.stack([channel_scales(s, count) for s in tensor.float()])
            else:
                values = channel_scales(tensor, count)
            target.copy_(values)
            return {f"{name}_weight_scale"}
        if scale is None:
            weight[experts, rows].copy_(tensor)
            return {f"{name}_weight"}
        if self.mxfp4:
            blocks, scales = quantize_mxfp4(tensor)
            weight[experts, rows].copy_(blocks.flatten(-2))
            scale[experts, rows].copy_(scales)
            return {f"{name}_weight", f"{name}_weight_scale"}
        if tensor.dtype == FP8_DTYPE:
            weight[experts, rows].copy_(tensor)
            return {f"{name}_weight"}
        values, row_scales = quantize_rows(tensor)
        weight[experts, rows].copy_(values)
        scale[experts, rows].copy_(row_scales)
        return {f"{name}_weight", f"{name}_weight_scale"}
