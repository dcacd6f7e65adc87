"""`--min-admission-batch`: a saturated scheduler admits waiting requests in passes of several,
not one prefill pass per freed slot, waits no more steps than the slots it waits for, and
generates the same tokens as admitting at once."""

from __future__ import annotations

import random

from engine_harness import make_scheduler, run_to_completion

from radixserve.model_loader.loader import load_model_source
from radixserve.sampling.sampling_params import SamplingParams

MODEL = "random:tiny-llama"


def admissions(min_batch: int, output_lens: list[int], max_running: int = 32):
    """Run requests of these output lengths (prompts 20-60 tokens, greedy) on a scheduler of
    `max_running` slots; returns (the requests' tokens, the prefill passes in step order as
    (step, requests admitted, requests running before it, waiting before it))."""
    rng = random.Random(3)
    prompts = [[rng.randrange(10, 200) for _ in range(rng.randint(20, 60))] for _ in output_lens]
    params = [
        SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in output_lens
    ]
    source = load_model_source(MODEL, device="cpu", dtype="float32")
    scheduler = make_scheduler(
        MODEL,
        source,
        max_running_requests=max_running,
        min_admission_batch=min_batch,
        max_total_tokens=20000,
    )
    passes: list[tuple[int, int, int, int]] = []
    form = scheduler.get_new_batch_prefill
    steps = [0]

    def recording():
        running, waiting = len(scheduler.running_batch), len(scheduler.waiting_queue)
        batch = form()
        steps[0] += 1
        if batch is not None:
            passes.append((steps[0], len(batch.reqs), running, waiting))
        return batch

    scheduler.get_new_batch_prefill = recording
    results = run_to_completion(scheduler, prompts, params)
    return {rid: r["ids"] for rid, r in results.items()}, passes


def staggered(n: int) -> list[int]:
    """Output lengths that end a request or two at a time once the batch is full."""
    return [8 + (i * 7) % 41 for i in range(n)]


def test_a_saturated_scheduler_admits_several_at_a_time_with_the_same_tokens():
    lens = staggered(120)
    batched, passes = admissions(8, lens)
    eager, eager_passes = admissions(1, lens)
    assert batched == eager  # greedy tokens do not depend on when a request was admitted
    # saturated (the queue longer than the free slots): admitting at once takes a pass for
    # each slot or two that frees; waiting takes passes of at least 8 unless its wait ran out
    saturated = [p for p in passes[1:] if p[3] > 32 - p[2]]
    eager_saturated = [p for p in eager_passes[1:] if p[3] > 32 - p[2]]
    assert sum(1 for p in eager_saturated if p[1] <= 2) > 10
    assert len(saturated) < len(eager_saturated) / 2
    assert sum(1 for p in saturated if p[1] >= 8) >= len(saturated) * 3 // 4


def test_a_waiting_request_waits_no_more_steps_than_the_slots_it_waits_for():
    # 32 long requests hold every slot; one short one frees a slot at its end, the rest only
    # much later: the queued request runs within 8 steps of that, not when 8 slots are free
    lens = [200] * 31 + [4] + [10] * 5
    _, passes = admissions(8, lens)
    first, later = passes[0], passes[1]
    assert first[1] == 32
    assert later[0] - first[0] <= 4 + 8 + 3  # the short one's 4 tokens, the wait, overlap


def test_an_unsaturated_scheduler_admits_at_once():
    # fewer requests waiting than free slots: nothing to wait for
    _, passes = admissions(8, [30] * 20 + [5] * 4, max_running=32)
    assert len(passes) == 1 and passes[0][1] == 24
