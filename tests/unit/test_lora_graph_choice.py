"""CudaGraphRunner with LoRA adapters: each size is captured with the LoRA kernels and without
any, and a replay whose rows all use the base model takes the graph without them. On the CPU,
through a stand-in for torch.cuda's graph API that records the LoRA products each capture ran
(tests/gpu/test_lora_gpu.py replays real graphs)."""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

from radixserve.kernels import lora as lora_kernels
from radixserve.layers.lora_linear import NO_ADAPTER, LoRABatch, LoRALinear
from radixserve.mem_cache.memory_pool import ReqToTokenPool
from radixserve.model_executor import cuda_graph_runner
from radixserve.model_executor.future_tokens import FutureTokens

VOCAB = 8
launched: list[str] = []  # the LoRA products of the capture in progress


class FakeGraph:
    """Runs nothing: keeps what was launched while it was captured and counts its replays."""

    def __init__(self) -> None:
        self.launches: list[str] = []
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1

    def pool(self) -> None:
        return None


@contextlib.contextmanager
def fake_capture(graph: FakeGraph, pool=None, stream=None):
    launched.clear()
    yield
    graph.launches = list(launched)


class FakeBackend:
    def __init__(self) -> None:
        self.captured: list[int] = []  # the sizes whose metadata a capture asked for

    def init_cuda_graph_state(self, max_bs: int) -> None:
        pass

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def init_forward_metadata_capture_cuda_graph(self, bs, *args) -> None:
        self.captured.append(bs)

    def init_forward_metadata_replay_cuda_graph(self, *args) -> None:
        pass


class TinyModel(torch.nn.Module):
    """One wrapped projection of the token embedding: logits."""

    def __init__(self, batch: LoRABatch) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.proj = LoRALinear(torch.nn.Linear(16, VOCAB), 16, [VOCAB], 2, 4, batch, torch.float32)

    def forward(self, input_ids, positions, forward_batch) -> torch.Tensor:
        return self.proj(self.embed(input_ids.clamp(min=0)))


def recording(name, fn):
    def run(*args, **kwargs):
        launched.append(name)
        return fn(*args, **kwargs)

    return run


@pytest.fixture
def runner():
    batch = LoRABatch(torch.device("cpu"), 8, 2)
    model = TinyModel(batch)
    with (
        mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph),
        mock.patch.object(torch.cuda, "graph", fake_capture),
        mock.patch.object(torch.cuda, "Stream", mock.MagicMock),
        mock.patch.object(torch.cuda, "stream", lambda s: contextlib.nullcontext()),
        mock.patch.object(torch.cuda, "synchronize", lambda *a: None),
        mock.patch.object(lora_kernels, "shrink", recording("shrink", lora_kernels.shrink)),
        mock.patch.object(lora_kernels, "expand", recording("expand", lora_kernels.expand)),
    ):
        yield cuda_graph_runner.CudaGraphRunner(
            model,
            FakeBackend(),
            ReqToTokenPool(size=10, max_context_len=32, device="cpu"),
            None,
            FutureTokens(8, torch.device("cpu")),
            max_bs=4,
            lora_batch=batch,
        )


def test_each_size_is_captured_with_and_without_the_lora_kernels(runner):
    assert sorted(runner.graphs) == sorted(runner.lora_graphs) == [1, 2, 4]
    for bs in runner.capture_bs:
        assert runner.lora_graphs[bs].launches == ["shrink", "expand"], bs
        assert runner.graphs[bs].launches == [], bs  # not one LoRA launch
        assert runner.outputs[bs][0] is not runner.lora_outputs[bs][0]
    # one attention metadata a size, read by both variants: a backend that builds new state a
    # call (FlashInfer's wrappers) would otherwise leave one variant on state no replay plans
    assert sorted(runner.backend.captured) == [1, 2, 4]


@pytest.mark.parametrize(
    "slots,adapters",
    [
        ([NO_ADAPTER] * 3, False),  # base rows only (padded to 4 with base rows)
        ([NO_ADAPTER, 1, NO_ADAPTER], True),  # one adapter row in a mixed batch
        ([0, 0, 1], True),
    ],
)
def test_a_replay_without_adapter_rows_takes_the_graph_without_lora(runner, slots, adapters):
    padded = runner.padded_size(len(slots))
    # as the model runner prepares a replayed step: its rows, then padding rows of the base
    runner.lora_batch.prepare(slots + [NO_ADAPTER] * (padded - len(slots)), [1] * padded)
    assert runner.uses_adapters() == adapters
    replayed = {False: runner.graphs[padded], True: runner.lora_graphs[padded]}
    before = {k: g.replays for k, g in replayed.items()}
    fb = runner._capture_batch(padded)
    logits, _ = runner.replay(fb, len(slots))
    assert replayed[adapters].replays == before[adapters] + 1
    assert replayed[not adapters].replays == before[not adapters]
    assert logits.shape == (len(slots), VOCAB)
    want = (runner.lora_outputs if adapters else runner.outputs)[padded][0]
    assert logits.data_ptr() == want.data_ptr()
