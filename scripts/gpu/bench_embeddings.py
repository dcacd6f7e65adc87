"""Embeddings throughput (prompt tokens/s) of `--task embed` against transformers, one process,
the same random weights (a Qwen3-Embedding-0.6B shape: the qwen3-0.6b preset, last-token
pooling, normalised).

Ours: the in-process scheduler (the worker's own batching, radix cache, overlap), all requests
submitted at once, `--max-running-requests` = the batch and a prefill budget of one batch, so a
pass holds `batch` prompts; warmed up first (as a server's start does), then timed until the
last embedding is out. The peer: transformers' Qwen3Model on the same weights (bf16, SDPA), the
same prompts in batches of `batch` (equal lengths: no padding), the last token's state
normalised, timed with the device synchronised. A few embeddings are compared (cosine).

    python3 scripts/gpu/bench_embeddings.py --preset qwen3-0.6b --batch 256 --input-len 512 \
        --requests 2048 --output results.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

import numpy as np
import torch
import torch.nn.functional as F

from radixserve.boundary import PoolingParams, TokenizedGenerateReqInput
from radixserve.model_loader.loader import build_hf_reference, load_model_source
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.scheduler.scheduler_process import build_scheduler, warm_up
from radixserve.server_args import ServerArgs


def ours(scheduler, prompts: list[list[int]]) -> tuple[float, dict[int, np.ndarray]]:
    """Seconds from submitting every prompt to the last embedding; the embeddings."""
    out: dict[int, np.ndarray] = {}
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                f"e{i}", ids, SamplingParams(max_new_tokens=0), pooling=PoolingParams()
            )
        )
    while scheduler.has_work():
        scheduler.step()
        for o in scheduler.pop_outputs():
            assert o.finished_reason == {"type": "stop"}, o.finished_reason
            out[int(o.rid[1:])] = np.frombuffer(o.pooled, dtype="<f4")
    return time.perf_counter() - start, out


@torch.inference_mode()
def peer(model, prompts: list[list[int]], batch: int, device: str) -> tuple[float, torch.Tensor]:
    """Seconds for transformers to embed every prompt in batches; the embeddings."""
    body = model.model
    vectors = []
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i : i + batch], device=device)
        hidden = body(input_ids=ids).last_hidden_state[:, -1]
        vectors.append(F.normalize(hidden.float(), dim=-1))
    sync()
    return time.perf_counter() - start, torch.cat(vectors).cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    server_args = ServerArgs(
        model=f"random:{args.preset}",
        task="embed",
        device=args.device,
        dtype=dtype,
        max_running_requests=args.batch,
        max_prefill_tokens=args.batch * args.input_len,
        chunked_prefill_size=args.batch * args.input_len,
        context_length=args.input_len + 8,
        max_total_tokens=args.batch * (args.input_len + 8) * 2,
    )
    source = load_model_source(
        server_args.model, dtype, args.device, server_args.context_length, seed=0
    )
    scheduler = build_scheduler(server_args, source)
    vocab = scheduler.model.vocab_size
    rng = random.Random(0)
    prompts = [
        [rng.randrange(1, vocab) for _ in range(args.input_len)] for _ in range(args.requests)
    ]
    if args.device == "cuda":
        warm_up(scheduler)
    ours(scheduler, prompts[: args.batch])  # the pass shapes of the timed run, once
    scheduler.flush_cache()  # random prompts share nothing; no cache hit either way
    seconds, embeddings = ours(scheduler, prompts)
    tokens = args.requests * args.input_len
    del scheduler
    gc.collect()  # the worker's KV pool goes back before the peer runs
    if args.device == "cuda":
        torch.cuda.empty_cache()
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    hf = build_hf_reference(source, torch_dtype).to(args.device)
    peer(hf, prompts[: args.batch], args.batch, args.device)  # warm-up
    peer_seconds, peer_vectors = peer(hf, prompts, args.batch, args.device)
    cosines = [
        float(np.dot(embeddings[i], peer_vectors[i].numpy())) for i in range(0, args.requests, 97)
    ]
    report = {
        "preset": args.preset,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "dtype": dtype,
        "batch": args.batch,
        "input_len": args.input_len,
        "requests": args.requests,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "peer": "transformers Qwen3Model (sdpa)",
        "peer_seconds": peer_seconds,
        "peer_tokens_per_s": tokens / peer_seconds,
        "vs_peer": peer_seconds / seconds,
        "min_cosine_vs_peer": min(cosines),
    }
    print(json.dumps(report, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
