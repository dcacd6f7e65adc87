"""The two-stage argmax on the GPU: exactly torch.argmax at the vocabularies and batch sizes
of a decode step, ties included, and inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from radixserve.layers.argmax import argmax

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,vocab", [(1, 128256), (64, 128256), (256, 151936), (3, 49152)])
def test_equals_torch_argmax(rows, vocab, dtype):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    logits = torch.randn(rows, vocab, device="cuda", generator=gen).to(dtype)
    # bf16 rounding makes ties common; add some across chunks on purpose
    logits[0, [7, vocab // 2, vocab - 1]] = logits[0].max() + 1
    assert torch.equal(argmax(logits), torch.argmax(logits, dim=-1))
    assert argmax(logits)[0].item() == 7


def test_replays_in_a_cuda_graph():
    logits = torch.randn(8, 128256, device="cuda")
    argmax(logits)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax(logits)
    logits.copy_(torch.randn_like(logits))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.argmax(logits, dim=-1))
