"""--tp-size 2 on the CPU (gloo): two scheduler processes, each with a shard of every layer, give
the same greedy tokens as one process holding the whole model (a MoE model's experts split by
their intermediate dimension too); and the ranks end together."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from engine_harness import random_prompts

from radixserve.api_errors import InvalidParameterError
from radixserve.frontend.engine import Engine
from radixserve.model_loader import random_init

GREEDY = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
# tiny random weights, but a vocabulary large enough for the bundled tokenizer: text, grammars
TINY_WITH_SMOLLM2_VOCAB = {**random_init.PRESETS["tiny-llama"], "vocab_size": 49152}


def generate(model: str, tp_size: int, **kwargs) -> list[dict]:
    with Engine(model=model, device="cpu", tp_size=tp_size, max_total_tokens=4096) as engine:
        assert engine.get_server_info()["max_total_tokens"] == 4096
        return engine.generate(**kwargs)


@pytest.mark.parametrize(
    "model",
    [
        "random:tiny-llama",
        "random:tiny-qwen2",
        pytest.param("random:tiny-qwen3-moe", marks=pytest.mark.slow),
    ],
)
def test_tp2_greedy_equals_tp1_on_tiny_models(model):
    prompts = random_prompts(8, 1024, 3, 60, seed=31)
    one = generate(model, 1, input_ids=prompts, sampling_params=GREEDY)
    two = generate(model, 2, input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in two] == [o["output_ids"] for o in one]


def test_tp2_greedy_equals_tp1_on_the_bundled_model():
    # SmolLM2 has 9 heads in 3 KV groups: rank 0 holds 2 groups, rank 1 one
    prompts = ["The capital of France is", "List three colours:", "def fibonacci(n):"]
    one = generate("builtin:smollm2-135m", 1, prompt=prompts, sampling_params=GREEDY)
    two = generate("builtin:smollm2-135m", 2, prompt=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in two] == [o["output_ids"] for o in one]
    assert "Paris" in one[0]["text"]


def test_tp2_sampling_stays_in_lockstep():
    """Unseeded sampling draws different noise per rank; rank 0's tokens are broadcast, so the
    ranks' caches agree and the request completes."""
    params = {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True}
    outs = generate(
        "random:tiny-llama",
        2,
        input_ids=random_prompts(4, 1024, 5, 20, seed=32),
        sampling_params=params,
    )
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [24] * 4


def test_tp2_constrained_outputs_equal_tp1(tmp_path):
    """Grammars compile on each rank's own threads and finish at different times: rank 0 tells
    the other rank when to admit, so both run the same batches; a grammar that does not compile
    fails on both the same way."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_WITH_SMOLLM2_VOCAB))
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tag": {"enum": ["a", "b"]},
        },
        "required": ["n", "tag"],
    }
    params = [
        {"max_new_tokens": 40, "temperature": 0.0, "json_schema": json.dumps(schema)},
        {"max_new_tokens": 20, "temperature": 0.0, "regex": r"[a-z]{1,6}!"},
        {"max_new_tokens": 20, "temperature": 0.0, "ebnf": 'root ::= "x" [0-9]+ "y"'},
        GREEDY,
    ]
    prompts = ["A record:", "A word:", "A code:", "Hello"]
    one = generate(f"random:{config}", 1, prompt=prompts, sampling_params=params)
    two = generate(f"random:{config}", 2, prompt=prompts, sampling_params=params)
    assert [o["output_ids"] for o in two] == [o["output_ids"] for o in one]
    assert all(o["meta_info"]["finish_reason"]["type"] == "stop" for o in two[:3])
    assert json.loads(two[0]["text"]).keys() == {"n", "tag"}
    bad = {"max_new_tokens": 4, "ebnf": "root ::= missing"}
    with pytest.raises(InvalidParameterError, match='"missing" is not defined') as error:
        generate(f"random:{config}", 2, prompt="x", sampling_params=bad)
    assert error.value.param == "sampling_params.ebnf"


def _rank_processes(scheduler_pid: int) -> list[int]:
    """Pids of the scheduler ranks that rank 0 (`scheduler_pid`) started: its spawned children."""
    ranks = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if ppid == scheduler_pid and b"spawn_main" in cmdline:
            ranks.append(int(stat.parent.name))
    return ranks


def _gone(pid: int, within_s: float) -> bool:
    """Whether `pid` has exited (or is a zombie nobody reaped) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_shutdown_stops_every_rank_in_order():
    """SIGTERM from the engine: rank 0 finishes its step, stops rank 1 and exits 0 (it used to
    die on the signal, leaving rank 1 to fail on a closed store)."""
    engine = Engine(model="random:tiny-llama", device="cpu", tp_size=2, max_total_tokens=4096)
    try:
        engine.generate(input_ids=[[5, 6, 7]], sampling_params=GREEDY)
        rank0 = engine._process
        (rank1,) = _rank_processes(rank0.pid)
    finally:
        engine.shutdown()
    assert rank0.exitcode == 0
    assert _gone(rank1, 5)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ranks_exit_when_rank_0_dies():
    engine = Engine(model="random:tiny-llama", device="cpu", tp_size=2, max_total_tokens=4096)
    try:
        rank0 = engine._process
        (rank1,) = _rank_processes(rank0.pid)
        os.kill(rank0.pid, signal.SIGKILL)
        assert _gone(rank1, 10)
    finally:
        engine.shutdown()


def test_tp2_lora_adapters_give_pefts_tokens(tmp_path):
    """LoRA under --tp-size 2: each rank holds its part of every adapter (B's rows of q/k/v and
    gate/up, A's columns of o and down, cut as the base is), and the base's all-reduce sums the
    adapters' partial terms. The base and three adapters of ranks 4-16, mixed in one batch, give
    PEFT's greedy tokens on the whole model; an unknown adapter is refused by name; an adapter
    unloaded and loaded again through the admin path serves its tokens again (every rank reads
    it at the same message)."""
    pytest.importorskip("peft")
    from lora_adapters import tp2_engine_with_adapters

    with tp2_engine_with_adapters(tmp_path, "cpu") as (engine, got, expected, jobs):
        assert got == expected
        params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
        name, prompt = jobs[2]  # the first adapter's first prompt
        with pytest.raises(InvalidParameterError, match="'delta'.*alpha") as error:
            engine.generate(input_ids=prompt, sampling_params=params, lora_name="delta")
        assert error.value.param == "lora_name"
        engine.unload_lora_adapter(name)
        with pytest.raises(InvalidParameterError, match=f"no LoRA adapter '{name}'"):
            engine.generate(input_ids=prompt, sampling_params=params, lora_name=name)
        engine.load_lora_adapter(name, str(tmp_path / name))
        out = engine.generate(input_ids=prompt, sampling_params=params, lora_name=name)
        assert out["output_ids"] == expected[2]


def test_tp2_adapters_read_at_admission_stay_in_lockstep(tmp_path):
    """--lora-load lazy with one device slot and one host copy: every admission of another
    adapter reads it from disk again, on each rank at the same step (a rank that saw its read
    end a step later would form another batch, and the collectives would part)."""
    pytest.importorskip("peft")
    from lora_adapters import tp2_engine_with_adapters

    lazy = {"lora_load": "lazy", "max_loras": 1, "max_cpu_loras": 1}
    with tp2_engine_with_adapters(tmp_path, "cpu", **lazy) as (engine, got, expected, _):
        info = engine.get_server_info()
    assert got == expected
    assert info["lora_loads"] >= 3 and info["lora_evictions"] >= 2
