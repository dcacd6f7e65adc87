"""LoRA adapters' GPU must-shows (issue 34), in process, one section a call:

- batch: 8 distinct rank-16 adapters (every projection) spread over a batch of 64 rows against
  64 base rows on the same server, alternating rounds: steady decode tok/s (after every row's
  prefill), the ratio (target >= 0.85x). CUDA graphs and overlap on (checked).
- single: batch 1, one adapter against the base (target >= 0.90x).
- plain: the base model on a server without LoRA, batch 64 and 1: the adapters' rows against
  it too (lora.sh prints both ratios).
- kernels: the LoRA kernels alone for one decode step of the model (every layer's q/k/v, o,
  gate/up, down shrink + expand; 64 rows over 8 slots, 64 rows of one adapter, one row),
  captured in a CUDA graph and replayed: device time per step against the time the adapters'
  bytes take at the HBM bandwidth; with --sweep, each projection's decode tiles swept at 64
  rows over 8 slots (kernels/lora.py SHRINK_SWEEP, EXPAND_SWEEP: 19 shrink and 12 expand
  candidates a projection, ~1-2 compilations each), the best per projection and the step's
  total with them, against the tiles before (`STAGES=kernels bash scripts/gpu/lora.sh`).
- profile: batch 1, the graphs with and without the LoRA kernels replayed alone, each one's
  time and its kernels by device time a replay (torch's profiler): where batch 1's adapter
  cost goes.

The model is random (`random:llama-3-8b`, bf16) and so are the adapters (PEFT's layout, written
under /tmp). The servers decode with Triton attention, as the other benches do (`auto` would take
FlashInfer only once its modules are built: on 2026-12-05 one call's later stages ran on it).
Dry run on the CPU: --device cpu with random:tiny-llama and few tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.profiler import ProfilerActivity, profile

from radixserve.boundary import TokenizedGenerateReqInput
from radixserve.kernels import lora as lora_kernels
from radixserve.lora.pool import projection_shapes
from radixserve.model_loader.random_init import random_hf_config
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler_process import build_scheduler
from radixserve.server_args import ServerArgs

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HBM_BYTES_PER_S = 4.8e12  # H200


def write_adapters(model: str, count: int, rank: int, root: Path) -> dict[str, Path]:
    config = random_hf_config(model.removeprefix("random:"))
    shapes = projection_shapes(config)
    dirs = {}
    for i in range(count):
        directory = root / f"adapter{i}"
        dirs[f"adapter{i}"] = directory
        if (directory / "adapter_model.safetensors").exists():
            continue
        directory.mkdir(parents=True, exist_ok=True)
        gen = torch.Generator().manual_seed(i)
        tensors = {}
        for layer in range(config.num_hidden_layers):
            for module in TARGETS:
                fan_in, fan_out = shapes[module]
                part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
                a = torch.randn(rank, fan_in, generator=gen) * 0.01
                b = torch.randn(fan_out, rank, generator=gen) * 0.01
                tensors[f"{prefix}.lora_A.weight"] = a.to(torch.bfloat16)
                tensors[f"{prefix}.lora_B.weight"] = b.to(torch.bfloat16)
        save_file(tensors, str(directory / "adapter_model.safetensors"))
        adapter_config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank}
        adapter_config["target_modules"] = list(TARGETS)
        (directory / "adapter_config.json").write_text(json.dumps(adapter_config))
    return dirs


def decode_tok_s(scheduler, names: list[str | None], prompt_len: int, tokens: int) -> float:
    """Steady decode tok/s of one request per entry of `names` (an adapter or None): timed
    from the step where every row has its first token to the end."""
    vocab = scheduler.model.vocab_size
    stamp = time.perf_counter()
    for i, name in enumerate(names):
        prompt = [(i * 7919 + j * 31) % vocab for j in range(prompt_len)]
        params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                rid=f"{stamp}-{i}",
                input_ids=prompt,
                sampling_params=params,
                stream=True,
                lora_name=name,
            )
        )
    produced = {}
    start = None
    counted_before = 0
    while scheduler.has_work():
        scheduler.step()
        for out in scheduler.pop_outputs():
            produced[out.rid] = produced.get(out.rid, 0) + len(out.new_token_ids)
        if start is None and len(produced) == len(names) and all(produced.values()):
            start, counted_before = time.perf_counter(), sum(produced.values())
    elapsed = time.perf_counter() - start
    return (sum(produced.values()) - counted_before) / elapsed


def make(a, dirs: dict[str, Path]):
    """A server with the adapters resident, or without LoRA at all (`dirs` empty)."""
    if not dirs:
        return build_scheduler(
            ServerArgs(
                model=a.model,
                device=a.device,
                attention_backend=a.attention_backend,
                quantization=a.quantization,
                max_total_tokens=a.max_total_tokens,
            )
        )
    modules = [f"{name}={path}" for name, path in dirs.items()]
    args = ServerArgs(
        model=a.model,
        device=a.device,
        attention_backend=a.attention_backend,
        lora_modules=modules,
        max_loras=len(dirs),
        max_lora_rank=a.rank,
        max_cpu_loras=len(dirs),
        quantization=a.quantization,
        max_total_tokens=a.max_total_tokens,
    )
    return build_scheduler(args)


def section_plain(a) -> dict:
    """The base model on a server without LoRA, batch `a.batch` and 1: what the adapters'
    rows are finally compared with (the base rows of a LoRA server pay its kernels' launches)."""
    scheduler = make(a, {})
    result: dict = {"max_total_tokens": scheduler.worker.max_total_tokens}
    for name, batch in (("batch", a.batch), ("single", 1)):
        decode_tok_s(scheduler, [None] * batch, a.prompt_len, 4)  # warm-up
        runs = [decode_tok_s(scheduler, [None] * batch, a.prompt_len, a.tokens)]
        runs += [decode_tok_s(scheduler, [None] * batch, a.prompt_len, a.tokens)]
        result[name] = {"batch": batch, "plain_tok_s": runs}
        print(f"plain {name}: {statistics.median(runs):.0f} tok/s (batch {batch})", flush=True)
    return result


def count_replays(scheduler) -> Counter:
    """Counts the decode graph replays from now on by variant: "lora" (with the LoRA kernels)
    or "plain" (without: the steps whose rows all use the base model)."""
    counts: Counter = Counter()
    graphs = scheduler.worker.model_runner.cuda_graph_runner
    if graphs is None:
        return counts
    replay = graphs.replay

    def counted(forward_batch, raw_bs):
        counts["lora" if graphs.uses_adapters() else "plain"] += 1
        return replay(forward_batch, raw_bs)

    graphs.replay = counted
    return counts


def section_throughput(a, scheduler, dirs, batch: int, spread: bool) -> dict:
    runner = scheduler.worker.model_runner
    graphs = runner.cuda_graph_runner is not None
    names = list(dirs) if spread else list(dirs)[:1]
    lora_rows = [names[i % len(names)] for i in range(batch)]
    decode_tok_s(scheduler, [None] * batch, a.prompt_len, 4)  # warm-up: both paths
    decode_tok_s(scheduler, lora_rows, a.prompt_len, 4)
    base, lora = [], []
    replays = count_replays(scheduler)
    base_replays: Counter = Counter()
    for _ in range(a.rounds):
        before = Counter(replays)
        base.append(decode_tok_s(scheduler, [None] * batch, a.prompt_len, a.tokens))
        base_replays += replays - before
        lora.append(decode_tok_s(scheduler, lora_rows, a.prompt_len, a.tokens))
    ratio = statistics.median(lora) / statistics.median(base)
    return {
        "batch": batch,
        "adapters": len(names),
        "base_tok_s": base,
        "lora_tok_s": lora,
        "ratio": ratio,
        "cuda_graphs": graphs,
        "overlap": scheduler.overlap,
        # the base rows' steps: every replay should be of the graphs without LoRA kernels
        "base_replays": dict(base_replays),
        "lora_replays": dict(replays - base_replays),
    }


def section_profile(a, scheduler, dirs) -> dict:
    """Batch 1 with one adapter against the base: each graph's replay alone (the graphs with
    and without the LoRA kernels, captured for one row) and its kernels by device time a
    replay, from torch's profiler: where the adapter's extra time in the step goes."""
    graphs = scheduler.worker.model_runner.cuda_graph_runner
    if graphs is None:
        print("profile: no CUDA graphs here", flush=True)
        return {}
    name = next(iter(dirs))
    decode_tok_s(scheduler, [name], a.prompt_len, 8)  # leaves the adapter's slot in the buffers
    result: dict = {}
    for variant, graph in (("lora", graphs.lora_graphs[1]), ("plain", graphs.graphs[1])):
        replay_ms = replay_us(graph, 50) / 1e3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
        kernels = sorted(
            (e for e in prof.key_averages() if e.self_device_time_total),
            key=lambda e: -e.self_device_time_total,
        )
        result[variant] = {
            "replay_ms": replay_ms,
            "kernels": [
                [e.key[:90], e.self_device_time_total / 10, e.count / 10] for e in kernels[:24]
            ],
        }
        print(f"profile {variant}: replay {result[variant]['replay_ms']:.3f} ms", flush=True)
        for key, us, calls in result[variant]["kernels"]:
            print(f"  {key[:70]:70s} {us:8.1f} us {calls:6.1f} calls", flush=True)
    return result


def graph_us(fn, layers: int) -> float:
    """Device time of `layers` calls of fn, captured in one CUDA graph and replayed: us."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            fn()
    return replay_us(graph, 10)


def replay_us(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """A captured graph's device time a replay, us: one warm replay, then `replays` timed."""
    graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1e3 / replays


def decode_layout(row_slots: list[int], slots: int, device: str) -> lora_kernels.Layout:
    """A decode pass's kernel layout, rows grouped by slot, as LoRABatch writes it."""
    rows = len(row_slots)
    table = torch.tensor(lora_kernels.decode_blocks(row_slots, slots), dtype=torch.int32)
    return lora_kernels.Layout(
        seg_starts=torch.arange(rows + 1, dtype=torch.int32, device=device),
        seg_slots=torch.tensor(row_slots, dtype=torch.int32, device=device),
        max_seg_len=1,
        blocks=table.view(-1, 1 + lora_kernels.DECODE_BLOCK_M).to(device),
    )


def kernel_times(weights: dict, row_slots: list[int], slots: int, layers: int) -> dict:
    """Each projection's shrink and expand (at one row: the base GEMV alone and with the
    adapter's expand in its epilogue too) over `row_slots`, graph-timed over `layers` calls:
    us a step per kernel."""
    from radixserve.kernels.gemv import LoRAEpilogue, block_config, gemv

    device, dtype, rows = "cuda", torch.bfloat16, len(row_slots)
    layout = decode_layout(row_slots, slots, device)
    per: dict = {}
    for name, (a_w, b_w, fan_in, outs) in weights.items():
        x = torch.randn(rows, fan_in, device=device, dtype=dtype)
        y = torch.zeros(rows, sum(outs), device=device, dtype=dtype)
        s = lora_kernels.shrink(x, a_w, layout)
        shrink = partial(lora_kernels.shrink, x, a_w, layout)
        expand = partial(lora_kernels.expand, y, s, b_w, layout, outs)
        one = {"shrink_us": graph_us(shrink, layers), "expand_us": graph_us(expand, layers)}
        if rows == 1:
            w = torch.randn(sum(outs), fan_in, device=device, dtype=dtype) * 0.01
            base = partial(gemv, x, w, None, *block_config(*w.shape), gated=name == "gate_up")
            one["gemv_us"] = graph_us(base, layers)
            subs = () if name == "gate_up" else tuple(outs)
            epilogue = LoRAEpilogue(s, b_w, layout.seg_slots[:1], subs)
            one["gemv_lora_us"] = graph_us(partial(base, lora=epilogue), layers)
        per[name] = {k: round(v, 1) for k, v in one.items()}
    return per


def lora_step_us(per: dict) -> float:
    """The LoRA kernels' us of a step as the layers launch them: at one row every projection
    adds its expand in the GEMV's epilogue (its cost over the plain GEMV)."""
    total = 0.0
    for one in per.values():
        total += one["shrink_us"]
        if "gemv_us" in one:
            total += one["gemv_lora_us"] - one["gemv_us"]
        else:
            total += one["expand_us"]
    return round(total, 1)


def tile_name(tile: tuple) -> str:
    """A candidate's key in the JSON: its fields, e.g. block_k256-block_r16-k_per_split512-..."""
    return "-".join(f"{field}{value}" for field, value in tile._asdict().items())


def tile_sweep(weights: dict, row_slots: list[int], slots: int, layers: int) -> dict:
    """Each projection's shrink over `lora_kernels.SHRINK_SWEEP` and expand over `EXPAND_SWEEP`
    (with the default shrink's partials), graph-timed over `layers` calls at `row_slots`: us a
    step per candidate, the best of each, and the best pair measured together (an expand's
    time depends on the shrink's split count: it loads every split's partial), against the
    tiles before the config functions (the shrink's 8 splits of 1024 at most; the expand's
    256 columns over 8 warps from 8192 columns, else 128 over 4; 3 stages). Prints a line a
    projection as it ends, so a timed-out stage still shows what it measured."""
    before_shrink = lora_kernels.SHRINK_SWEEP[0]  # the sweep's first: the tiles before
    wide_before, narrow_before = (
        lora_kernels.ExpandConfig(256, 8, 3),
        lora_kernels.ExpandConfig(128, 4, 3),
    )
    device, rows = next(iter(weights.values()))[0].device, len(row_slots)
    layout = decode_layout(row_slots, slots, str(device))
    result: dict = {}
    totals = {"best_us": 0.0, "before_us": 0.0}
    for name, (a_w, b_w, fan_in, outs) in weights.items():
        x = torch.randn(rows, fan_in, device=device, dtype=a_w.dtype)
        y = torch.zeros(rows, sum(outs), device=device, dtype=a_w.dtype)
        shrink_us = {
            tile: graph_us(partial(lora_kernels.shrink, x, a_w, layout, tile), layers)
            for tile in lora_kernels.SHRINK_SWEEP
        }
        s = lora_kernels.shrink(x, a_w, layout)
        expand_us = {
            tile: graph_us(partial(lora_kernels.expand, y, s, b_w, layout, outs, tile), layers)
            for tile in lora_kernels.EXPAND_SWEEP
        }
        best_shrink = min(shrink_us, key=shrink_us.__getitem__)
        best_expand = min(expand_us, key=expand_us.__getitem__)
        pair = {}
        for key, shrink_tile, expand_tile in (
            ("best", best_shrink, best_expand),
            ("before", before_shrink, wide_before if sum(outs) >= 8192 else narrow_before),
        ):
            s_tile = lora_kernels.shrink(x, a_w, layout, shrink_tile)
            expand = partial(lora_kernels.expand, y, s_tile, b_w, layout, outs, expand_tile)
            pair[key] = round(shrink_us[shrink_tile] + graph_us(expand, layers), 1)
            totals[f"{key}_us"] += pair[key]
        result[name] = {
            "shrink_us": {tile_name(k): round(v, 1) for k, v in shrink_us.items()},
            "expand_us": {tile_name(k): round(v, 1) for k, v in expand_us.items()},
            "best_shrink": best_shrink._asdict(),
            "best_expand": best_expand._asdict(),
            "default_shrink": lora_kernels.shrink_config(fan_in, a_w.shape[1], rows)._asdict(),
            "default_expand": lora_kernels.expand_config(sum(outs), b_w.shape[2], rows)._asdict(),
            "pair_us": pair,
        }
        print(
            f"kernels sweep {name}: best shrink {tile_name(best_shrink)} "
            f"{shrink_us[best_shrink]:.1f} us, expand {tile_name(best_expand)} "
            f"{expand_us[best_expand]:.1f} us; together {pair['best']} us a step "
            f"(the tiles before {pair['before']})",
            flush=True,
        )
    result.update({key: round(value, 1) for key, value in totals.items()})
    return result


def section_kernels(a) -> dict:
    """The LoRA kernels of one decode step (all layers), graph-timed, each kernel alone per
    projection: at `a.batch` rows over every slot (rows grouped by slot), at that batch all of
    one adapter, and at batch 1 (one adapter, with the base GEMV alone and with the adapter's
    expand in its epilogue); with `a.sweep`, each projection's tiles swept at `a.batch` rows
    over every slot (`tile_sweep`): where a step's LoRA time goes, and which tiles cut it."""
    config = random_hf_config(a.model.removeprefix("random:"))
    shapes = projection_shapes(config)
    device, dtype, slots, rank = a.device, torch.bfloat16, a.adapters, a.rank
    layers = config.num_hidden_layers
    projections = {  # name: (in, sub-projection outputs)
        "qkv": (shapes["q_proj"][0], [shapes[m][1] for m in ("q_proj", "k_proj", "v_proj")]),
        "o": (shapes["o_proj"][0], [shapes["o_proj"][1]]),
        "gate_up": (shapes["gate_proj"][0], [shapes["gate_proj"][1]] * 2),
        "down": (shapes["down_proj"][0], [shapes["down_proj"][1]]),
    }
    result: dict = {"slots": slots, "rank": rank, "layers": layers}
    weights = {}
    for name, (fan_in, outs) in projections.items():
        a_w = torch.randn(slots, len(outs) * rank, fan_in, device=device, dtype=dtype) * 0.01
        b_w = torch.randn(slots, sum(outs), rank, device=device, dtype=dtype) * 0.01
        weights[name] = (a_w, b_w, fan_in, outs)
    adapter_bytes = sum(a_w.nbytes + b_w.nbytes for a_w, b_w, _, _ in weights.values())
    result["bytes_per_step"] = adapter_bytes * layers  # every slot used
    if device != "cuda":
        return result
    cases = {
        f"rows{a.batch}": [i % slots for i in range(a.batch)],
        f"rows{a.batch}_one_adapter": [0] * a.batch,
        "rows1": [0],
    }
    for key, row_slots in cases.items():
        per = kernel_times(weights, row_slots, slots, layers)
        result[key] = per
        result[f"{key}_shrink_expand_us"] = lora_step_us(per)
    if a.sweep:
        result["tile_sweep"] = tile_sweep(weights, cases[f"rows{a.batch}"], slots, layers)
    # the floor: a shrink with no adapter row (its one block empty) loads nothing, so its time
    # a step is the launches' and the dependency waits'
    a_w, _, fan_in, _ = weights["o"]
    x = torch.randn(1, fan_in, device=device, dtype=dtype)
    empty = partial(lora_kernels.shrink, x, a_w, decode_layout([-1], slots, device))
    result["empty_shrink_us"] = round(graph_us(empty, layers), 1)
    limit = result["bytes_per_step"] / HBM_BYTES_PER_S
    result["bandwidth_limit_us"] = round(limit * 1e6, 1)
    result["us_per_step"] = result[f"rows{a.batch}_shrink_expand_us"]
    result["fraction_of_bandwidth"] = round(limit * 1e6 / result["us_per_step"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=("decode", "kernels", "plain", "profile"))
    parser.add_argument("--model", default="random:llama-3-8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--attention-backend",
        help="the servers' decode attention (default: triton on CUDA, as the other benches: auto"
        " would pick FlashInfer only once its modules are built, so two runs could differ)",
    )
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--adapter-dir", default=str(Path(tempfile.gettempdir()) / "lora-bench"))
    parser.add_argument("--json")
    parser.add_argument("--sweep", action="store_true", help="kernels: sweep the decode tiles")
    parser.add_argument("--quantization", help="the base's (fp8: bf16 adapters on FP8 weights)")
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        help="the KV pool's size (default: what memory leaves; the LoRA server's is smaller by "
        "its adapter pool: PLAIN_KV=same in lora.sh gives the plain server the same)",
    )
    a = parser.parse_args()
    a.attention_backend = a.attention_backend or ("triton" if a.device == "cuda" else "auto")
    if a.section == "kernels":
        result = section_kernels(a)
        print(f"kernels: {json.dumps(result)}", flush=True)
    elif a.section == "plain":
        result = section_plain(a)
    elif a.section == "profile":
        dirs = write_adapters(a.model, 1, a.rank, Path(a.adapter_dir))
        result = section_profile(a, make(a, dirs), dirs)
    else:  # one server for both: one model load and graph capture
        dirs = write_adapters(a.model, a.adapters, a.rank, Path(a.adapter_dir))
        scheduler = make(a, dirs)
        result = {"max_total_tokens": scheduler.worker.max_total_tokens}
        for name, batch, spread, target in (
            ("batch", a.batch, True, 0.85),
            ("single", 1, False, 0.90),
        ):
            one = section_throughput(a, scheduler, dirs, batch, spread)
            result[name] = one
            verdict = "PASS" if one["ratio"] >= target and one["cuda_graphs"] else "FAIL"
            if a.device != "cuda":
                verdict = "DRY"
            print(
                f"{name} {verdict}: {one['ratio']:.3f}x base decode tok/s "
                f"(target >= {target}; base {statistics.median(one['base_tok_s']):.0f}, "
                f"lora {statistics.median(one['lora_tok_s']):.0f}; batch {batch}, "
                f"{one['adapters']} adapters; graphs {one['cuda_graphs']}, "
                f"overlap {one['overlap']}; base rows' replays {one['base_replays']})",
                flush=True,
            )
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
