"""Run the Triton MLA decode and extend kernels in Triton's CPU interpreter against the torch
references (layers/mla.py's `mla_decode_native`, `mla_extend_native`) and a float64 dense
computation; print one JSON line.

Started by test_mla_interpret.py in a subprocess (TRITON_INTERPRET must be set before the
kernel module is imported). Small latent sizes keep the interpreter quick; tests/gpu repeats
the check at DeepSeek's 512 + 64 in bf16.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

import torch  # noqa: E402
from mla_extend_case import dense_extend, extend_case  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from radixserve.kernels import triton_support  # noqa: E402
from radixserve.kernels.mla_absorb import per_head_gemv  # noqa: E402
from radixserve.kernels.mla_decode import (  # noqa: E402
    MLADecodeConfig,
    default_config,
    mla_decode_fwd,
    num_splits,
)
from radixserve.layers import mla  # noqa: E402
from radixserve.layers.mla import mla_decode_native  # noqa: E402


def _allow_one_element_index() -> None:
    """Triton 3.6's interpreter does int(array of shape (1,)) for loop bounds, which numpy
    2.x refuses; take the single element instead."""
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def dense(q: torch.Tensor, rows: list[torch.Tensor], latent: int, scale: float) -> torch.Tensor:
    """float64, request by request: softmax(q . K^T * scale) K[:, :latent]."""
    out = []
    for b, kv in enumerate(rows):
        kv = kv.double()
        weights = torch.softmax(q[b].double() @ kv.T * scale, dim=-1)
        out.append(weights @ kv[:, :latent])
    return torch.stack(out)


def case(
    seq_lens: list[int], heads: int, latent: int, rope: int, sms: int, config: MLADecodeConfig
) -> dict:
    generator = torch.Generator().manual_seed(sum(seq_lens) + heads)
    width = latent + rope
    slots = sum(seq_lens) + 1
    pool = torch.randn(slots + 1, 1, width, generator=generator)
    bs = len(seq_lens)
    req_to_token = torch.zeros(bs + 2, max(seq_lens) + 8, dtype=torch.int32)
    # each request's slots scattered over the pool (a permutation), rows out of order
    order = torch.randperm(slots, generator=generator)[: sum(seq_lens)] + 1
    rows, start = [], 0
    req_pool_indices = torch.arange(bs, dtype=torch.int64).flip(0) + 1
    for b, n in enumerate(seq_lens):
        req_to_token[req_pool_indices[b], :n] = order[start : start + n].to(torch.int32)
        rows.append(pool[order[start : start + n].long(), 0])
        start += n
    q = torch.randn(bs, heads, width, generator=generator)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    scale = width**-0.5
    # the two halves of the absorbed query as the model hands them over: views, not a cat
    q_latent = q[..., :latent].transpose(0, 1).contiguous().transpose(0, 1)
    out = mla_decode_fwd(
        q_latent, q[..., latent:], pool, req_to_token, req_pool_indices, lens, scale, sms, config
    )
    native = mla_decode_native(
        q, pool, req_to_token, req_pool_indices, lens, max(seq_lens), latent, scale
    )
    ref = dense(q, rows, latent, scale)
    return {
        "seq_lens": seq_lens,
        "heads": heads,
        "splits": num_splits(bs, heads, sms, config.block_h),
        "block_h": config.block_h,
        "rel_err": float((out.double() - ref).norm() / ref.norm()),
        "native_rel_err": float((native.double() - ref).norm() / ref.norm()),
    }


@torch.no_grad()
def extend_results(prefix_lens: list[int], extend_lens: list[int], group_tokens: int) -> dict:
    """`mla_extend` on its Triton path (requests packed in groups of at most group_tokens
    keys) against its torch path and a float64 dense computation: requests with and without a
    cached prefix, their slots scattered over the pool, widths off the kernel's blocks
    (nope 24, rope 8, value 12, 3 heads)."""
    from unittest import mock

    case = extend_case(prefix_lens, extend_lens, heads=3, latent=32, rope=8, nope=24, v_dim=12)
    scale = (case.nope + 8) ** -0.5
    native = mla.mla_extend_native(case.q, case.pool, case.batch, case.expand, 32, scale)
    with (
        mock.patch.object(triton_support, "enabled_for", lambda x: True),
        mock.patch.object(mla, "EXPAND_GROUP_TOKENS", group_tokens),
    ):
        out = mla.mla_extend(case.q, case.pool, case.batch, case.expand, 32, scale)
        groups = case.batch.mla_key_groups
        # a second layer of the pass: the groups made at the first, the same values
        again = mla.mla_extend(case.q, case.pool, case.batch, case.expand, 32, scale)
    ref = dense_extend(case, scale)
    return {
        "prefix_lens": prefix_lens,
        "groups": len(groups),
        "groups_kept": case.batch.mla_key_groups is groups and torch.equal(again, out),
        "rel_err": float((out.double() - ref).norm() / ref.norm()),
        "native_rel_err": float((native.double() - ref).norm() / ref.norm()),
    }


@torch.no_grad()
def absorb_results() -> list[dict]:
    """The per-head GEMV (kernels/mla_absorb.py) against torch.bmm in float64: W_UK's shape on
    a strided query view (q_nope of [rows, heads, nope + rope]), W_UV's into a given output,
    1 to 4 rows, widths off the kernel's blocks."""
    generator = torch.Generator().manual_seed(4)
    out = []
    for rows, heads, k, n, dtype in [
        (1, 3, 24, 40, torch.float32),
        (3, 5, 40, 70, torch.float32),
        (4, 2, 100, 24, torch.float16),
    ]:
        q = torch.randn(rows, heads, k + 8, generator=generator).to(dtype)
        x = q[..., :k]  # a view: rows and heads strided past the rope part
        weight = torch.randn(heads, n, k, generator=generator).to(dtype) / k**0.5  # output-major
        exact = torch.bmm(x.double().transpose(0, 1), weight.double().transpose(1, 2))
        exact = exact.transpose(0, 1)
        got = per_head_gemv(x, weight)
        given = torch.full((rows, heads, n + 2), 7.0, dtype=dtype)[..., :n]
        per_head_gemv(x, weight, given)
        out.append(
            {
                "rows": rows,
                "dtype": str(dtype),
                "rel_err": float((got.double() - exact).norm() / exact.norm()),
                "given_equal": bool(torch.equal(given, got)),
            }
        )
    return out


@torch.no_grad()
def rope_store_case(interleaved: bool) -> dict:
    """The fused prologue against DeepseekMLA's torch path on the tiny V3 layout's layer."""
    from types import SimpleNamespace

    from radixserve.kernels.mla_rope_store import mla_rope_store
    from radixserve.layers.rotary_embedding import RotaryEmbedding
    from radixserve.mem_cache.mla_memory_pool import MLATokenToKVPool
    from radixserve.model_loader.random_init import random_hf_config
    from radixserve.models.deepseek_v2 import DeepseekMLA

    torch.manual_seed(3)
    config = random_hf_config("tiny-deepseek-v3")
    config.rope_interleave = interleaved
    rotary = RotaryEmbedding(config, config.qk_rope_head_dim, 2048)
    layer = DeepseekMLA(config, 0, rotary, None)
    layer.kv_a_layernorm.weight.data.uniform_(0.5, 1.5)
    tokens, width = 7, config.kv_lora_rank + config.qk_rope_head_dim
    q = torch.randn(tokens, config.num_attention_heads, 24)
    kv_a = torch.randn(tokens, width)
    positions = torch.tensor([0, 1, 5, 100, 700, 1500, 2047])
    loc = torch.tensor([3, 9, 1, 4, 12, 7, 2])
    pools = [MLATokenToKVPool(16, 1, config.kv_lora_rank, 8, torch.float32, "cpu") for _ in "ab"]
    batch = SimpleNamespace(token_to_kv_pool=pools[0], out_cache_loc=loc)
    want = layer._rope_and_store(positions, q, kv_a, batch)
    got = mla_rope_store(
        q,
        kv_a,
        positions,
        rotary.cos_cache,
        rotary.sin_cache,
        layer.kv_a_layernorm.weight,
        layer.kv_a_layernorm.variance_epsilon,
        pools[1].get_latent_buffer(0),
        loc,
        16,
        interleaved,
    )
    pool_want, pool_got = pools[0].get_latent_buffer(0), pools[1].get_latent_buffer(0)
    return {
        "interleaved": interleaved,
        "q_err": float((got - want).abs().max()),
        "pool_err": float((pool_got - pool_want).abs().max()),
        "rows_written": int((pool_got.abs().sum(-1) > 0).sum()),
    }


def model_results() -> list[dict]:
    """The DeepSeek layouts forced onto their CUDA path (the prologue and MLA decode kernels,
    the fused MoE with the model's own routing, V2-Lite's greedy routing through the fused
    routing kernel) against their torch path, float32: a prefill, a second chunk on its cached
    prefix, two decode steps (tests/gpu/test_fused_ops.model_passes)."""
    from test_fused_ops import model_passes

    results = []
    for preset in ("tiny-deepseek-v3", "tiny-deepseek-v2-lite"):
        model = f"random:{preset}"
        native = model_passes(model, "float32", "cpu", "torch_native", False, [3, 17, 70])
        fused = model_passes(model, "float32", "cpu", "triton", True, [3, 17, 70])
        pairs = list(zip(fused, native, strict=True))
        results.append(
            {
                "case": preset,
                "rel_err": max(float((f - n).norm() / n.norm()) for f, n in pairs),
                "same_argmax": all(torch.equal(f.argmax(-1), n.argmax(-1)) for f, n in pairs),
            }
        )
    return results


def main() -> None:
    _allow_one_element_index()
    rope_store = [rope_store_case(True), rope_store_case(False)]
    models = model_results()
    float32_tile = default_config(16, torch.float32)  # the tile this float32 check serves with
    results = [
        # several requests, fewer heads than the 16-row head block (padding rows masked)
        case([1, 70, 200], 12, latent=64, rope=16, sms=8, config=float32_tile),
        # one long request over many splits (the GPU's split count at batch 1)
        case([1500], 16, latent=32, rope=8, sms=132, config=float32_tile),
        # more than 16 heads: bf16's 64-row head blocks (V3's), the second one mostly padding
        case(
            [3, 130, 65], 70, latent=32, rope=16, sms=8, config=default_config(70, torch.bfloat16)
        ),
    ]
    extend = [
        # prefill, a cached prefix, a decode-like row of one token (a mixed pass): one group
        extend_results([0, 40, 99], [37, 5, 1], group_tokens=16384),
        # the same requests in three groups of at most 64 keys (the 104-key one alone)
        extend_results([0, 40, 99], [37, 5, 1], group_tokens=64),
    ]
    print(
        json.dumps(
            {
                "decode": results,
                "extend": extend,
                "absorb": absorb_results(),
                "rope_store": rope_store,
                "models": models,
            }
        )
    )


if __name__ == "__main__":
    main()
