"""CudaGraphRunner: decode passes replayed from captured CUDA graphs.

A decode step of a small model is hundreds of tiny kernel launches; launching them costs more
than running them. Capturing each batch size once and replaying it removes the launch cost.
Batches are padded up to the next captured size: padded rows read and write KV slot 0 (reserved
for this) with the backend's fill sequence length, and their logits are dropped. All graphs share
one memory pool and one set of static input buffers.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from radixserve.model_executor.forward_batch_info import ForwardBatch, ForwardMode

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
        device = model_runner.device
        i64 = {"dtype": torch.int64, "device": device}
        self.input_ids = torch.zeros(self.max_bs, **i64)
        self.positions = torch.zeros(self.max_bs, **i64)
        self.req_pool_indices = torch.zeros(self.max_bs, **i64)
        self.seq_lens = torch.full((self.max_bs,), self.fill, **i64)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.fill, dtype=torch.int64)
        self.out_cache_loc = torch.zeros(self.max_bs, **i64)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.backend.init_cuda_graph_state(self.max_bs)
        self.capture()

    def _forward_batch(self, bs: int) -> ForwardBatch:
        runner = self.runner
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_sum=int(self.seq_lens_cpu[:bs].sum()),
            out_cache_loc=self.out_cache_loc[:bs],
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=self.backend,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        model = self.runner.model
        # largest first, so smaller graphs fit in the memory the largest one reserved
        for bs in reversed(self.capture_bs):
            fb = self._forward_batch(bs)
            self.backend.init_forward_metadata_capture_cuda_graph(
                bs, fb.req_pool_indices, fb.seq_lens, ForwardMode.DECODE
            )
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: autotuning and lazy init stay out of the graph
                    model(fb.input_ids, fb.positions, fb)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = model(fb.input_ids, fb.positions, fb)
            pool = graph.pool()
            self.graphs[bs] = graph
            self.outputs[bs] = out
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.capture_bs)

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode.is_decode() and forward_batch.batch_size <= self.max_bs

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            # padded rows: slot 0, fill length, request row 0 (never read beyond the fill)
            self.seq_lens[raw_bs:bs].fill_(self.fill)
            self.seq_lens_cpu[raw_bs:bs].fill_(self.fill)
            self.out_cache_loc[raw_bs:bs].zero_()
            self.req_pool_indices[raw_bs:bs].zero_()
            self.input_ids[raw_bs:bs].zero_()
            self.positions[raw_bs:bs].zero_()
        self.input_ids[:raw_bs].copy_(forward_batch.input_ids)
        self.positions[:raw_bs].copy_(forward_batch.positions)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)
        self.out_cache_loc[:raw_bs].copy_(forward_batch.out_cache_loc)
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs,
            self.req_pool_indices[:bs],
            self.seq_lens[:bs],
            forward_batch.seq_lens_sum + (bs - raw_bs) * self.fill,
            self.seq_lens_cpu[:bs],
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
