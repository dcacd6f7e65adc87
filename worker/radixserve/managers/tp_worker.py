"""ModelWorker: launches one ModelWorkerBatch on the device and resolves its sampled tokens later.

`launch` only enqueues work (forward, sampling, a non-blocking copy of the tokens to the host)
and returns at once, so the scheduler can prepare the next batch while the device runs this one
(overlap scheduling). Tokens a later batch needs before the host has them are "future" tokens:
each launched row writes its token into `future_token_ids` on the device, and the next batch
names it by a negative id that `ModelRunner` resolves on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.distributed.parallel_state import broadcast_from_first
from radixserve.managers.schedule_batch import ModelWorkerBatch
from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_loader.loader import ModelSource
from radixserve.server_args import ServerArgs


@dataclass
class GenerationBatchResult:
    next_token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None


class PendingBatchResult:
    """The device-side outcome of a launched batch; `resolve()` is the step's one host sync."""

    def __init__(
        self,
        next_token_ids: torch.Tensor,
        logprobs: torch.Tensor | None,
        top_logprobs: list[list[tuple[int, float]]] | None,
        future_slot_start: int,
        started: torch.cuda.Event | None = None,
    ) -> None:
        self.future_slot_start = future_slot_start
        self.started = started
        self._top_logprobs = top_logprobs
        pinned = next_token_ids.device.type == "cuda"
        self._ids = next_token_ids.to("cpu", non_blocking=pinned)
        self._logprobs = logprobs.to("cpu", non_blocking=pinned) if logprobs is not None else None
        self.done = torch.cuda.Event(enable_timing=True) if pinned else None
        if self.done is not None:
            self.done.record()

    def resolve(self) -> GenerationBatchResult:
        if self.done is not None:
            self.done.synchronize()
        return GenerationBatchResult(
            next_token_ids=self._ids.tolist(),
            logprobs=self._logprobs.tolist() if self._logprobs is not None else None,
            top_logprobs=self._top_logprobs,
        )


class GpuTimeline:
    """Where the device's time went, from events it records as it reaches them: busy = inside a
    batch, gap = between one batch's end and the next one's start while work was queued. The
    decode_ pair counts only decode batches that follow a decode batch: steady-state decoding,
    where overlap must hide all host work (a prefill's admission may not)."""

    def __init__(self) -> None:
        self.busy_ms = 0.0
        self.gap_ms = 0.0
        self.decode_busy_ms = 0.0
        self.decode_gap_ms = 0.0
        self._last_done: torch.cuda.Event | None = None
        self._last_was_decode = False

    def add(self, pending: PendingBatchResult, decode: bool) -> None:
        """Add a resolved batch (call in launch order)."""
        if pending.started is None or pending.done is None:
            return
        busy = pending.started.elapsed_time(pending.done)
        self.busy_ms += busy
        if self._last_done is not None:
            gap = self._last_done.elapsed_time(pending.started)
            self.gap_ms += gap
            if decode and self._last_was_decode:
                self.decode_busy_ms += busy
                self.decode_gap_ms += gap
        self._last_done = pending.done
        self._last_was_decode = decode

    def mark_idle(self) -> None:
        """Nothing is queued: the time until the next launch is not a scheduling gap."""
        self._last_done = None


class ModelWorker:
    def __init__(self, server_args: ServerArgs, source: ModelSource) -> None:
        self.model_runner = ModelRunner(server_args, source)
        self.timeline = GpuTimeline()

    @torch.inference_mode()
    def launch(self, batch: ModelWorkerBatch) -> PendingBatchResult:
        runner = self.model_runner
        started = None
        if runner.device.type == "cuda":
            started = torch.cuda.Event(enable_timing=True)
            started.record()
        start = runner.reserve_future_slots(len(batch.seq_lens))
        out = runner.forward(batch, start)
        info = batch.sampling_info
        if out.greedy_ids is not None and info.is_plain_greedy and not batch.return_logprob:
            # the graph picked these and put them in the ring; identical on every rank (the
            # logits are), so there is nothing to sample, broadcast or store
            next_token_ids, logprobs, top_logprobs = out.greedy_ids, None, None
        else:
            sampled = runner.sample(out.logits, out.forward_batch)
            next_token_ids = sampled.next_token_ids
            logprobs, top_logprobs = sampled.logprobs, sampled.top_logprobs
            # ranks sample from identical logits, but unseeded requests draw different noise
            # on each rank: rank 0's choice is everyone's, or the ranks' KV caches would drift
            broadcast_from_first(next_token_ids)
            runner.store_future_ids(next_token_ids, start)
        info.update_with_new_tokens(next_token_ids)
        return PendingBatchResult(next_token_ids, logprobs, top_logprobs, start, started)

    def forward_batch_generation(self, batch: ModelWorkerBatch) -> GenerationBatchResult:
        """Launch and wait: the synchronous path."""
        return self.launch(batch).resolve()
