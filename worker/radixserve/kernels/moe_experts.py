"""What the two MoE kernel paths share about one expert's product: how its weight tiles are
read (model dtype, FP8 with channel scales, MXFP4 decoded in registers) and how a product is
finished (channel scale, rounding, bias, the gated activation).

The grouped GEMM (fused_moe.py, many tokens) and the routed GEMV (moe_gemv.py, a few tokens)
must compute the same values the torch reference does, rounding included; keeping these pieces
in one place is what keeps the two paths equal to each other.
"""

from __future__ import annotations

from radixserve.kernels.fused_ops import gelu_tanh
from radixserve.kernels.triton_support import jit, tl

# the gated activations the epilogues apply, by a config's name; any other name is GELU-tanh
# (gelu_pytorch_tanh and its aliases), as for the dense MLP
ACTIVATIONS = {"silu": 0, "swiglu_oai": 2}
_GELU = 1

# values per MXFP4 scale (layers/quantization/mxfp4.GROUP): K tiles hold whole groups
MXFP4_GROUP = 32


def activation_code(activation: str) -> int:
    """The kernels' ACT constexpr for a config's activation name."""
    return ACTIVATIONS.get(activation, _GELU)


@jit
def mxfp4_tile(b_ptrs, s_ptrs, offs_k, mask, dtype: tl.constexpr):
    """A [BLOCK_K, BLOCK_N] tile of MXFP4 weights as `dtype`: nibble k of byte k // 2 (low
    first), e2m1 decoded (sign, 2 exponent bits, 1 mantissa bit; exponent 0 is 0 or 0.5),
    times its group's 2^(scale - 127).

    Both are built as float32 bit patterns with integer operations (e2m1: 2^(e - 1) (1 + m / 2)
    is exponent field e + 126 and mantissa's top bit m; a scale byte is the exponent field
    itself, 0 being the subnormal 2^-127), not with exp2: at batch 1 each weight is used once,
    and two special-function operations a weight made the decode, not the memory, the limit."""
    packed = tl.load(b_ptrs, mask=mask, other=0).to(tl.int32)
    code = (packed >> ((offs_k[:, None] % 2) * 4)) & 0xF
    exponent = (code >> 1) & 3
    mantissa = code & 1
    bits = tl.where(
        exponent == 0, mantissa * 0x3F000000, ((exponent + 126) << 23) | (mantissa << 22)
    )
    value = (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)
    scale_byte = tl.load(s_ptrs, mask=mask, other=127).to(tl.int32)
    scale = tl.where(scale_byte == 0, 0x00400000, scale_byte << 23).to(tl.float32, bitcast=True)
    return (value * scale).to(dtype)


@jit
def finish_product(
    acc, Scale, Bias, offs_n, n_mask, dtype: tl.constexpr, HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """One expert product's float32 sums (acc [..., BLOCK_N]) as the reference's values, in
    float32: times the channel scales of quantized weights (Scale, FP8), rounded to the
    activation dtype as a separate matmul's output is, plus the bias (Bias) and rounded again
    as the reference's separate add is. Scale and Bias point at this expert's (and half's)
    first output channel."""
    if HAS_SCALE:
        acc = acc * tl.load(Scale + offs_n, mask=n_mask, other=0.0)
    out = acc.to(dtype).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        out = (out + bias).to(dtype).to(tl.float32)
    return out


@jit
def gated_activation(gate, up, alpha, limit, ACT: tl.constexpr):
    """act(gate) * up in float32, act by ACT: 0 SiLU, 1 GELU-tanh, 2 gpt-oss's clamped SwiGLU
    ((clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit))."""
    if ACT == 1:
        out = gelu_tanh(gate) * up
    elif ACT == 2:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        out = (up + 1.0) * (gate / (1.0 + tl.exp(-alpha * gate)))
    else:
        out = gate / (1.0 + tl.exp(-gate)) * up
    return out
