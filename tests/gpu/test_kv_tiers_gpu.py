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
    """300 host slots in 1, 30 or 300 runs of consecutive slots (300 runs of one slot: the
    gather fallback), restored in two queued parts issued as one."""
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
    host.queue_restore(host_slots[:100], target[:100])
    host.queue_restore(host_slots[100:], target[100:])
    restore = host.issue_restores()
    assert restore is not None
    restore.wait_all()
    torch.cuda.current_stream().synchronize()  # the compute stream waited for the copy
    for old, new in zip(before, (*pool.k_buffers, *pool.v_buffers), strict=True):
        assert torch.equal(new[target.cuda()], old[source.cuda()])
    assert len(host.pop_restore_seconds()) == 1


def test_each_layer_reads_its_rows_once_its_wait_is_queued() -> None:
    """The per-layer waits with real streams: a restore of ~1 GB (8B-shaped layers) is issued
    on the copy stream, then on the compute stream each layer waits for its group and copies
    its restored rows out at once, as a pass's attention would read them. Every layer's
    reads see the restored bytes, and the first layer's read does not wait for the whole
    restore (it ends before the copy stream's last group does)."""
    layers, slots = 32, 8192
    pool = TokenToKVPool(slots, layers, 8, 128, torch.bfloat16, "cuda")
    host = HostKVPool(pool, slots)
    for buffer in (*pool.k_buffers, *pool.v_buffers):
        buffer.normal_()
    want = [b[1 : slots + 1].clone() for b in (*pool.k_buffers, *pool.v_buffers)]
    host_slots = host.allocator.alloc(slots)
    device_slots = torch.arange(1, slots + 1)
    host.backup(device_slots, host_slots)
    for buffer in (*pool.k_buffers, *pool.v_buffers):
        buffer.zero_()  # evicted: a read that does not wait sees zeros
    host.queue_restore(host_slots, device_slots)
    restore = host.issue_restores()
    assert restore is not None
    first_read = torch.cuda.Event(enable_timing=True)
    read = []
    for layer in range(layers):
        restore.wait(layer)
        read.append((pool.k_buffers[layer][1:].clone(), pool.v_buffers[layer][1:].clone()))
        if layer == 0:
            first_read.record()
    restore.wait_all()
    torch.cuda.synchronize()
    for layer, (k, v) in enumerate(read):
        assert torch.equal(k, want[layer]), f"layer {layer} read K before its copy landed"
        assert torch.equal(v, want[layers + layer]), f"layer {layer} read V before its copy"
    begin, end = host._restore_timings[-1]
    whole = begin.elapsed_time(end)
    assert begin.elapsed_time(first_read) < whole, "layer 0 waited for the whole restore"


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
