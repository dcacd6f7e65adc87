"""A request that breaks scheduler code working for it alone ends alone, with an internal error.

Driven through the real policy with the fake worker (scheduler_harness.py): a poisoned request
(a sampling parameter no tensor can hold, a stop check that raises, a chunk that cannot be
built) beside normal ones. The poisoned one finishes with `{"type": "error", "message":
"internal error: ..."}` and no `param` (a 500 at the front end); the others get their reference
outputs; every KV slot, request row and prefix lock comes back.
"""

from __future__ import annotations

import logging

import pytest
from scheduler_harness import (
    assert_memory_returned,
    drain,
    expected_output,
    make_scheduler,
    prompt,
    submit,
)

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.frontend.http_server import as_api_error
from radixserve.frontend.tokenizer_manager import GenerationError
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler import schedule_batch
from radixserve.scheduler.schedule_batch import Req
from radixserve.scheduler.scheduler import Scheduler, internal_error

MODES = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "overlap"])


def submit_poison(scheduler: Scheduler, rid: str, ids: list[int], max_new_tokens: int) -> None:
    """top_k = 2**63 passes no front end's verify, but here it reaches the batch: torch cannot
    hold it in the int64 top-k column (SamplingBatchInfo.from_reqs raises)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    params.top_k = 2**63
    scheduler.dispatch(TokenizedGenerateReqInput(rid, ids, params, stream=True))


def assert_internal_error(reason: dict, exception_name: str) -> None:
    assert reason["type"] == "error"
    assert "param" not in reason
    assert reason["message"].startswith(f"internal error: {exception_name}")


def assert_flushed_clean(scheduler: Scheduler) -> None:
    assert_memory_returned(scheduler)
    assert scheduler.flush_cache()
    worker = scheduler.worker
    assert worker.allocator.available_size() == worker.max_total_tokens
    assert scheduler.reqs_by_rid == {}


@MODES
def test_a_sampling_parameter_no_tensor_holds_ends_that_request_alone(asynchronous, caplog):
    scheduler = make_scheduler(asynchronous=asynchronous)
    prompts = {f"r{i}": prompt(i, 6 + 5 * i) for i in range(4)}
    submit(scheduler, "r0", prompts["r0"], 8)
    submit(scheduler, "r1", prompts["r1"], 8)
    submit_poison(scheduler, "poison", prompt(99, 12), 8)
    submit(scheduler, "r2", prompts["r2"], 8)
    submit(scheduler, "r3", prompts["r3"], 8)
    with caplog.at_level(logging.ERROR, logger="radixserve.scheduler.scheduler"):
        run = drain(scheduler)
    assert_internal_error(run.finish["poison"], "ValueError")
    assert not run.outputs.get("poison")
    for rid, ids in prompts.items():
        assert run.outputs[rid] == expected_output(ids, 8), rid
        assert run.finish[rid]["type"] == "length"
    # the four others ran together in one prefill pass, the poisoned one in none
    extends = [b for b in scheduler.worker.batches if b.forward_mode.is_extend()]
    assert len(extends) == 1 and len(extends[0].extend_seq_lens) == 4
    failures = [r for r in caplog.records if "poison" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None  # the traceback, once
    assert_flushed_clean(scheduler)


@MODES
def test_a_poisoned_request_sharing_a_cached_prefix_leaves_no_lock(asynchronous):
    """Admission locked the shared prefix for every request of the failed batch: all of those
    locks are undone, the survivors' are taken again, and all are released at the end."""
    scheduler = make_scheduler(asynchronous=asynchronous)
    shared = prompt(7, 40)
    submit(scheduler, "warm", shared + [5], 1)
    drain(scheduler)
    submit(scheduler, "a", shared + [11, 12], 6)
    submit_poison(scheduler, "poison", shared + [13, 14], 6)
    submit(scheduler, "b", shared + [15, 16], 6)
    run = drain(scheduler)
    assert_internal_error(run.finish["poison"], "ValueError")
    assert run.outputs["a"] == expected_output(shared + [11, 12], 6)
    assert run.outputs["b"] == expected_output(shared + [15, 16], 6)
    assert run.cached["a"] == run.cached["b"] == 40
    assert scheduler.tree_cache.protected_size() == 0
    assert_flushed_clean(scheduler)


@MODES
def test_a_stop_check_that_raises_ends_that_running_request_alone(asynchronous, monkeypatch):
    """Output processing: the request's stop check raises at its fifth token, mid-decode in a
    running batch; the batch goes on without it and its KV is freed."""
    check_finished = Req.check_finished

    def poisoned(self, context_len, tokenizer):
        if self.rid == "poison" and len(self.output_ids) == 5:
            raise KeyError("a stop check that breaks")
        return check_finished(self, context_len, tokenizer)

    monkeypatch.setattr(Req, "check_finished", poisoned)
    scheduler = make_scheduler(asynchronous=asynchronous)
    prompts = {f"r{i}": prompt(i, 10 + i) for i in range(3)}
    for rid, ids in prompts.items():
        submit(scheduler, rid, ids, 20)
    poison_prompt = prompt(50, 9)
    submit(scheduler, "poison", poison_prompt, 20)
    run = drain(scheduler)
    assert_internal_error(run.finish["poison"], "KeyError")
    # what it streamed before is right; nothing follows the error
    assert run.outputs["poison"] == expected_output(poison_prompt, 20)[: len(run.outputs["poison"])]
    assert len(run.outputs["poison"]) <= 5
    for rid, ids in prompts.items():
        assert run.outputs[rid] == expected_output(ids, 20), rid
    assert_flushed_clean(scheduler)


@MODES
def test_a_chunk_that_cannot_be_built_ends_the_chunked_request(asynchronous, monkeypatch):
    """The long prompt's second chunk fails to build: its first chunk's KV and its row go back
    (as an abort mid-prompt does) and the short requests beside it run."""
    from_reqs = schedule_batch.SamplingBatchInfo.from_reqs

    def poisoned(reqs, *args, **kwargs):
        if any(r.rid == "long" and len(r.prefix_indices) > 0 for r in reqs):
            raise RuntimeError("the second chunk breaks\nsecond line not shown")
        return from_reqs(reqs, *args, **kwargs)

    monkeypatch.setattr(schedule_batch.SamplingBatchInfo, "from_reqs", poisoned)
    scheduler = make_scheduler(
        asynchronous=asynchronous, chunked_prefill_size=32, max_prefill_tokens=32
    )
    submit(scheduler, "long", prompt(1, 100), 4)
    short = {f"s{i}": prompt(10 + i, 6) for i in range(3)}
    for rid, ids in short.items():
        submit(scheduler, rid, ids, 4)
    run = drain(scheduler)
    assert run.finish["long"] == {
        "type": "error",
        "message": "internal error: RuntimeError: the second chunk breaks",
    }
    assert scheduler.chunked_req is None
    for rid, ids in short.items():
        assert run.outputs[rid] == expected_output(ids, 4), rid
    assert_flushed_clean(scheduler)


def test_a_request_that_cannot_be_taken_in_is_refused_alone(monkeypatch):
    validate = Scheduler._validate

    def poisoned(self, req):
        if req.rid == "poison":
            raise TypeError("cannot take it in")
        return validate(self, req)

    monkeypatch.setattr(Scheduler, "_validate", poisoned)
    scheduler = make_scheduler()
    submit(scheduler, "a", prompt(1, 8), 3)
    submit(scheduler, "poison", prompt(2, 8), 3)
    submit(scheduler, "b", prompt(3, 8), 3)
    run = drain(scheduler)
    assert run.finish["poison"] == {
        "type": "error",
        "message": "internal error: TypeError: cannot take it in",
    }
    assert run.outputs["a"] == expected_output(prompt(1, 8), 3)
    assert run.outputs["b"] == expected_output(prompt(3, 8), 3)
    assert_flushed_clean(scheduler)


def test_a_failure_no_single_request_causes_still_raises(monkeypatch):
    """Each request builds alone; only the batch of them fails: not one request's fault, so the
    scheduler does not guess and the error propagates (the process fails loudly)."""
    from_reqs = schedule_batch.SamplingBatchInfo.from_reqs

    def fails_in_pairs(reqs, *args, **kwargs):
        if len(reqs) >= 2:
            raise RuntimeError("a batch-wide failure")
        return from_reqs(reqs, *args, **kwargs)

    monkeypatch.setattr(schedule_batch.SamplingBatchInfo, "from_reqs", fails_in_pairs)
    scheduler = make_scheduler()
    submit(scheduler, "a", prompt(1, 8), 3)
    submit(scheduler, "b", prompt(2, 8), 3)
    with pytest.raises(RuntimeError, match="batch-wide"):
        scheduler.step()
    assert scheduler.tree_cache.protected_size() == 0


def test_an_internal_error_is_a_500_in_openai_shape_at_the_front_end():
    """No `param`: the front end raises GenerationError (not a 400 naming a parameter), which
    is a 500 server_error whose message names the internal error."""
    reason = internal_error(OverflowError("Python int too large to convert to C long"))
    assert reason == {
        "type": "error",
        "message": "internal error: OverflowError: Python int too large to convert to C long",
    }
    error = as_api_error(GenerationError(reason["message"]))
    assert error.status == 500
    body = error.body()["error"]
    assert body["type"] == "server_error"
    assert body["message"] == reason["message"]
