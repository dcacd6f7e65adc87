"""`radixserve bench latency`: one static batch, no server, no scheduler policy: prefill a batch
of `bs` prompts, then decode it step by step, for each batch size asked for.

Each decode step is what a serving step costs: build the batch, run the model (a CUDA graph
replay where one is captured), sample, copy the tokens to the host; with overlap scheduling (on
by default on CUDA, `--disable-overlap` turns it off) the host builds step N+1 while the device
runs step N, as the scheduler does, and the device time of a step is reported beside it. The
numbers are set against the hardware measured in the same run: decode against memory
bandwidth (MBU: bytes of weights plus KV read per step / step time / measured copy bandwidth),
prefill against compute (MFU: 2 x parameters x tokens / time / measured bf16 matmul rate).
The bytes are the ones actually read: FP8 weights and KV count one byte an element, and a
mixture-of-experts layer only the experts its tokens were routed to in the steps measured
(each MoE layer counts them on the device as it runs). transformers `generate` on the same
(unquantized) weights runs the same batch-1 decode for comparison.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch

from radixserve.bench.offline import progress
from radixserve.contract import HTTP_ONLY_FIELDS, add_server_args, server_args_from


def add_args(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group(
        "engine", "the model runner's flags (`radixserve serve`'s, less the HTTP server's)"
    )
    add_server_args(engine, exclude=HTTP_ONLY_FIELDS)
    parser = parser.add_argument_group("benchmark")
    parser.add_argument(
        "--batch-sizes", default="1", help="batch sizes to run, comma list, e.g. 1,8,64,256"
    )
    parser.add_argument(
        "--input-len", type=int, default=128, help="prompt tokens per request (default: 128)"
    )
    parser.add_argument(
        "--output-len", type=int, default=64, help="decode steps per batch (default: 64)"
    )
    parser.add_argument(
        "--transformers-output-len",
        type=int,
        default=32,
        help="tokens transformers `generate` decodes at batch 1 for comparison; 0 skips it "
        "(default: 32)",
    )
    parser.add_argument("--output-json", default=None, help="also write the results to this file")


def measure_ceilings() -> dict[str, float]:
    """Device copy bandwidth (read + write) and bf16 matmul rate, measured now. Without CUDA
    (a dry run of the device scripts on the CPU) the host's copy bandwidth and float32 matmul
    rate, so that the run completes and its MBU and MFU are still fractions of a measured
    limit."""
    from radixserve.bench.offline import measure_matmul_tflops

    if not torch.cuda.is_available():
        return _measure_host_ceilings()
    n = 1 << 30  # 2 GiB of bf16
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    bandwidth = 2 * a.numel() * a.element_size() * 10 / (start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": bandwidth, "bf16_flops_per_s": measure_matmul_tflops() * 1e12}


def _measure_host_ceilings() -> dict[str, float]:
    """measure_ceilings on the CPU: the best of a few 256 MiB copies and 1024^3 float32
    matmuls (the key keeps its name: the CPU has no bf16 matmul worth the name)."""
    a = torch.ones(1 << 26)  # 256 MiB of float32
    b = torch.empty_like(a)
    copies = []
    for _ in range(4):
        start = time.perf_counter()
        b.copy_(a)
        copies.append(time.perf_counter() - start)
    m = torch.ones(1024, 1024)
    matmuls = []
    for _ in range(4):
        start = time.perf_counter()
        m @ m
        matmuls.append(time.perf_counter() - start)
    return {
        "copy_bytes_per_s": 2 * a.numel() * a.element_size() / min(copies),
        "bf16_flops_per_s": 2 * 1024**3 / min(matmuls),
    }


def dense_weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes every step reads whatever its tokens: every parameter but the experts' (read as
    routed, see ExpertReads) and an untied input embedding (only the looked-up rows)."""
    from radixserve.layers.moe.layer import FusedMoE

    params = dict(model.named_parameters())
    experts = {
        f"{name}.{p}"
        for name, module in model.named_modules()
        if isinstance(module, FusedMoE)
        for p, _ in module.named_parameters()
    }
    total = sum(p.numel() * p.element_size() for n, p in params.items() if n not in experts)
    if not getattr(model, "tie_word_embeddings", False):
        emb = model.model.embed_tokens.weight
        total -= emb.numel() * emb.element_size()
    return total


class ExpertReads:
    """The expert weights a run of passes streamed: each MoE layer counts, on the device, the
    experts its tokens went to; the difference between two snapshots, per pass, times one
    expert's bytes, summed over the layers."""

    def __init__(self, model: torch.nn.Module) -> None:
        from radixserve.layers.moe.layer import FusedMoE

        self.layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
        self.start = [layer.experts_read() for layer in self.layers]

    def per_pass(self) -> tuple[float, float]:
        """(bytes, experts per layer) per pass since construction; zeros for a dense model."""
        total_bytes = total_experts = 0.0
        for layer, (used0, passes0) in zip(self.layers, self.start, strict=True):
            used1, passes1 = layer.experts_read()
            if passes1 > passes0:
                experts = (used1 - used0) / (passes1 - passes0)
                total_bytes += experts * layer.expert_bytes
                total_experts += experts
        return total_bytes, total_experts / max(1, len(self.layers))


def run_batch(
    worker: Any, cache: Any, bs: int, input_len: int, output_len: int, vocab: int
) -> dict:
    from radixserve.sampling.sampling_params import SamplingParams
    from radixserve.scheduler.schedule_batch import Req, ScheduleBatch

    runner = worker.model_runner
    rng = random.Random(bs)
    params = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)
    reqs = [
        Req(str(i), [rng.randrange(10, vocab) for _ in range(input_len)], params) for i in range(bs)
    ]
    for req in reqs:
        req.init_next_round_input(cache)

    def new_batch(members: list[Req]) -> ScheduleBatch:
        return ScheduleBatch(
            members, runner.req_to_token_pool, runner.allocator, cache, vocab, runner.device, set()
        )

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    # prefill in passes of at most --max-prefill-tokens, as the scheduler would
    per_pass = max(1, runner.server_args.max_prefill_tokens // input_len)
    batch = new_batch([])
    for i in range(0, bs, per_pass):
        part = new_batch(reqs[i : i + per_pass])
        part.prepare_for_extend()
        result = worker.forward_batch_generation(part.get_model_worker_batch())
        for req, token in zip(part.reqs, result.next_token_ids, strict=True):
            req.output_ids.append(token)
        batch.merge_batch(part)
    prefill_s = time.perf_counter() - start
    # Decode as the scheduler does: with overlap, step N+1 is launched (its input ids naming
    # step N's tokens on the device) before step N's tokens are fetched, so the host's work
    # hides behind the device's; a step's time is then the interval between launches.
    overlap = runner.device.type == "cuda" and not runner.server_args.disable_overlap
    reads = ExpertReads(runner.model)
    launches, device_ms = [], []
    in_flight = None
    for _ in range(output_len - 1):
        launches.append(time.perf_counter())
        batch.prepare_for_decode()
        pending = worker.launch(batch.get_model_worker_batch())
        for i, req in enumerate(reqs):
            req.future_id = pending.future.placeholder(i)
        done, in_flight = (in_flight, pending) if overlap else (pending, None)
        if done is not None:
            _append_tokens(reqs, done, device_ms)
    if in_flight is not None:
        _append_tokens(reqs, in_flight, device_ms)
    launches.append(time.perf_counter())
    steps = [b - a for a, b in zip(launches, launches[1:], strict=False)]
    expert_bytes, experts_per_layer = reads.per_pass()
    mean_context = input_len + output_len / 2
    for req in reqs:
        cache.cache_finished_req(req)
    return {
        "bs": bs,
        "prefill_s": prefill_s,
        "decode_step_s": statistics.median(steps[len(steps) // 4 : -1] or steps),
        "decode_device_step_s": statistics.median(device_ms[len(device_ms) // 4 :]) / 1e3
        if device_ms
        else None,
        "overlap": overlap,
        "mean_context": mean_context,
        "expert_bytes_per_step": expert_bytes,
        "experts_per_moe_layer_step": experts_per_layer,
    }


def _append_tokens(reqs: list, pending: Any, device_ms: list[float]) -> None:
    """Resolve a launched step: its tokens join the requests, its device time is recorded."""
    result = pending.resolve()
    if pending.started is not None and pending.done is not None:
        device_ms.append(pending.started.elapsed_time(pending.done))
    for i, (req, token) in enumerate(zip(reqs, result.next_token_ids, strict=True)):
        req.output_ids.append(token)
        if req.future_id == pending.future.placeholder(i):
            req.future_id = None


def transformers_decode_step(source: Any, input_len: int, output_len: int) -> float:
    """Seconds per generated token of transformers `generate`, batch 1, same weights."""
    from radixserve.model_loader.loader import build_hf_reference

    model = build_hf_reference(source, dtype=source.config.dtype).to("cuda")
    ids = torch.randint(10, source.config.vocab_size, (1, input_len), device="cuda")

    def gen(n: int, model: torch.nn.Module = model) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    gen(4)
    short, long = gen(2), gen(output_len)
    return (long - short) / (output_len - 2)


def run(args: argparse.Namespace) -> int:
    from radixserve.mem_cache.chunk_cache import ChunkCache
    from radixserve.model_loader.loader import load_model_source_for
    from radixserve.scheduler.tp_worker import ModelWorker

    server_args = server_args_from(args)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if server_args.max_running_requests is None:
        server_args.max_running_requests = max(batch_sizes)
    progress("measuring the device's copy bandwidth and bf16 matmul rate...")
    ceilings = measure_ceilings()
    progress(f"loading {server_args.model}...")
    source = load_model_source_for(server_args)
    if args.transformers_output_len:
        progress("running the transformers reference (batch 1 decode, same weights)...")
    peer = (
        transformers_decode_step(source, args.input_len, args.transformers_output_len)
        if args.transformers_output_len
        else None
    )
    torch.cuda.empty_cache()  # the peer's copy of the weights is gone
    progress("building the model runner (weights, KV pool, CUDA graphs)...")
    worker = ModelWorker(server_args, source)
    runner = worker.model_runner
    cache = ChunkCache(runner.req_to_token_pool, runner.allocator)
    cfg = source.config
    dense = dense_weight_bytes_per_step(runner.model)
    kv_per_token = runner.kv_bytes_per_token
    flops_per_token = 2 * cfg.matmul_parameters
    progress("warm-up batch...")
    run_batch(worker, cache, batch_sizes[0], args.input_len, 8, cfg.vocab_size)  # warm-up
    rows = []
    for bs in batch_sizes:
        progress(f"batch size {bs}: prefill, then {args.output_len - 1} decode steps...")
        r = run_batch(worker, cache, bs, args.input_len, args.output_len, cfg.vocab_size)
        r["weight_bytes_per_step"] = dense + r["expert_bytes_per_step"]
        read = r["weight_bytes_per_step"] + bs * r["mean_context"] * kv_per_token
        r["decode_tok_s"] = bs / r["decode_step_s"]
        r["decode_mbu"] = read / r["decode_step_s"] / ceilings["copy_bytes_per_s"]
        r["decode_floor_s"] = read / ceilings["copy_bytes_per_s"]
        r["prefill_tok_s"] = bs * args.input_len / r["prefill_s"]
        r["prefill_mfu"] = r["prefill_tok_s"] * flops_per_token / ceilings["bf16_flops_per_s"]
        rows.append(r)

    experts = ", ".join(
        f"bs {r['bs']}: {r['experts_per_moe_layer_step']:.1f} experts/MoE layer, "
        f"{r['weight_bytes_per_step'] / 1e9:.2f} GB"
        for r in rows
        if r["expert_bytes_per_step"]
    )
    quant = runner.quantization.describe() if runner.quantization else "none"
    print(
        f"\n{server_args.model}: {cfg.num_hidden_layers} layers, weights read per step "
        f"{(dense + rows[0]['expert_bytes_per_step']) / 1e9:.2f} GB"
        f"{f' ({experts})' if experts else ''}, quantization {quant}, KV "
        f"{str(runner.kv_dtype).removeprefix('torch.')}, backend {runner.attention_backend_name}, CUDA graphs "
        f"{'on' if runner.cuda_graph_runner else 'off'}, overlap "
        f"{'on' if rows[0]['overlap'] else 'off'}; measured copy "
        f"{ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
        f"{ceilings['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s"
    )
    print(
        f"{'bs':>5}{'prefill ms':>12}{'prefill tok/s':>15}{'MFU':>7}"
        f"{'decode ms':>11}{'device ms':>11}{'floor ms':>10}{'decode tok/s':>14}{'MBU':>7}"
    )
    for r in rows:
        print(
            f"{r['bs']:>5}{r['prefill_s'] * 1e3:>12.2f}{r['prefill_tok_s']:>15.0f}"
            f"{100 * r['prefill_mfu']:>6.1f}%{r['decode_step_s'] * 1e3:>11.3f}"
            f"{(r['decode_device_step_s'] or float('nan')) * 1e3:>11.3f}"
            f"{r['decode_floor_s'] * 1e3:>10.3f}{r['decode_tok_s']:>14.1f}{100 * r['decode_mbu']:>6.1f}%"
        )
    print(
        "\nbs: requests in the batch; prefill ms: the whole batch's prompts; MFU: prefill FLOPs "
        "(2 x params per token) / measured bf16 matmul rate; decode ms: one decode step, host "
        "included (median); device ms: the step's device time; floor ms: bytes read per step "
        "(weights + KV) / measured copy bandwidth; decode tok/s: bs / decode ms; MBU: floor ms / "
        "decode ms\n"
    )
    summary: dict[str, Any] = {
        "model": server_args.model,
        "quantization": quant,
        "kv_cache_dtype": str(runner.kv_dtype).removeprefix("torch."),
        "dense_weight_bytes_per_step": dense,
        "ceilings": ceilings,
        "rows": rows,
    }
    if peer is not None:
        ours = next((r for r in rows if r["bs"] == 1), None)
        summary["transformers_bs1_step_s"] = peer
        line = f"transformers generate, bs 1: {peer * 1e3:.2f} ms/token ({1 / peer:.1f} tok/s)"
        if ours is not None:
            line += f"; radixserve is {peer / ours['decode_step_s']:.1f}x faster"
        print(line)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0
