"""CudaGraphRunner: decode passes replayed from captured CUDA graphs.

A decode step of a small model is hundreds of tiny kernel launches; launching them costs more
than running them. Capturing each batch size once and replaying it removes the launch cost.
Batches are padded up to the next captured size: padded rows read and write KV slot 0 (reserved
for this) with the backend's fill sequence length, and their logits are dropped. All graphs share
one memory pool and one static input buffer, which a step fills with a single host-to-device
copy; tokens of a batch still in flight (overlap scheduling) are looked up inside the graph, and
the graph ends with the greedy choice of every row, stored into the row's future-token slot: a
batch of plain greedy rows needs no kernel after the replay but the copy of its tokens.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from radixserve.layers.argmax import argmax
from radixserve.managers.schedule_batch import ModelWorkerBatch
from radixserve.model_executor.forward_batch_info import (
    DECODE_INPUT_ROWS,
    ForwardBatch,
    ForwardMode,
)

if TYPE_CHECKING:
    from radixserve.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to max_bs (the architecture's list)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs]
    sizes += list(range(16, max_bs + 1, 8))
    if sizes[-1] != max_bs and max_bs > 8:
        sizes.append(max_bs)
    return sizes


class CudaGraphRunner:
    def __init__(self, model_runner: ModelRunner) -> None:
        self.runner = model_runner
        self.backend = model_runner.attn_backend
        self.capture_bs = capture_batch_sizes(
            min(model_runner.server_args.cuda_graph_max_bs, model_runner.max_running_requests)
        )
        self.max_bs = self.capture_bs[-1]
        self.fill = self.backend.get_cuda_graph_seq_len_fill_value()
        # one static buffer for every graph's inputs: a pass of size bs uses its first
        # DECODE_INPUT_ROWS * bs entries (see ForwardBatch.init_decode)
        self.staging = torch.zeros(
            DECODE_INPUT_ROWS * self.max_bs, dtype=torch.int64, device=model_runner.device
        )
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # logits, greedy ids
        self.backend.init_cuda_graph_state(self.max_bs)
        self.capture()

    def padded_size(self, bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, bs)]

    def load_inputs(self, batch: ModelWorkerBatch, future_start: int) -> ForwardBatch:
        """Copy a decode batch's inputs into the graphs' static buffer, padded to the next
        captured size."""
        return self._staged(batch, self.padded_size(len(batch.seq_lens)), future_start)

    def _capture_batch(self, bs: int) -> ForwardBatch:
        """A pass of `bs` padded rows only: what a capture runs, laid out as replays are."""
        empty = torch.empty(0, dtype=torch.int64)
        return self._staged(
            ModelWorkerBatch(ForwardMode.DECODE, empty, empty, empty, 0, empty, None), bs, 0
        )

    def _staged(self, batch: ModelWorkerBatch, size: int, future_start: int) -> ForwardBatch:
        runner = self.runner
        return ForwardBatch.init_decode(
            batch,
            runner.req_to_token_pool,
            runner.token_to_kv_pool,
            self.backend,
            runner.device,
            future_start,
            staging=self.staging,
            padded_size=size,
            seq_len_fill=self.fill,
        )

    def _run_model(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        runner = self.runner
        logits = runner.model(runner.resolve_future_ids(fb.input_ids), fb.positions, fb)
        assert fb.future_slots is not None
        return logits, argmax(logits, scatter_to=(runner.future_token_ids, fb.future_slots))

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        # largest first, so smaller graphs fit in the memory the largest one reserved
        for bs in reversed(self.capture_bs):
            fb = self._capture_batch(bs)
            self.backend.init_forward_metadata_capture_cuda_graph(
                bs, fb.req_pool_indices, fb.seq_lens, ForwardMode.DECODE
            )
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: autotuning and lazy init stay out of the graph
                    self._run_model(fb)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = self._run_model(fb)
            pool = graph.pool()
            self.graphs[bs] = graph
            self.outputs[bs] = out
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.capture_bs)

    def can_run(self, batch: ModelWorkerBatch) -> bool:
        return batch.forward_mode.is_decode() and len(batch.seq_lens) <= self.max_bs

    def replay(self, forward_batch: ForwardBatch, raw_bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the graph of `forward_batch` (from `load_inputs`); logits and greedy ids of the
        first `raw_bs` rows (the rest are padding)."""
        bs = forward_batch.batch_size
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            forward_batch.seq_lens_sum,
            forward_batch.seq_lens_cpu,
        )
        self.graphs[bs].replay()
        logits, greedy_ids = self.outputs[bs]
        return logits[:raw_bs], greedy_ids[:raw_bs]
