"""bench latency's static-batch loop on the CPU (the GPU runs add ceilings and overlap): it
decodes every request to its length and gives back every KV slot and request row."""

from __future__ import annotations

from radixserve.bench.latency import run_batch
from radixserve.mem_cache.chunk_cache import ChunkCache
from radixserve.model_loader.loader import load_model_source
from radixserve.scheduler.tp_worker import ModelWorker
from radixserve.server_args import ServerArgs


def test_run_batch_decodes_and_frees_everything():
    args = ServerArgs(
        model="random:tiny-llama", device="cpu", max_total_tokens=2048, max_running_requests=8
    )
    source = load_model_source(args.model, dtype="float32", device="cpu")
    worker = ModelWorker(args, source)
    runner = worker.model_runner
    cache = ChunkCache(runner.req_to_token_pool, runner.allocator)
    free_slots = runner.allocator.available_size()
    free_rows = runner.req_to_token_pool.available_size()
    for bs in (1, 3):
        result = run_batch(worker, cache, bs, 12, 6, source.config.vocab_size)
        assert result["bs"] == bs and result["overlap"] is False
        assert result["prefill_s"] > 0 and result["decode_step_s"] > 0
        assert result["decode_device_step_s"] is None  # no device timeline on the CPU
        assert runner.allocator.available_size() == free_slots
        assert runner.req_to_token_pool.available_size() == free_rows


def test_moe_decode_counts_the_experts_it_reads():
    """A MoE model's decode reads the routed experts only: batch 1 reads exactly top_k experts
    per MoE layer and step, a batch at most all of them; FP8 experts count one byte each."""
    from radixserve.bench.latency import dense_weight_bytes_per_step
    from radixserve.layers.moe.layer import FusedMoE

    args = ServerArgs(
        model="random:tiny-qwen3-moe",
        device="cpu",
        max_total_tokens=2048,
        max_running_requests=8,
        quantization="fp8",
    )
    source = load_model_source(args.model, dtype="float32", device="cpu")
    worker = ModelWorker(args, source)
    model = worker.model_runner.model
    cache = ChunkCache(worker.model_runner.req_to_token_pool, worker.model_runner.allocator)
    moe = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert len(moe) == 2  # layers 0 and 2; layer 1 is dense (mlp_only_layers)
    per_expert = moe[0].expert_bytes
    assert per_expert == 3 * 64 * 32 + (2 * 32 + 64) * 4  # FP8 values + float32 scales
    one = run_batch(worker, cache, 1, 12, 6, source.config.vocab_size)
    assert one["experts_per_moe_layer_step"] == 2  # top_k
    assert one["expert_bytes_per_step"] == 2 * 2 * per_expert
    many = run_batch(worker, cache, 8, 12, 6, source.config.vocab_size)
    assert 2 < many["experts_per_moe_layer_step"] <= 8
    dense = dense_weight_bytes_per_step(model)
    every_param = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.model.embed_tokens.weight
    assert dense == every_param - 2 * 8 * per_expert - embedding.numel() * 4
