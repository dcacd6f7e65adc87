"""FlashInfer's sink step on the CPU: the output of a softmax over the keys alone, rescaled by
its base-2 log-sum-exp (`with_sinks`), is the softmax that also counts each head's sink
(gpt-oss's eager attention). The kernels themselves run in tests/gpu."""

from __future__ import annotations

import math

import torch

from radixserve.layers.attention.flashinfer_backend import with_sinks


def test_output_rescaled_by_its_lse_is_the_softmax_with_sinks():
    gen = torch.Generator().manual_seed(3)
    tokens, heads, keys, dim = 5, 4, 9, 8
    scores = torch.randn(tokens, heads, keys, generator=gen, dtype=torch.float64) * 3
    values = torch.randn(keys, heads, dim, generator=gen, dtype=torch.float64)
    sinks = torch.randn(heads, generator=gen, dtype=torch.float64) * 2
    plain = torch.einsum("thk,khd->thd", scores.softmax(-1), values)
    lse2 = torch.logsumexp(scores, -1) / math.log(2.0)  # FlashInfer's base-2 log-sum-exp
    with_sink = torch.cat([scores, sinks.view(1, -1, 1).expand(tokens, -1, 1)], -1)
    expected = torch.einsum("thk,khd->thd", with_sink.softmax(-1)[..., :-1], values)
    assert torch.allclose(with_sinks(plain, lse2, sinks), expected, atol=1e-6)
