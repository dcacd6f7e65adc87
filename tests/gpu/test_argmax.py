"""The two-stage argmax on the GPU: exactly torch.argmax at the vocabularies and batch sizes
of a decode step, ties included, and inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels.argmax import argmax

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


def test_replays_in_a_cuda_graph_scattering_into_a_ring():
    """As a captured decode step uses it: the winners also land in the ring slots that the
    step's inputs name (padded rows share slot 0), with new slots at every replay."""
    logits = torch.randn(8, 128256, device="cuda")
    ring = torch.zeros(64, dtype=torch.int64, device="cuda")
    slots = torch.tensor([5, 6, 7, 8, 9, 0, 0, 0], device="cuda")
    argmax(logits, scatter_to=(ring, slots))  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax(logits, scatter_to=(ring, slots))
    logits.copy_(torch.randn_like(logits))
    slots.copy_(torch.tensor([40, 41, 42, 43, 44, 0, 0, 0]))
    graph.replay()
    torch.cuda.synchronize()
    expected = torch.argmax(logits, dim=-1)
    assert torch.equal(out, expected)
    assert torch.equal(ring[40:45], expected[:5])
