"""DeepSeek's parts, each against its reference: the grouped top-k routing against
transformers' own routers (V3's noaux_tc with the correction bias, V2's greedy and
group-limited greedy), the absorbed MLA decode against the expanded attention transformers
computes, the latent pool's layout, and the refusals of what is not served."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from radixserve.catalog.architectures import UnsupportedModelError, check_architecture
from radixserve.catalog.servable import check_servable
from radixserve.layers.mla import (
    expand_groups,
    mla_attention_backend,
    mla_decode_native,
    mla_extend,
)
from radixserve.layers.moe.routing import grouped_topk
from radixserve.mem_cache.mla_memory_pool import MLATokenToKVPool
from radixserve.models.deepseek_v2 import check_layout

HIDDEN = 16


def _sorted(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.long().gather(1, order)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    groups=st.sampled_from([(1, 1), (4, 2), (8, 3), (4, 4)]),
    top_k=st.integers(1, 4),
    renormalize=st.booleans(),
    scaling=st.sampled_from([1.0, 2.5]),
)
def test_noaux_tc_routing_matches_transformers(seed, groups, top_k, renormalize, scaling):
    n_group, topk_group = groups
    experts = 16
    config = DeepseekV3Config(
        hidden_size=HIDDEN,
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        n_group=n_group,
        topk_group=topk_group,
        norm_topk_prob=renormalize,
        routed_scaling_factor=scaling,
    )
    router = DeepseekV3TopkRouter(config)
    generator = torch.Generator().manual_seed(seed)
    router.weight.data = torch.randn(experts, HIDDEN, generator=generator)
    router.e_score_correction_bias.copy_(torch.randn(experts, generator=generator) * 0.5)
    x = torch.randn(12, HIDDEN, generator=generator)
    logits, want_w, want_ids = router(x)
    got_w, got_ids = grouped_topk(
        logits,
        top_k,
        method="noaux_tc",
        n_group=n_group,
        topk_group=topk_group,
        correction_bias=router.e_score_correction_bias,
        renormalize=renormalize,
        scaling=scaling,
    )
    want_w, want_ids = _sorted(want_w, want_ids)
    got_w, got_ids = _sorted(got_w, got_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    method=st.sampled_from(["greedy", "group_limited_greedy"]),
    scaling=st.sampled_from([1.0, 16.0]),
)
def test_v2_routing_matches_transformers(seed, method, scaling):
    experts, top_k = 16, 3
    config = DeepseekV2Config(
        hidden_size=HIDDEN,
        num_attention_heads=4,
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        topk_method=method,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=scaling,
    )
    router = DeepseekV2TopkRouter(config)
    generator = torch.Generator().manual_seed(seed)
    router.weight.data = torch.randn(experts, HIDDEN, generator=generator)
    x = torch.randn(12, HIDDEN, generator=generator)
    logits, want_w, want_ids = router(x)
    got_w, got_ids = grouped_topk(
        logits, top_k, method=method, n_group=4, topk_group=2, scaling=scaling
    )
    want_w, want_ids = _sorted(want_w, want_ids)
    got_w, got_ids = _sorted(got_w, got_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w)


def _batch(seq_lens: list[int], prefix_lens: list[int], req_to_token: torch.Tensor):
    return SimpleNamespace(
        batch_size=len(seq_lens),
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        req_pool_indices=torch.arange(len(seq_lens)),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
        extend_seq_lens_cpu=[s - p for s, p in zip(seq_lens, prefix_lens, strict=True)],
        extend_prefix_lens_cpu=prefix_lens,
    )


def test_absorbed_decode_is_the_expanded_attention():
    """W_UK folded into the query and W_UV applied after the latent attention give what the
    expanded keys and values give (transformers' form), through the paged pool."""
    torch.manual_seed(0)
    heads, nope, rope, v_dim, latent = 3, 8, 4, 6, 10
    seq_lens = [5, 17]
    pool = MLATokenToKVPool(40, 1, latent, rope, torch.float64, "cpu")
    req_to_token = torch.zeros(2, 32, dtype=torch.int32)
    slots = torch.randperm(40)[: sum(seq_lens)] + 1
    req_to_token[0, :5], req_to_token[1, :17] = slots[:5], slots[5:]
    pool.set_latent(0, slots, torch.randn(22, latent), torch.randn(22, rope))
    w_kv = torch.randn(heads * (nope + v_dim), latent, dtype=torch.float64)
    per_head = w_kv.view(heads, nope + v_dim, latent)
    w_uk, w_uv = per_head[:, :nope], per_head[:, nope:].transpose(1, 2)

    def expand(c):
        kv = (c @ w_kv.T).view(-1, heads, nope + v_dim)
        return kv[..., :nope], kv[..., nope:]

    q = torch.randn(2, heads, nope + rope, dtype=torch.float64)
    scale = 0.3
    # expanded: each request's last token as a one-token extend over its cached prefix
    expanded = mla_extend(
        q, pool.get_latent_buffer(0), _batch(seq_lens, [4, 16], req_to_token), expand, latent, scale
    )
    q_latent = torch.bmm(q[..., :nope].transpose(0, 1), w_uk).transpose(0, 1)
    q_absorbed = torch.cat([q_latent, q[..., nope:]], dim=-1)
    batch = _batch(seq_lens, [4, 16], req_to_token)
    out_latent = mla_decode_native(
        q_absorbed,
        pool.get_latent_buffer(0),
        req_to_token,
        batch.req_pool_indices,
        batch.seq_lens,
        17,
        latent,
        scale,
    )
    absorbed = torch.bmm(out_latent.transpose(0, 1), w_uv).transpose(0, 1)
    torch.testing.assert_close(absorbed, expanded, rtol=1e-10, atol=1e-10)


@settings(max_examples=200, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 300)), min_size=1, max_size=12),
    max_keys=st.integers(1, 700),
)
def test_expand_groups_cover_the_pass_in_order_within_the_bound(lens, max_keys):
    """The Triton extend path's groups: every request once, in order, consecutive; a group
    over max_keys keys is a single request; no group could take its successor's first; each
    says its keys."""
    prefix, new = [p for p, _ in lens], [e for _, e in lens]
    keys = [p + e for p, e in lens]
    groups = expand_groups(prefix, new, max_keys)
    assert [i for first, end, _ in groups for i in range(first, end)] == list(range(len(lens)))
    for first, end, total in groups:
        assert end > first
        assert total == sum(keys[first:end])
        assert total <= max_keys or end - first == 1
    for (_, _, total), (nxt, _, _) in zip(groups, groups[1:], strict=False):
        assert total + keys[nxt] > max_keys


def test_latent_pool_layout():
    pool = MLATokenToKVPool(8, 2, 16, 4, torch.float32, "cpu")
    assert [tuple(b.shape) for b in pool.kv_buffers()] == [(9, 1, 20)] * 2
    # values are the latent part of the same rows: no memory of their own
    assert pool.v_buffers[1].data_ptr() == pool.k_buffers[1].data_ptr()
    loc = torch.tensor([3, 5])
    latent, k_rope = torch.randn(2, 16), torch.randn(2, 4)
    pool.set_latent(1, loc, latent, k_rope)
    keys, values = pool.read_kv(1, loc, torch.float32)
    assert torch.equal(keys[:, 0], torch.cat([latent, k_rope], dim=-1))
    assert torch.equal(values[:, 0], latent)
    assert MLATokenToKVPool.latent_bytes_per_token(2, 16, 4, torch.bfloat16) == 2 * 20 * 2
    with pytest.raises(ValueError, match="FP8 KV cache is not supported for MLA"):
        MLATokenToKVPool(8, 2, 16, 4, torch.float8_e4m3fn, "cpu")


def test_unsupported_layouts_are_refused_in_one_line():
    assert check_architecture("deepseek_v3", ["DeepseekV3ForCausalLM"]) == "DeepseekV3ForCausalLM"
    assert check_architecture("deepseek_v2", None) == "DeepseekV2ForCausalLM"
    config = DeepseekV2Config(hidden_size=HIDDEN, num_attention_heads=4)
    config.topk_method = "auxiliary_free"
    with pytest.raises(UnsupportedModelError, match="topk_method 'auxiliary_free'"):
        check_layout(config)
    # from the raw config.json, torch-free, before anything loads
    v3 = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
    check_servable({**v3, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}, None)
    with pytest.raises(UnsupportedModelError, match="'noaux_tc' with scoring_func 'softmax'"):
        check_servable({**v3, "topk_method": "noaux_tc", "scoring_func": "softmax"}, None)
    with pytest.raises(ValueError, match="flashinfer does not serve MLA"):
        mla_attention_backend("flashinfer", "cuda")
    assert mla_attention_backend("auto", "cuda") == "triton"
    assert mla_attention_backend("auto", "cpu") == "auto"


def test_active_parameters_count_mla_and_shared_experts():
    """V2-Lite's published 2.4B activated parameters: MLA's projections, 6 routed and 2 shared
    experts in 26 MoE layers, one dense layer, embedding and LM head."""
    from radixserve.model_loader.config import build_model_config
    from radixserve.model_loader.random_init import random_hf_config

    config = build_model_config(
        random_hf_config("deepseek-v2-lite"),
        dtype="auto",
        device="cpu",
        context_length=4096,
        eos_token_ids=set(),
    )
    assert 2.40e9 < config.matmul_parameters < 2.50e9
