"""Draft-model proposer (`--speculative-method draft`): a small model with the target's
tokenizer proposes k tokens per request, greedily, one decode step at a time.

It runs on our own model runner (`ModelRunner`: its own request rows, KV pool and allocator,
and CUDA graphs for its decode steps on the GPU), sized by `--speculative-draft-max-tokens`.
Per request it keeps the draft KV of the tokens it has seen; a step first runs a pass over the
request's tokens it has not seen (its prompt at the first step, an extend; then the target's
bonus token and the last one, decode rows in a replayed graph), whose last logits give the
first proposal, then decodes the rest. The k passes are launched back to back, each reading
the tokens of the one before on the device, and the host reads the proposals once at the end.
After the verify step the KV of its rejected proposals is given back (`on_verified`), and a
finished request's row and KV go when the speculator lets go of it (`release`, applied at the
next step: a release may come from the garbage collector at any moment).

Greedy proposals are a point mass, which the verify step's acceptance rule needs
(speculative/verify.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.forward.mode import ForwardMode
from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.kernels.argmax import argmax
from radixserve.model_executor.future_tokens import FutureSlots
from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_loader.loader import load_model_source_for
from radixserve.server_args import ServerArgs
from radixserve.speculative.proposer import TokenHistory

# a step's unseen tokens per request up to which they run as decode rows (_catch_up): after
# the first step there are at most two (the target's bonus token and the last proposal)
CATCH_UP_ROWS = 4


@dataclass
class DraftRow:
    """One request's draft KV: its row of the draft's req_to_token, and how many tokens of its
    history have KV there; `base`: its history's length at the last proposal."""

    row: int
    kv_len: int = 0
    base: int = 0
    # proposals made and not yet verified (a step that dropped them never verifies them: their
    # KV goes at the next proposal)
    unverified: bool = False


@dataclass(frozen=True)
class Launched:
    """A draft pass in flight: its rows' greedy tokens (on the device), and the ring slots
    through which the next pass reads them before the host has."""

    ids: torch.Tensor
    future: FutureSlots


class DraftProposer:
    def __init__(self, server_args: ServerArgs, max_requests: int) -> None:
        args = dataclasses.replace(
            server_args,
            model=server_args.speculative_draft_model,
            speculative_method=None,
            speculative_draft_model=None,
            # the draft proposes with its own weights only: an adapter request's proposals are
            # the base draft's, which the target (with the adapter) verifies exactly
            lora_modules=None,
            lora_modules_file=None,
            max_loras=0,
            max_total_tokens=server_args.speculative_draft_max_tokens,
            max_running_requests=max_requests,
            # the target took its fraction of the device already: the draft's weights and pool
            # come out of the headroom it left, all but the last 5% of the device
            mem_fraction_static=0.95,
        )
        self.runner = ModelRunner(args, load_model_source_for(args))
        self.rows: dict[str, DraftRow] = {}
        self._released: list[str] = []

    def propose(
        self, rids: Sequence[str], histories: Sequence[TokenHistory], budgets: Sequence[int]
    ) -> list[list[int]]:
        self._apply_releases()
        chosen = [i for i, rid in enumerate(rids) if self._row(rid, len(histories[i])) is not None]
        need = sum(len(histories[i]) - self.rows[rids[i]].kv_len + budgets[i] - 1 for i in chosen)
        if not chosen or need > self.runner.allocator.available_size():
            return [[] for _ in rids]
        # every pass is launched before any is read: a pass names the tokens of the one before
        # by their ring slots (FutureTokens' placeholders), so the device runs the k passes back
        # to back and the host waits once, for all of them
        passes: list[tuple[Launched, list[int], list[int]]] = []  # (pass, requests, their rows)
        launched, rows = self._extend([rids[i] for i in chosen], [histories[i] for i in chosen])
        passes.append((launched, chosen, rows))
        for step in range(1, max(budgets[i] for i in chosen)):
            previous, requests, rows = passes[-1]
            row_of = dict(zip(requests, rows, strict=True))
            going = [i for i in chosen if budgets[i] > step]
            inputs = [previous.future.placeholder(row_of[i]) for i in going]
            passes.append(
                (self._decode([rids[i] for i in going], inputs), going, [*range(len(going))])
            )
        tokens = torch.cat([launched.ids for launched, _, _ in passes]).tolist()
        proposals: list[list[int]] = [[] for _ in rids]
        offset = 0
        for launched, requests, rows in passes:
            for i, row in zip(requests, rows, strict=True):
                proposals[i].append(tokens[offset + row])
            offset += launched.ids.numel()
        return proposals

    def _row(self, rid: str, length: int) -> DraftRow | None:
        """The request's draft row (a new one if free), its KV short of the last token."""
        state = self.rows.get(rid)
        if state is None:
            rows = self.runner.req_to_token_pool.alloc(1)
            if rows is None:
                return None
            state = self.rows[rid] = DraftRow(rows[0])
        if state.unverified:
            self._truncate(state, state.base)
            state.unverified = False
        if state.kv_len >= length:  # nothing new to extend over: recompute the last token
            self._truncate(state, length - 1)
        return state

    def _extend(self, rids: list[str], histories: list[TokenHistory]) -> tuple[Launched, list[int]]:
        """One pass over each request's unseen tokens; the row of the pass that holds the
        draft's next token for each."""
        states = [self.rows[rid] for rid in rids]
        new = [h.view()[s.kv_len :] for s, h in zip(states, histories, strict=True)]
        lens = [len(t) for t in new]
        prefix = [s.kv_len for s in states]
        for state, n, h in zip(states, lens, histories, strict=True):
            state.kv_len += n
            state.base = len(h)
            state.unverified = True
        if max(lens) <= CATCH_UP_ROWS:
            return self._catch_up(states, new, lens)
        slots = self.runner.allocator.alloc(sum(lens))
        self.runner.req_to_token_pool.write_batch(
            [s.row for s in states], prefix, list(slots.split(lens))
        )
        batch = ModelWorkerBatch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.from_numpy(np.concatenate(new).astype(np.int64)),
            req_pool_indices=torch.tensor([s.row for s in states], dtype=torch.int64),
            seq_lens=torch.tensor([s.kv_len for s in states], dtype=torch.int64),
            seq_lens_sum=sum(s.kv_len for s in states),
            out_cache_loc=slots,
            sampling_info=None,
            extend_seq_lens=lens,
            extend_prefix_lens=prefix,
        )
        return self._launch(batch), [*range(len(states))]

    def _catch_up(
        self, states: list[DraftRow], new: list[np.ndarray], lens: list[int]
    ) -> tuple[Launched, list[int]]:
        """The few unseen tokens of a step after the first (the target's bonus token and the
        last proposal) as a decode pass of one row per position, as the target's verify step
        runs (ScheduleBatch.prepare_for_verify): the row of position j attends to the KV up to
        j, which the rows before it store in the same pass. A decode pass replays the draft's
        CUDA graphs, where an extend would run eagerly, a launch per op of every layer: on a
        small draft model that eager pass cost more than the whole target step."""
        rows: list[int] = []
        cols: list[int] = []
        seq_lens: list[int] = []
        for state, n in zip(states, lens, strict=True):
            rows += [state.row] * n
            cols += range(state.kv_len - n, state.kv_len)
            seq_lens += range(state.kv_len - n + 1, state.kv_len + 1)
        slots = self.runner.allocator.alloc(len(rows))
        self.runner.req_to_token_pool.write_columns(rows, cols, slots, stored_by_pass=True)
        batch = ModelWorkerBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=torch.from_numpy(np.concatenate(new).astype(np.int64)),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            seq_lens_sum=sum(seq_lens),
            out_cache_loc=slots,
            sampling_info=None,
        )
        return self._launch(batch), [end - 1 for end in itertools.accumulate(lens)]

    def _decode(self, rids: list[str], inputs: list[int]) -> Launched:
        """One decode step of the given requests, fed their last proposals (placeholders of
        the pass before, still in flight)."""
        states = [self.rows[rid] for rid in rids]
        slots = self.runner.allocator.alloc(len(states))
        self.runner.req_to_token_pool.write_columns(
            [s.row for s in states], [s.kv_len for s in states], slots, stored_by_pass=True
        )
        for state in states:
            state.kv_len += 1
        batch = ModelWorkerBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=torch.tensor(inputs, dtype=torch.int64),
            req_pool_indices=torch.tensor([s.row for s in states], dtype=torch.int64),
            seq_lens=torch.tensor([s.kv_len for s in states], dtype=torch.int64),
            seq_lens_sum=sum(s.kv_len for s in states),
            out_cache_loc=slots,
            sampling_info=None,
            has_future_ids=True,
        )
        return self._launch(batch)

    @torch.inference_mode()
    def _launch(self, batch: ModelWorkerBatch) -> Launched:
        """Launch a pass; its rows' greedy tokens, on the device and in its ring slots."""
        runner = self.runner
        future = runner.future_tokens.reserve(len(batch.seq_lens))
        out = runner.forward(batch, future)
        if out.greedy_ids is not None:  # a replayed graph stored them in the ring already;
            return Launched(out.greedy_ids.clone(), future)  # its next replay overwrites these
        ids = argmax(out.logits)
        runner.future_tokens.store(future, ids)
        return Launched(ids, future)

    def on_verified(self, rid: str, proposed: int, accepted: int) -> None:
        """Keep the KV of the request's last token and its accepted proposals (the last
        proposal was never fed to the draft); give the rest back."""
        state = self.rows.get(rid)
        if state is not None and state.unverified:
            self._truncate(state, state.base + min(accepted, max(proposed - 1, 0)))
            state.unverified = False

    def release(self, rid: str) -> None:
        """The request is gone: its row and KV are freed at the next step."""
        self._released.append(rid)

    def _apply_releases(self) -> None:
        released, self._released = self._released, []
        for rid in released:
            state = self.rows.pop(rid, None)
            if state is not None:
                self._truncate(state, 0)
                self.runner.req_to_token_pool.free(state.row)

    def _truncate(self, state: DraftRow, kv_len: int) -> None:
        if kv_len < state.kv_len:
            row = self.runner.req_to_token_pool.read(state.row, state.kv_len)
            self.runner.allocator.free(row[kv_len:])
            state.kv_len = kv_len
