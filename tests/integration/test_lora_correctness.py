"""Many LoRA adapters on one base model, against PEFT on the same weights (CPU, float32): a tiny
random Llama and three random adapters of ranks 4, 8 and 16 (lora_B non-zero); greedy output
token-identical to PEFT's for each adapter and the base, one at a time and all mixed in one
batch, after a dynamic load, after an unload and reload; the prefix cache never serves one
adapter's KV to another; and the refusals of bad adapters."""

from __future__ import annotations

import json
import threading
from unittest import mock

import pytest
from engine_harness import greedy, make_scheduler, random_prompts, run_to_completion
from lora_adapters import ADAPTERS, peft_greedy, save_adapter

from radixserve.boundary import LoRAAdapterReq, TokenizedGenerateReqInput
from radixserve.kernels import lora as lora_kernels
from radixserve.lora import manager as lora_manager
from radixserve.model_loader.loader import build_hf_reference, load_model_source

pytest.importorskip("peft")
NEW = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    source = load_model_source("random:tiny-llama", device="cpu")
    hf = build_hf_reference(source)
    root = tmp_path_factory.mktemp("loras")
    dirs = {
        name: save_adapter(hf, root / name, rank, alpha, targets, seed)
        for seed, (name, rank, alpha, targets) in enumerate(ADAPTERS)
    }
    prompts = random_prompts(4, source.config.vocab_size, 5, 30, seed=7)
    expected = {
        name: [peft_greedy(hf, path, p, NEW) for p in prompts]
        for name, path in [(None, None), *dirs.items()]
    }
    return source, hf, dirs, prompts, expected


def run_any(scheduler, jobs: list[tuple[str | None, list[int]]]) -> tuple[list, list]:
    """Submit every (adapter, prompt) at once, step until idle (waiting, not spinning, while
    only adapter reads are pending); each request's tokens and finished reason."""
    prompts = [prompt for _, prompt in jobs]
    names = [name for name, _ in jobs]
    results = run_to_completion(scheduler, prompts, greedy(NEW), lora_names=names)
    rids = [f"r{i}" for i in range(len(jobs))]
    return [results[r]["ids"] for r in rids], [results[r]["finish"] for r in rids]


def run(scheduler, jobs: list[tuple[str | None, list[int]]]) -> list[list[int]]:
    """As `run_any` where every request must end by its length: the tokens of each."""
    ids, reasons = run_any(scheduler, jobs)
    assert all(reason["type"] == "length" for reason in reasons), reasons
    return ids


def lora_scheduler(source, dirs, **kw):
    modules = [f"{name}={path}" for name, path in dirs.items()]
    return make_scheduler("random:tiny-llama", source, lora_modules=modules or None, **kw)


def test_each_adapter_alone_and_all_mixed_match_peft(setup):
    source, _, dirs, prompts, expected = setup
    scheduler = lora_scheduler(source, dirs, max_loras=3)
    # PEFT's outputs differ between adapters: the check below could fail
    assert len({tuple(expected[n][0]) for n in expected}) == len(expected)
    for name in expected:
        for prompt, want in zip(prompts, expected[name], strict=True):
            assert run(scheduler, [(name, prompt)]) == [want], name
    # every adapter and the base in one batch, two prompts each, interleaved
    jobs = [(name, p) for p in prompts[:2] for name in expected]
    got = run(lora_scheduler(source, dirs, max_loras=3, disable_radix_cache=True), jobs)
    assert got == [expected[name][prompts.index(p)] for name, p in jobs]


def test_base_rows_alone_run_no_lora_product_and_a_mixed_batch_matches_peft(setup):
    """On a LoRA server a batch whose rows all use the base model runs no LoRA product (the
    eager path here; tests/unit/test_lora_graph_choice.py and tests/gpu the graphs), and a
    mixed batch after it runs them and matches PEFT."""
    source, _, dirs, prompts, expected = setup
    scheduler = lora_scheduler(source, dirs, max_loras=3)
    calls = []

    def counted(fn):
        def run_kernel(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)

        return run_kernel

    with (
        mock.patch.object(lora_kernels, "shrink", counted(lora_kernels.shrink)),
        mock.patch.object(lora_kernels, "expand", counted(lora_kernels.expand)),
    ):
        base_jobs = [(None, p) for p in prompts]
        assert run(scheduler, base_jobs) == expected[None]
        assert calls == []
        name = next(iter(dirs))
        jobs = [(None, prompts[0]), (name, prompts[1])]
        assert run(scheduler, jobs) == [expected[None][0], expected[name][1]]
        assert "shrink" in calls and "expand" in calls


def test_more_adapters_than_slots_wait_and_stay_correct(setup):
    """Three adapters over one device slot: requests wait for the slot (never evicting an
    adapter in use), and each gets its own adapter's output."""
    source, _, dirs, prompts, expected = setup
    scheduler = lora_scheduler(source, dirs, max_loras=1, max_cpu_loras=3)
    jobs = [(name, prompts[0]) for name in dirs] * 2
    assert run(scheduler, jobs) == [expected[name][0] for name, _ in jobs]
    assert scheduler.lora.counters.evictions >= 2


def test_dynamic_load_unload_reload(setup):
    source, _, dirs, prompts, expected = setup
    scheduler = lora_scheduler(source, {}, max_loras=2)
    # the admin endpoint's path: read off the step loop, answered by pop_replies
    assert scheduler.dispatch(LoRAAdapterReq("beta", str(dirs["beta"]), req_id="x")) is None
    replies = []
    while not replies:
        scheduler.step()
        replies = scheduler.pop_replies()
    (reply,) = replies
    assert reply.success and reply.adapters == {"beta": str(dirs["beta"])} and reply.req_id == "x"
    assert run(scheduler, [("beta", prompts[1]), (None, prompts[1])]) == [
        expected["beta"][1],
        expected[None][1],
    ]
    assert scheduler.change_lora_adapters(LoRAAdapterReq("beta")).success
    assert not scheduler.change_lora_adapters(LoRAAdapterReq("beta")).success  # not loaded any more
    scheduler.handle_generate_request(
        TokenizedGenerateReqInput(
            rid="gone", input_ids=prompts[1], sampling_params=greedy(2), lora_name="beta"
        )
    )
    (out,) = scheduler.pop_outputs()
    assert out.finished_reason["type"] == "error" and "beta" in out.finished_reason["message"]
    # the same name, now another adapter's weights: the old prefix KV is not reused
    assert scheduler.change_lora_adapters(LoRAAdapterReq("beta", str(dirs["gamma"]))).success
    assert run(scheduler, [("beta", prompts[1])]) == [expected["gamma"][1]]
    assert scheduler.change_lora_adapters(LoRAAdapterReq("beta", str(dirs["beta"]))).success
    assert run(scheduler, [("beta", prompts[2])]) == [expected["beta"][2]]


def test_lazy_adapters_are_known_unread_and_match_peft_on_first_use(setup, tmp_path):
    """--lora-load lazy (placement onDemand): the listed adapters are served by name with
    nothing read; each first request reads its adapter off the step loop and its output is
    PEFT's; a listed adapter whose source is bad fails its own request with a 400-shaped error
    (param model) and nothing else; an admin load only registers the path."""
    source, _, dirs, prompts, expected = setup
    listed = {**{name: str(path) for name, path in dirs.items()}, "broken": str(tmp_path / "x")}
    scheduler = lora_scheduler(source, listed, max_loras=1, max_cpu_loras=1, lora_load="lazy")
    lora = scheduler.lora
    assert lora.served() == listed and lora.counters.loads == 0 and not lora.host
    for name in dirs:
        assert run(scheduler, [(name, prompts[0]), (None, prompts[1])]) == [
            expected[name][0],
            expected[None][1],
        ]
        assert len(lora.host) <= 1 and lora.resident() == [name]
    assert lora.counters.loads == len(dirs)
    ids, reasons = run_any(scheduler, [("broken", prompts[2]), ("alpha", prompts[2])])
    assert ids[1] == expected["alpha"][2] and reasons[1]["type"] == "length"
    assert ids[0] == [] and reasons[0]["type"] == "error" and reasons[0]["param"] == "model"
    assert reasons[0]["code"] == "lora_load_failed" and "'broken'" in reasons[0]["message"]
    reply = scheduler.change_lora_adapters(LoRAAdapterReq("late", str(dirs["beta"])))
    assert reply.success and reply.adapters["late"] == str(dirs["beta"])
    loads = lora.counters.loads
    assert "late" not in lora.host and lora.counters.loads == loads
    assert run(scheduler, [("late", prompts[3])]) == [expected["beta"][3]]


def test_while_only_an_adapter_read_is_pending_the_loop_waits_for_it(setup):
    """A request whose adapter is being read, and nothing else: the scheduler says it waits in
    the background (the process loop then polls instead of spinning, which would also hold the
    GIL the reading thread needs), `wait_in_background` returns when the read ends, and a
    runnable request beside the waiting one means the loop runs again."""
    source, _, dirs, prompts, expected = setup
    scheduler = lora_scheduler(source, dirs, max_loras=1, lora_load="lazy")
    gate = threading.Event()
    read = lora_manager.read_adapter

    def gated_read(*args, **kwargs):
        gate.wait(timeout=60)
        return read(*args, **kwargs)

    with mock.patch.object(lora_manager, "read_adapter", gated_read):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid="a", input_ids=prompts[0], sampling_params=greedy(NEW), lora_name="alpha"
            )
        )
        assert not scheduler.step() and scheduler.has_work()
        assert scheduler.waiting_only_in_background()
        scheduler.wait_in_background(timeout=0.05)  # the read is gated: it returns by time
        assert not scheduler.lora.reading["alpha"].done()
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid="b", input_ids=prompts[1], sampling_params=greedy(NEW), lora_name=None
            )
        )
        assert not scheduler.waiting_only_in_background()  # the base request can run
        gate.set()
        scheduler.wait_in_background(timeout=60)
        assert scheduler.lora.reading["alpha"].done()
        results = run_to_completion(scheduler, [], greedy(NEW))
    assert results["a"]["ids"] == expected["alpha"][0] and results["b"]["ids"] == expected[None][1]


def test_prefix_cache_is_per_adapter(setup):
    """The same prompt under the base, alpha and beta: each its own output, and no prefix
    reused across them (hit counters per adapter); a second request of alpha reuses alpha's."""
    source, _, dirs, prompts, expected = setup
    scheduler = lora_scheduler(source, dirs, max_loras=3)
    prompt = prompts[3]
    for name in (None, "alpha", "beta"):
        assert run(scheduler, [(name, prompt)]) == [expected[name][3]]
    hits = scheduler.lora.counters.prefix_hit_tokens
    assert hits == {"": 0, "alpha": 0, "beta": 0}
    assert run(scheduler, [("alpha", prompt)]) == [expected["alpha"][3]]
    assert hits["alpha"] == len(prompt) - 1 and hits["beta"] == 0 and hits[""] == 0
    # the metrics report carries the same, per adapter, as deltas
    report = scheduler.pop_stats().lora
    assert report["prefix_hit_tokens"] == {"": 0, "alpha": len(prompt) - 1, "beta": 0}
    assert report["requests"] == {"alpha": 2, "beta": 1}
    assert report["generated_tokens"] == {"alpha": 2 * NEW, "beta": NEW}
    assert scheduler.pop_stats().lora["requests"] == {}


def test_the_metrics_report_lists_running_and_waiting_adapters(setup):
    """What radixserve_lora_requests_info shows: with one slot, gamma runs while alpha and beta
    wait for it."""
    source, _, dirs, prompts, _ = setup
    scheduler = lora_scheduler(source, dirs, max_loras=1)
    for i, name in enumerate(["gamma", "alpha", "beta", None]):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid=f"m{i}", input_ids=prompts[0], sampling_params=greedy(NEW), lora_name=name
            )
        )
    scheduler.step()
    report = scheduler.pop_stats().lora
    assert report["running"] == ["gamma"] and report["waiting"] == ["alpha", "beta"]
    assert report["max_lora"] == 1
    while scheduler.has_work():
        scheduler.step()


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("rank", "exceeds --max-lora-rank"),
        ("target", "not in this model"),
        ("shape", "trained for another model"),
        ("missing", "not found"),
        ("corrupt", "not a readable safetensors"),
    ],
)
def test_bad_adapters_are_refused_and_disturb_nothing(setup, tmp_path, breakage, message):
    source, hf, dirs, prompts, expected = setup
    scheduler = lora_scheduler(source, {"alpha": dirs["alpha"]}, max_loras=2, max_lora_rank=8)
    bad = tmp_path / "bad"
    if breakage == "rank":
        save_adapter(hf, bad, 16, 16, ["q_proj"], seed=9)
    else:
        save_adapter(hf, bad, 4, 8, ["q_proj"], seed=9)
    config_file, weights = bad / "adapter_config.json", bad / "adapter_model.safetensors"
    if breakage == "target":
        config = json.loads(config_file.read_text())
        config["target_modules"] = ["q_proj", "lm_head_typo"]
        config_file.write_text(json.dumps(config))
    elif breakage == "shape":
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(weights))
        save_file(
            {k: v[:, :-1].contiguous() if "lora_A" in k else v for k, v in tensors.items()},
            str(weights),
        )
    elif breakage == "missing":
        weights.unlink()
    elif breakage == "corrupt":
        weights.write_bytes(weights.read_bytes()[:40])
    reply = scheduler.change_lora_adapters(LoRAAdapterReq("bad", str(bad)))
    assert not reply.success and message in reply.message, reply.message
    assert reply.adapters == {"alpha": str(dirs["alpha"])}
    assert run(scheduler, [("alpha", prompts[0])]) == [expected["alpha"][0]]


def test_fp8_base_with_adapters_matches_peft_over_the_dequantized_base(setup):
    """--quantization fp8 (FP8 projections, float32 adapters): the wrapped FP8 base loads as
    before, base rows of a mixed batch are exactly the FP8 server's without adapters, and each
    adapter's tokens are PEFT's over the base with its projections rounded through FP8 as the
    server rounds them (on the CPU the FP8 product is the dequantized weight's)."""
    import copy

    import torch

    from radixserve.kernels.fp8_quant import quantize_rows
    from radixserve.layers.quantization.fp8 import dequantize_rows

    source, hf, dirs, prompts, _ = setup
    rounded = copy.deepcopy(hf)
    with torch.no_grad():
        for name, param in rounded.named_parameters():
            if name.endswith("_proj.weight"):
                param.copy_(dequantize_rows(*quantize_rows(param), torch.float32))
    names = [None, "alpha", "gamma"]
    jobs = [(n, p) for p in prompts[:2] for n in names]
    expected = [peft_greedy(rounded, dirs.get(n), p, NEW) for n, p in jobs]
    fp8 = {"alpha": dirs["alpha"], "gamma": dirs["gamma"]}
    got = run(lora_scheduler(source, fp8, max_loras=2, quantization="fp8"), jobs)
    assert got == expected
    plain = make_scheduler("random:tiny-llama", source, quantization="fp8")
    assert run(plain, [(None, p) for p in prompts[:2]]) == [got[0], got[3]]
