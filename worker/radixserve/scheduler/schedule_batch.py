"""`Req` and `ScheduleBatch`: the scheduler's side of the three batch layers.

`Req` is one request's CPU state for its whole life in the scheduler. `ScheduleBatch` is the
scheduler-owned batch: it allocates request rows and KV slots, evicts from the prefix cache when
slots run short, and retracts requests when a decode step cannot get memory. It hands the model
side a `ModelWorkerBatch` (forward/worker_batch.py): CPU tensors built fresh for each pass.
It writes the host mirror of req_to_token only; the device table is the model runner's to
write (see ReqToTokenPool).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from radixserve.boundary import PoolingParams, TokenLogprob
from radixserve.forward.mode import ForwardMode
from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.mem_cache.base_prefix_cache import adapter_key
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixserve.constrained.base_grammar_backend import CompiledGrammar, Grammar
    from radixserve.mem_cache.allocator import TokenSlotAllocator
    from radixserve.mem_cache.base_prefix_cache import BasePrefixCache
    from radixserve.mem_cache.memory_pool import ReqToTokenPool

EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)
NO_LORA_SLOT = -1  # the base model's rows (layers/lora_linear.NO_ADAPTER)


class Req:
    """One generation request inside the scheduler."""

    def __init__(
        self,
        rid: str,
        origin_input_ids: list[int],
        sampling_params: SamplingParams,
        *,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        stream: bool = False,
        arrival_time: float | None = None,
        eos_token_ids: frozenset[int] = frozenset(),
        pooling: PoolingParams | None = None,
        lora_name: str | None = None,
        lora_uid: int = 0,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.sampling_params = sampling_params
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        self.stream = stream
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.eos_token_ids = eos_token_ids

        self.output_ids: list[int] = []
        # Tokens whose KV this request must hold after the next extend (prompt + output so far).
        self.fill_ids: list[int] = []
        self.prefix_indices: torch.Tensor = EMPTY_SLOTS
        self.last_node: Any = None
        self.req_pool_idx: int | None = None
        self.kv_len = 0  # leading tokens of origin+output whose KV slots are in our row
        self.extend_input_len = 0  # tokens computed by the current extend pass
        self.finished_reason: dict[str, Any] | None = None
        self.cached_tokens = 0  # prompt tokens served from the prefix cache (first admission)
        # KV tiers: matched tokens a lower tier holds (admission restores them), and the prompt
        # tokens restored from each tier ("host", "disk")
        self.restorable_tokens = 0
        self.restored_tokens: dict[str, int] = {}
        self.first_scheduled_time: float | None = None
        self.queue_time_sent = False
        self.sent_len = 0  # output_ids already sent to the front end
        self.pending_logprobs: list[TokenLogprob] = []
        self.num_retractions = 0
        # while a launched batch's token for this request is unresolved (overlap): the input
        # id that stands for it (model_executor/future_tokens.py)
        self.future_id: int | None = None
        # constrained decoding: the compile of the request's grammar until it is admitted, then
        # its matcher, which has accepted every token in output_ids
        self.grammar_future: Future[CompiledGrammar] | None = None
        self.grammar: Grammar | None = None
        # an embed or rerank request: its pooled output (a running sum under mean pooling) on
        # the host, then its embedding or score (scheduler._finish_pooling)
        self.pooling = pooling
        self.pooled: torch.Tensor | None = None
        # a LoRA adapter's request: its name, its registration number (the prefix cache's
        # namespace: 0 is the base model's) and, from admission to its end, its device slot
        self.lora_name = lora_name
        self.lora_uid = lora_uid
        self.lora_slot = NO_LORA_SLOT

    # -- state -------------------------------------------------------------------------------
    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def init_next_round_input(self, tree_cache: BasePrefixCache) -> None:
        """Match the longest cached prefix of prompt+output; at least one token stays to compute
        (its logits give the next token)."""
        self.fill_ids = self.origin_input_ids + self.output_ids
        match = tree_cache.match_prefix(adapter_key(self.fill_ids[:-1], self.lora_uid))
        self.prefix_indices, self.last_node = match.indices, match.last_node
        self.restorable_tokens = match.restorable
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def reset_for_retract(self) -> None:
        self.prefix_indices = EMPTY_SLOTS
        self.last_node = None
        self.req_pool_idx = None
        self.kv_len = 0
        self.extend_input_len = 0
        self.num_retractions += 1

    # -- stopping ----------------------------------------------------------------------------
    def check_finished(self, context_len: int, tokenizer: Any) -> None:
        if self.finished_reason is not None:
            return
        if self.grammar is not None and self.grammar.is_terminated():
            # the grammar ended on a stop token it allowed, even at max_new_tokens or with
            # ignore_eos: nothing more can follow
            self.finished_reason = {"type": "stop", "matched": self.output_ids[-1]}
            return
        params = self.sampling_params
        if len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = {"type": "length"}
            return
        if not self.output_ids:
            return
        last = self.output_ids[-1]
        if last in params.stop_token_ids or (not params.ignore_eos and last in self.eos_token_ids):
            self.finished_reason = {"type": "stop", "matched": last}
            return
        if params.stop and tokenizer is not None:
            longest = max(len(s) for s in params.stop)
            # every token decodes to at least one character except special ones: a tail of
            # `longest + 2` tokens always holds a just-completed stop string
            tail = tokenizer.decode(self.output_ids[-(longest + 2) :])
            for stop in params.stop:
                if stop in tail:
                    self.finished_reason = {"type": "stop", "matched": stop}
                    return
        if self.seqlen >= context_len:
            self.finished_reason = {"type": "length"}


class OutOfSlots(RuntimeError):
    """Raised when KV slots or request rows cannot be found even after eviction; the admission
    accounting should make this unreachable, so it signals a scheduler bug."""


class ScheduleBatch:
    def __init__(
        self,
        reqs: list[Req],
        req_to_token_pool: ReqToTokenPool,
        allocator: TokenSlotAllocator,
        tree_cache: BasePrefixCache,
        vocab_size: int,
        device: str | torch.device,
        eos_token_ids: set[int],
    ) -> None:
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.vocab_size = vocab_size
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.forward_mode = ForwardMode.IDLE
        self.sampling_info: SamplingBatchInfo | None = None
        # per-pass tensors, rebuilt by prepare_for_extend / prepare_for_decode
        self.input_ids = EMPTY_SLOTS
        self.out_cache_loc = EMPTY_SLOTS
        self.extend_lens: list[int] = []
        self.prefix_lens: list[int] = []

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def return_logprob(self) -> bool:
        return any(r.return_logprob for r in self.reqs)

    # -- memory ------------------------------------------------------------------------------
    def alloc_token_slots(self, n: int) -> torch.Tensor:
        slots = self.allocator.alloc(n)
        if slots is None:
            self.tree_cache.evict(n - self.allocator.available_size())
            slots = self.allocator.alloc(n)
        if slots is None:
            raise OutOfSlots(
                f"need {n} KV slots, {self.allocator.available_size()} free and "
                f"{self.tree_cache.evictable_size()} evictable"
            )
        return slots

    # -- extend ------------------------------------------------------------------------------
    def prepare_for_extend(self) -> None:
        """Allocate rows and slots for each request's new tokens and build the pass inputs.

        Each request's `extend_input_len` (possibly truncated to a chunk) was set by admission.
        """
        self.build_extend_inputs()
        self.allocate_for_extend()

    def build_extend_inputs(self) -> None:
        """The pass inputs that come from the requests alone (token ids, the sampling state
        from their parameters), built before anything is allocated: a request whose own
        parameters cannot be turned into tensors fails here, with nothing to undo."""
        self.forward_mode = ForwardMode.EXTEND
        input_ids: list[int] = []
        for req in self.reqs:
            prefix_len = len(req.prefix_indices)
            input_ids.extend(req.fill_ids[prefix_len : prefix_len + req.extend_input_len])
        self.input_ids = torch.tensor(input_ids, dtype=torch.int64)
        self.extend_lens = [r.extend_input_len for r in self.reqs]
        self.prefix_lens = [len(r.prefix_indices) for r in self.reqs]
        self.sampling_info = SamplingBatchInfo.from_reqs(
            self.reqs, self.vocab_size, self.device, self.eos_token_ids
        )

    def allocate_for_extend(self) -> None:
        """Rows and KV slots for the new tokens `build_extend_inputs` laid out, recorded in
        the host mirror of req_to_token."""
        new_rows = [r for r in self.reqs if r.req_pool_idx is None]
        if new_rows:
            rows = self.req_to_token_pool.alloc(len(new_rows))
            if rows is None:
                raise OutOfSlots("no free request rows")
            for req, row in zip(new_rows, rows, strict=True):
                req.req_pool_idx = row
        slots = self.alloc_token_slots(sum(r.extend_input_len for r in self.reqs))

        starts, chunks = [], []
        offset = 0
        now = time.time()
        for req in self.reqs:
            prefix_len = len(req.prefix_indices)
            ext = req.extend_input_len
            req_slots = slots[offset : offset + ext]
            offset += ext
            # rewrite the whole row head: the prefix may have moved into the tree's slots
            starts.append(0)
            chunks.append(torch.cat([req.prefix_indices, req_slots]) if prefix_len else req_slots)
            req.kv_len = prefix_len + ext
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
        self.req_to_token_pool.write_batch([r.req_pool_idx for r in self.reqs], starts, chunks)
        self.out_cache_loc = slots

    def mix_with_running(self, running: ScheduleBatch) -> None:
        """Fold a decode step of `running` into this extend pass (MIXED): each decode request
        becomes a length-1 extend over its cached tokens."""
        running.prepare_for_decode(in_extend_pass=True)
        self.forward_mode = ForwardMode.MIXED
        self.input_ids = torch.cat([self.input_ids, running.input_ids])
        self.out_cache_loc = torch.cat([self.out_cache_loc, running.out_cache_loc])
        self.extend_lens += [1] * len(running)
        self.prefix_lens += [r.kv_len - 1 for r in running.reqs]
        self.reqs = self.reqs + running.reqs
        self.sampling_info.merge_batch(running.sampling_info)

    # -- decode ------------------------------------------------------------------------------
    def decode_slots_short(self) -> int:
        """How many slots the next decode step lacks even after evicting every unlocked leaf."""
        need = len(self.reqs)
        have = self.allocator.available_size() + self.tree_cache.evictable_size()
        return max(0, need - have)

    def retract_decode(self) -> list[Req]:
        """Free requests (fewest generated tokens first, then longest prompts) until the next
        decode step fits; they go back to the waiting queue and resume by re-prefill. One
        request always stays: if it alone does not fit, the scheduler ends it."""
        order = sorted(
            range(len(self.reqs)),
            key=lambda i: (len(self.reqs[i].output_ids), -len(self.reqs[i].origin_input_ids)),
        )
        gone: set[int] = set()
        for idx in order:
            remaining = len(self.reqs) - len(gone)
            have = self.allocator.available_size() + self.tree_cache.evictable_size()
            if remaining <= have or remaining <= 1:
                break
            req = self.reqs[idx]
            self.tree_cache.release_req(req)
            req.reset_for_retract()
            gone.add(idx)
        retracted = [self.reqs[i] for i in sorted(gone)]
        self.filter_batch([i for i in range(len(self.reqs)) if i not in gone])
        return retracted

    def prepare_for_decode(self, in_extend_pass: bool = False) -> None:
        """One new token per request: its slot allocated and recorded in req_to_token. A decode
        pass stores these cells on the device from its own packed inputs
        (forward_inputs.build_decode_batch), so they are not queued for the device, unless
        `in_extend_pass`: the step rides in an extend-shaped pass (mix_with_running), which
        applies queued writes like any other."""
        self.forward_mode = ForwardMode.DECODE
        self.input_ids = torch.tensor(
            [r.output_ids[-1] if r.future_id is None else r.future_id for r in self.reqs],
            dtype=torch.int64,
        )
        slots = self.alloc_token_slots(len(self.reqs))
        self.req_to_token_pool.write_columns(
            [r.req_pool_idx for r in self.reqs],
            [r.kv_len for r in self.reqs],
            slots,
            stored_by_pass=not in_extend_pass,
        )
        for req in self.reqs:
            req.kv_len += 1
        self.out_cache_loc = slots
        self.extend_lens, self.prefix_lens = [], []

    def prepare_for_verify(self, drafts: list[list[int]]) -> None:
        """A verify step (speculative decoding): each request's last token and its proposed
        tokens `drafts[i]`, with KV slots for all of them. It runs as a decode pass over
        k_i + 1 rows per request (`get_model_worker_batch`): the row of position j attends to
        the request's KV up to j, which the rows before it store in the same pass, so the
        decode kernels and CUDA graphs serve it unchanged. The scheduler gives back the slots
        of the proposals the step rejects."""
        self.forward_mode = ForwardMode.VERIFY
        lens = [1 + len(d) for d in drafts]
        ids: list[int] = []
        rows: list[int] = []
        cols: list[int] = []
        for req, draft, n in zip(self.reqs, drafts, lens, strict=True):
            assert req.future_id is None, "a verify step needs its requests' tokens on the host"
            ids += [req.output_ids[-1], *draft]
            rows += [req.req_pool_idx] * n
            cols += range(req.kv_len, req.kv_len + n)
        self.input_ids = torch.tensor(ids, dtype=torch.int64)
        slots = self.alloc_token_slots(len(ids))
        self.req_to_token_pool.write_columns(rows, cols, slots, stored_by_pass=True)
        for req, n in zip(self.reqs, lens, strict=True):
            req.kv_len += n
        self.out_cache_loc = slots
        self.extend_lens, self.prefix_lens = lens, []

    def _verify_worker_batch(self, with_lora: bool) -> ModelWorkerBatch:
        """The verify step as the decode pass `prepare_for_verify` describes: one row per
        position, on its request's row of req_to_token, its length up to that position (and
        its request's LoRA slot)."""
        rows: list[int] = []
        seq_lens: list[int] = []
        lora_slots: list[int] = []
        for req, n in zip(self.reqs, self.extend_lens, strict=True):
            rows += [req.req_pool_idx] * n
            seq_lens += range(req.kv_len - n + 1, req.kv_len + 1)
            lora_slots += [req.lora_slot] * n
        return ModelWorkerBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=self.input_ids,
            req_pool_indices=torch.tensor(rows, dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            seq_lens_sum=sum(seq_lens),
            out_cache_loc=self.out_cache_loc,
            sampling_info=self.sampling_info,
            return_logprob=self.return_logprob,
            top_logprobs_nums=[r.top_logprobs_num for r in self.reqs],
            verify_draft_lens=[n - 1 for n in self.extend_lens],
            lora_slots=lora_slots if with_lora else None,
        )

    # -- membership --------------------------------------------------------------------------
    def filter_batch(self, keep_indices: list[int]) -> None:
        if len(keep_indices) == len(self.reqs):
            return
        self.reqs = [self.reqs[i] for i in keep_indices]
        if self.sampling_info is not None:
            self.sampling_info.filter_batch(keep_indices)

    def merge_batch(self, other: ScheduleBatch) -> None:
        if self.sampling_info is None or not self.reqs:
            self.sampling_info = other.sampling_info
        else:
            self.sampling_info.merge_batch(other.sampling_info)
        self.reqs = self.reqs + other.reqs

    # -- hand-off ----------------------------------------------------------------------------
    def get_model_worker_batch(self, with_lora: bool = False) -> ModelWorkerBatch:
        """`with_lora`: LoRA adapters are served, and the pass needs each row's slot."""
        seq_lens = [r.kv_len for r in self.reqs]
        if self.forward_mode.is_verify():
            return self._verify_worker_batch(with_lora)
        extend = self.forward_mode.is_extend()
        return ModelWorkerBatch(
            forward_mode=self.forward_mode,
            input_ids=self.input_ids,
            req_pool_indices=torch.tensor([r.req_pool_idx for r in self.reqs], dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            seq_lens_sum=sum(seq_lens),
            out_cache_loc=self.out_cache_loc,
            sampling_info=self.sampling_info,
            extend_seq_lens=list(self.extend_lens) if extend else None,
            extend_prefix_lens=list(self.prefix_lens) if extend else None,
            return_logprob=self.return_logprob,
            top_logprobs_nums=[r.top_logprobs_num for r in self.reqs],
            has_future_ids=any(r.future_id is not None for r in self.reqs),
            lora_slots=[r.lora_slot for r in self.reqs] if with_lora else None,
        )
