"""CudaGraphRunner: decode passes replayed from captured CUDA graphs.

A decode step of a small model is hundreds of tiny kernel launches; launching them costs more
than running them. Capturing each batch size once and replaying it removes the launch cost.
Batches are padded up to the next captured size: padded rows read and write KV slot 0 (reserved
for this) with the backend's fill sequence length, and their logits are dropped. All graphs share
one memory pool and one static input buffer, which a step fills with a single host-to-device
copy; tokens of a batch still in flight (overlap scheduling) are looked up inside the graph, and
the graph ends with the greedy choice of every row, stored into the row's future-token slot: a
batch of plain greedy rows needs no kernel after the replay but the copy of its tokens.

With LoRA adapters each size is captured twice: with the adapters' kernels (they read each
replay's slots from fixed buffers) and without any (the wrapped projections skip them when the
`LoRABatch` is inactive at capture). A step whose rows all use the base model replays the
second, so base traffic on a LoRA server costs what it costs on a server without LoRA (the
kernels' launches were ~0.6 ms of a batch-1 step of an 8B model, H200). The cost is a second
capture per size and a second set of graph outputs (float32 logits `[bs, vocab]`: 1.2 GB over
the default sizes up to 256 with Llama-3's vocabulary); the activations of both share the pool.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from radixserve.forward.forward_batch import ForwardBatch
from radixserve.forward.mode import ForwardMode
from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.model_executor.forward_inputs import DECODE_INPUT_ROWS, build_decode_batch
from radixserve.model_executor.future_tokens import NO_SLOTS, FutureSlots

if TYPE_CHECKING:
    from radixserve.layers.attention.base import AttentionBackend
    from radixserve.layers.lora_linear import LoRABatch
    from radixserve.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixserve.model_executor.future_tokens import FutureTokens

logger = logging.getLogger(__name__)


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, steps of 8 up to 64, then steps of 16 up to max_bs (the architecture's
    list). Each size costs a warm-up pass and a capture at start (tens of ms each for an 8B
    model); above 64 rows a decode step still reads every weight once, so the padding of the
    coarser steps costs little, and 23 sizes instead of 35 take a second off a start."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs]
    sizes += list(range(16, min(max_bs, 64) + 1, 8)) + list(range(80, max_bs + 1, 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class CudaGraphRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: TokenToKVPool,
        future_tokens: FutureTokens,
        max_bs: int,
        lora_batch: LoRABatch | None = None,
    ) -> None:
        self.model = model
        # with LoRA adapters: the graphs read each replay's adapter slots from its fixed
        # buffers (the model runner fills them before the replay); a step without adapter
        # rows replays the graphs captured without the LoRA kernels
        self.lora_batch = lora_batch
        self.backend = backend
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.future_tokens = future_tokens
        self.device = req_to_token_pool.device
        self.capture_bs = capture_batch_sizes(max_bs)
        self.max_bs = self.capture_bs[-1]
        self.fill = self.backend.get_cuda_graph_seq_len_fill_value()
        # one static buffer for every graph's inputs: a pass of size bs uses its first
        # DECODE_INPUT_ROWS * bs entries (see forward_inputs.build_decode_batch)
        self.staging = torch.zeros(
            DECODE_INPUT_ROWS * self.max_bs, dtype=torch.int64, device=self.device
        )
        # by size: the graphs without LoRA kernels (a server without LoRA has only these) and
        # their outputs (logits, greedy ids); with LoRA, those with the kernels beside them
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.lora_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.lora_outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.backend.init_cuda_graph_state(self.max_bs)
        self.capture()

    def padded_size(self, bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, bs)]

    def load_inputs(self, batch: ModelWorkerBatch, future: FutureSlots) -> ForwardBatch:
        """Copy a decode batch's inputs into the graphs' static buffer, padded to the next
        captured size."""
        return self._staged(batch, self.padded_size(len(batch.seq_lens)), future)

    def _capture_batch(self, bs: int) -> ForwardBatch:
        """A pass of `bs` padded rows only: what a capture runs, laid out as replays are."""
        empty = torch.empty(0, dtype=torch.int64)
        nothing = ModelWorkerBatch(ForwardMode.DECODE, empty, empty, empty, 0, empty, None)
        return self._staged(nothing, bs, NO_SLOTS)

    def _staged(self, batch: ModelWorkerBatch, size: int, future: FutureSlots) -> ForwardBatch:
        return build_decode_batch(
            batch,
            self.req_to_token_pool,
            self.token_to_kv_pool,
            self.backend,
            self.device,
            future,
            staging=self.staging,
            padded_size=size,
            seq_len_fill=self.fill,
        )

    def _run_model(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(self.future_tokens.resolve(fb.input_ids), fb.positions, fb)
        assert fb.future_slots is not None
        return logits, self.future_tokens.store_greedy(logits, fb.future_slots)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        # largest first, so smaller graphs fit in the memory the largest one reserved
        for bs in reversed(self.capture_bs):
            fb = self._capture_batch(bs)
            # once a size: both variants read the same attention metadata, which each replay
            # refills (FlashInfer's capture makes new wrappers a call: a second call would leave
            # the first variant's graph reading wrappers that replays no longer plan)
            self.backend.init_forward_metadata_capture_cuda_graph(
                bs, fb.req_pool_indices, fb.seq_lens, ForwardMode.DECODE
            )
            for adapters in (True, False) if self.lora_batch is not None else (False,):
                if self.lora_batch is not None:  # the wrappers read `active` as they capture
                    self.lora_batch.prepare([-1] * bs, [1] * bs, always=adapters)
                with torch.cuda.stream(stream):  # one warm-up pass: Triton's compiles and
                    self._run_model(fb)  # autotuning, cuBLAS's lazy loads stay out of the graph
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = self._run_model(fb)
                pool = graph.pool()
                (self.lora_graphs if adapters else self.graphs)[bs] = graph
                (self.lora_outputs if adapters else self.outputs)[bs] = out
        torch.cuda.synchronize()
        if self.lora_batch is None:
            logger.info("captured CUDA graphs for decode batch sizes %s", self.capture_bs)
        else:
            second = sum(t.nbytes for out in self.outputs.values() for t in out)
            logger.info(
                "captured CUDA graphs for decode batch sizes %s, each with and without the LoRA "
                "kernels (the second set's outputs: %.0f MiB)",
                self.capture_bs,
                second / 2**20,
            )

    def uses_adapters(self) -> bool:
        """Whether the next replay takes the graphs with the LoRA kernels: some row of the step
        (prepared in the `LoRABatch` before the replay) uses an adapter."""
        return self.lora_batch is not None and self.lora_batch.active

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
        adapters = self.uses_adapters()
        (self.lora_graphs if adapters else self.graphs)[bs].replay()
        logits, greedy_ids = (self.lora_outputs if adapters else self.outputs)[bs]
        return logits[:raw_bs], greedy_ids[:raw_bs]
