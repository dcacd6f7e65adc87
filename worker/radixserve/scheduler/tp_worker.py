"""ModelWorker: launches one ModelWorkerBatch on the device and resolves its sampled tokens later.

`launch` only enqueues work (forward, sampling, a non-blocking copy of the tokens to the host)
and returns at once, so the scheduler can prepare the next batch while the device runs this one
(overlap scheduling). Tokens a later batch needs before the host has them are future tokens
(model_executor/future_tokens.py): the pending result tells the scheduler, per row, the
placeholder input id that stands for the row's token until it is resolved.

A batch with constrained rows launches only its forward: a row's mask depends on the row's
previous token, which under overlap is still on its way to the host. The scheduler calls
`sample_deferred` once it has resolved that token, and the device runs the forward meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.distributed.parallel_state import broadcast_from_first
from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.metrics.startup import StartupPhases
from radixserve.model_executor.future_tokens import FutureSlots
from radixserve.model_executor.model_runner import ForwardOutput, ModelRunner
from radixserve.model_loader.loader import ModelSource
from radixserve.server_args import ServerArgs
from radixserve.speculative.verify import verify


@dataclass
class GenerationBatchResult:
    next_token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None
    # a verify step: per row, the tokens it emits (the kept proposals and the target's next),
    # and their logprobs when asked for; next_token_ids is then each row's first token
    verified: list[list[int]] | None = None
    verified_logprobs: list[list[float]] | None = None
    verified_top_logprobs: list[list[list[tuple[int, float]]]] | None = None
    # an embed or rerank model's pass: its rows' pooled outputs (model_executor/pooler.py), on
    # the host, float32
    pooled: torch.Tensor | None = None


class PendingBatchResult:
    """The device-side outcome of a launched batch; `resolve()` is the step's one host sync.

    Its tokens are set (`set_tokens`) when its sampling is launched: at launch, or for a batch
    with constrained rows (`awaits_sampling`) by `ModelWorker.sample_deferred`."""

    def __init__(self, future: FutureSlots, started: torch.cuda.Event | None = None) -> None:
        self.future = future  # row i's token is named by future.placeholder(i) until resolved
        self.started = started
        self.done: torch.cuda.Event | None = None
        self._ids: torch.Tensor | None = None
        self._logprobs: torch.Tensor | None = None
        self._top_logprobs: list[list[tuple[int, float]]] | None = None
        self._num_accepted: torch.Tensor | None = None  # a verify step's, per row
        self._verified_top: list[list[list[tuple[int, float]]]] | None = None
        # a verify step's proposals per request (ModelWorkerBatch.verify_draft_lens), and its
        # input ids on the host (the acceptance's layout; constrained rows' grammars walk them)
        self.verify_draft_lens: list[int] | None = None
        self.verify_inputs: list[int] | None = None
        self._pooled: torch.Tensor | None = None
        # the forward's output (its batch's sampling info with it), kept until the deferred
        # sampling launches
        self.deferred: ForwardOutput | None = None

    @property
    def awaits_sampling(self) -> bool:
        return self.deferred is not None

    def set_tokens(
        self,
        next_token_ids: torch.Tensor,
        logprobs: torch.Tensor | None,
        top_logprobs: list[list[tuple[int, float]]] | None,
        pooled: torch.Tensor | None = None,
    ) -> None:
        """Queue the copy of the sampled tokens (or of a pooling pass's outputs) to the host
        and mark the batch's end."""
        pinned = next_token_ids.device.type == "cuda"
        self._pooled = pooled.to("cpu", non_blocking=pinned) if pooled is not None else None
        self._ids = next_token_ids.to("cpu", non_blocking=pinned)
        self._logprobs = logprobs.to("cpu", non_blocking=pinned) if logprobs is not None else None
        self._top_logprobs = top_logprobs
        self.done = torch.cuda.Event(enable_timing=True) if pinned else None
        if self.done is not None:
            self.done.record()

    def set_verified(
        self,
        tokens: torch.Tensor,
        num_accepted: torch.Tensor,
        logprobs: torch.Tensor | None,
        top_logprobs: list[list[list[tuple[int, float]]]] | None,
    ) -> None:
        """A verify step's outcome (speculative/verify.py): `[bs, K + 1]` tokens and logprobs,
        `[bs]` proposals kept."""
        pinned = tokens.device.type == "cuda"
        self._num_accepted = num_accepted.to("cpu", non_blocking=pinned)
        self._verified_top = top_logprobs
        self.set_tokens(tokens, logprobs, None)

    def resolve(self) -> GenerationBatchResult:
        assert self._ids is not None, "the batch's sampling was never launched"
        if self.done is not None:
            self.done.synchronize()
        if self._num_accepted is not None:
            return self._resolve_verified()
        return GenerationBatchResult(
            next_token_ids=self._ids.tolist(),
            logprobs=self._logprobs.tolist() if self._logprobs is not None else None,
            top_logprobs=self._top_logprobs,
            pooled=self._pooled,
        )

    def _resolve_verified(self) -> GenerationBatchResult:
        counts = [m + 1 for m in self._num_accepted.tolist()]
        tokens = [row[:n] for row, n in zip(self._ids.tolist(), counts, strict=True)]
        logprobs = top = None
        if self._logprobs is not None:
            logprobs = [row[:n] for row, n in zip(self._logprobs.tolist(), counts, strict=True)]
        if self._verified_top is not None:
            top = [row[:n] for row, n in zip(self._verified_top, counts, strict=True)]
        return GenerationBatchResult(
            next_token_ids=[row[0] for row in tokens],
            logprobs=None,
            top_logprobs=None,
            verified=tokens,
            verified_logprobs=logprobs,
            verified_top_logprobs=top,
        )


LONGEST_GAPS = 5  # the longest gaps before each mode's batches that the timeline keeps


class GpuTimeline:
    """Where the device's time went, from events it records as it reaches them: busy = inside a
    batch, gap = between one batch's end and the next one's start while work was queued. The
    decode_ pair counts only decode batches that follow a decode batch: steady-state decoding,
    where overlap must hide all host work (a prefill's admission may not). By mode (the forward
    mode's metric label: prefill, decode, mixed, verify): each mode's busy time and tokens (its
    compute rate), and the gaps before its batches (which host work the device waited for)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self.decode_busy_ms = 0.0
        self.decode_gap_ms = 0.0
        self.busy_ms_by_mode: dict[str, float] = {}
        self.gap_ms_before_mode: dict[str, float] = {}
        self.tokens_by_mode: dict[str, int] = {}
        # how many gaps came before each mode's batches, and the longest few: a few long ones
        # (a kernel compiled mid-run, a blocking host call) and many short ones (host work not
        # overlapped) are different faults with the same total
        self.gap_count_before_mode: dict[str, int] = {}
        self.longest_gaps_ms_before_mode: dict[str, list[float]] = {}
        self._last_done: torch.cuda.Event | None = None
        self._last_was_decode = False

    def add(self, pending: PendingBatchResult, mode: str, tokens: int = 0) -> None:
        """Add a resolved batch of `mode` that ran `tokens` tokens (call in launch order)."""
        if pending.started is None or pending.done is None:
            return
        decode = mode == "decode"
        busy = pending.started.elapsed_time(pending.done)
        self.busy_ms_by_mode[mode] = self.busy_ms_by_mode.get(mode, 0.0) + busy
        self.tokens_by_mode[mode] = self.tokens_by_mode.get(mode, 0) + tokens
        if self._last_done is not None:
            gap = self._last_done.elapsed_time(pending.started)
            self.gap_ms_before_mode[mode] = self.gap_ms_before_mode.get(mode, 0.0) + gap
            self.gap_count_before_mode[mode] = self.gap_count_before_mode.get(mode, 0) + 1
            longest = self.longest_gaps_ms_before_mode.setdefault(mode, [])
            longest.append(gap)
            longest.sort(reverse=True)
            del longest[LONGEST_GAPS:]
            if decode and self._last_was_decode:
                self.decode_busy_ms += busy
                self.decode_gap_ms += gap
        self._last_done = pending.done
        self._last_was_decode = decode

    @property
    def busy_ms(self) -> float:
        return sum(self.busy_ms_by_mode.values())

    @property
    def gap_ms(self) -> float:
        return sum(self.gap_ms_before_mode.values())

    def mark_idle(self) -> None:
        """Nothing is queued: the time until the next launch is not a scheduling gap."""
        self._last_done = None


class ModelWorker:
    """The scheduler's model worker (the `BatchWorker` it programs against): the model runner's
    memory to allocate from, and `launch`."""

    def __init__(
        self, server_args: ServerArgs, source: ModelSource, startup: StartupPhases | None = None
    ) -> None:
        runner = ModelRunner(server_args, source, startup)
        self.model_runner = runner
        self.req_to_token_pool = runner.req_to_token_pool
        self.allocator = runner.allocator
        self.max_total_tokens = runner.max_total_tokens
        self.max_running_requests = runner.max_running_requests
        self.kv_pool = runner.token_to_kv_pool
        self.lora = runner.lora
        self.device = runner.device
        # a CUDA device runs launched work while the host goes on; the CPU runs it in launch
        self.asynchronous = runner.device.type == "cuda"
        self.timeline = GpuTimeline()

    def describe(self) -> dict[str, str]:
        runner = self.model_runner
        return {
            "device": runner.device.type,
            "dtype": str(runner.dtype).removeprefix("torch."),
            "attention_backend": runner.attention_backend_name,
            "quantization": runner.quantization.describe() if runner.quantization else "none",
            "kv_cache_dtype": str(runner.kv_dtype).removeprefix("torch."),
        }

    @torch.inference_mode()
    def launch(self, batch: ModelWorkerBatch) -> PendingBatchResult:
        runner = self.model_runner
        started = None
        if runner.device.type == "cuda":
            started = torch.cuda.Event(enable_timing=True)
            started.record()
        future = runner.future_tokens.reserve(len(batch.seq_lens))
        if runner.pooler is not None:
            # an embed or rerank model: pooled outputs, no tokens (the rows end with this pass)
            pending = PendingBatchResult(future, started)
            pooled = runner.pool(batch, future)
            no_tokens = torch.zeros(len(batch.seq_lens), dtype=torch.int64, device=runner.device)
            pending.set_tokens(no_tokens, None, None, pooled)
            return pending
        out = runner.forward(batch, future)
        pending = PendingBatchResult(future, started)
        info = batch.sampling_info
        if batch.verify_draft_lens is not None:
            pending.verify_draft_lens = batch.verify_draft_lens
            pending.verify_inputs = batch.input_ids.tolist()
            if info.has_grammars:
                pending.deferred = out
            else:
                self._verify(out, pending)
            return pending
        if out.greedy_ids is not None and info.is_plain_greedy and not batch.return_logprob:
            # the graph picked these and put them in the ring; identical on every rank (the
            # logits are), so there is nothing to sample, broadcast or store
            info.update_with_new_tokens(out.greedy_ids)
            pending.set_tokens(out.greedy_ids, None, None)
        elif info.has_grammars:
            pending.deferred = out
        else:
            self._sample(out, pending)
        return pending

    @torch.inference_mode()
    def sample_deferred(self, pending: PendingBatchResult) -> None:
        """Sample a batch launched with constrained rows, now that each row's grammar has
        accepted the row's tokens so far: the rows' masks are filled on the host and applied on
        the device with the batch's other logit processors."""
        assert pending.deferred is not None
        out, pending.deferred = pending.deferred, None
        out.forward_batch.sampling_info.update_grammar_mask()
        if pending.verify_draft_lens is not None:
            self._verify(out, pending)
        else:
            self._sample(out, pending)

    def _verify(self, out: ForwardOutput, pending: PendingBatchResult) -> None:
        """Accept a verify step's proposals (speculative/verify.py); rank 0's outcome is every
        rank's, as sampled tokens are. A graph-replayed step of plain greedy rows hands over
        the argmax it took of every row."""
        batch = out.forward_batch
        info = batch.sampling_info
        result = verify(
            out.logits,
            pending.verify_inputs,
            pending.verify_draft_lens,
            info,
            batch.return_logprob,
            batch.top_logprobs_nums,
            greedy_ids=out.greedy_ids if info.is_plain_greedy else None,
        )
        broadcast_from_first(result.tokens)
        broadcast_from_first(result.num_accepted)
        info.update_with_new_tokens(result.tokens, result.num_accepted + 1)
        pending.set_verified(
            result.tokens, result.num_accepted, result.logprobs, result.top_logprobs
        )

    def _sample(self, out: ForwardOutput, pending: PendingBatchResult) -> None:
        runner = self.model_runner
        sampled = runner.sample(out.logits, out.forward_batch)
        # ranks sample from identical logits, but unseeded requests draw different noise on
        # each rank: rank 0's choice is everyone's, or the ranks' KV caches would drift
        broadcast_from_first(sampled.next_token_ids)
        runner.future_tokens.store(pending.future, sampled.next_token_ids)
        out.forward_batch.sampling_info.update_with_new_tokens(sampled.next_token_ids)
        pending.set_tokens(sampled.next_token_ids, sampled.logprobs, sampled.top_logprobs)

    def forward_batch_generation(self, batch: ModelWorkerBatch) -> GenerationBatchResult:
        """Launch and wait: the synchronous path."""
        pending = self.launch(batch)
        if pending.awaits_sampling:
            self.sample_deferred(pending)
        return pending.resolve()
