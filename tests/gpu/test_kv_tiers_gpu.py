"""The KV tiers on CUDA: pinned back-ups and restores on the copy stream move exact bytes, and a
multi-turn workload over a pool far smaller than its prefixes gives the same greedy tokens with
the host tier as without, with CUDA graphs and overlap scheduling on."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_harness import greedy, make_scheduler, run_to_completion  # noqa: E402

from radixserve.mem_cache.host_pool import HostKVPool  # noqa: E402
from radixserve.mem_cache.memory_pool import TokenToKVPool  # noqa: E402
from radixserve.model_loader.loader import load_model_source  # noqa: E402


@pytest.mark.parametrize("runs", [1, 30, 300])
def test_backup_and_restore_move_exact_bytes_across_streams(runs: int) -> None:
    """300 host slots in 1, 30 or 300 runs of consecutive slots (300: past MAX_RUNS, the
    gather fallback)."""
    pool = TokenToKVPool(1024, 4, 2, 64, torch.bfloat16, "cuda")
    for layer in range(4):
        pool.k_buffers[layer].normal_()
        pool.v_buffers[layer].normal_()
    before = [b.clone() for b in (*pool.k_buffers, *pool.v_buffers)]
    host = HostKVPool(pool, 2048)
    source = torch.randperm(1024)[:300] + 1
    taken = host.allocator.alloc(600).view(runs, 600 // runs)  # each row: a run, then a gap
    host_slots = taken[:, : 300 // runs].flatten()
    host.backup(source, host_slots)
    for buffer in (*pool.k_buffers, *pool.v_buffers):
        buffer[source.cuda()] = 0  # the device copy goes (as on eviction)
    target = torch.randperm(1024)[:300] + 1
    host.restore(host_slots, target)
    torch.cuda.current_stream().synchronize()  # the compute stream waited for the copy
    for old, new in zip(before, (*pool.k_buffers, *pool.v_buffers), strict=True):
        assert torch.equal(new[target.cuda()], old[source.cuda()])
    assert len(host.pop_restore_seconds()) == 1


def test_host_tier_keeps_greedy_outputs_under_graphs_and_overlap() -> None:
    source = load_model_source("random:tiny-llama", dtype="float32", device="cuda")
    vocab = source.config.vocab_size

    def run(**tiers) -> tuple[list[list[int]], int]:
        scheduler = make_scheduler(
            "random:tiny-llama", source, device="cuda", dtype="float32",
            attention_backend="triton", max_total_tokens=512, **tiers,
        )  # fmt: skip
        rng = random.Random(0)
        contexts = [[rng.randrange(vocab) for _ in range(100)] for _ in range(8)]
        outputs, hits = [], 0
        for _ in range(4):
            for i, context in enumerate(contexts):
                context += [rng.randrange(vocab) for _ in range(16)]
                result = run_to_completion(scheduler, [context], greedy(16))["r0"]
                outputs.append(result["ids"])
                hits += result["cached"]
                contexts[i] = context + result["ids"]
        return outputs, hits

    plain, plain_hits = run()
    for policy in ("write_back", "write_through"):
        tiered, hits = run(kv_host_memory=0.05, kv_write_policy=policy)
        assert tiered == plain
        assert hits >= 2 * plain_hits and hits > 0
