"""A model too large for the device fails before loading, with a message that says what to do;
the CPU's default KV pool is a bounded share of the available memory; the weights are read
after the pool and the graphs only where the read's buffers fit beside them, and the read
writes into the parameters it found (graphs captured before it hold their addresses)."""

from __future__ import annotations

import pytest
import torch

from radixserve.layers.quantization.fp8 import Fp8Config
from radixserve.mem_cache.memory_pool import TokenToKVPool
from radixserve.model_executor import model_runner
from radixserve.model_executor.model_runner import (
    CPU_DEFAULT_KV_BYTES,
    GiB,
    MiB,
    ModelRunner,
    parameter_addresses,
    reads_weights_last,
    weight_bytes,
    weights_fit_problem,
)
from radixserve.model_loader import random_init
from radixserve.model_loader.loader import load_model_source
from radixserve.models.registry import get_model_class
from radixserve.server_args import ServerArgs


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_meta_sizing_equals_the_loaded_model(preset):
    config = load_model_source(f"random:{preset}", dtype="bfloat16", device="cpu").config
    model_cls = get_model_class(config.architecture)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            sized = weight_bytes(model_cls(config.hf_config))
        real = model_cls(config.hf_config)
    finally:
        torch.set_default_dtype(default)
    params = sum(p.numel() * 2 for p in real.parameters())
    assert sized == weight_bytes(real) and sized >= params > 0


def test_meta_sizing_builds_llama3_rope_models():
    """The Llama-3.2-1B shape (llama3 RoPE scaling, whose transformers initialiser copies its
    frequencies to the CPU) builds on the meta device: sizing must not need real tensors."""
    config = load_model_source("random:llama-3.2-1b", dtype="bfloat16", device="cpu").config
    model_cls = get_model_class(config.architecture)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = model_cls(config.hf_config)
    finally:
        torch.set_default_dtype(default)
    rotary = model.model.layers[0].self_attn.rotary
    assert rotary.cos_cache.is_meta
    # 1.24e9 parameters in bf16 (tied embeddings), plus the rotary tables
    assert 2 * config.matmul_parameters < weight_bytes(model) < 2.6e9


def test_weights_that_fit_pass():
    assert weights_fit_problem(10 * GiB, 11 * GiB, 80 * GiB, "cuda:0") is None


def test_weights_that_do_not_fit_say_what_to_do():
    problem = weights_fit_problem(140 * GiB, 70 * GiB, 80 * GiB, "cuda:0")
    assert problem is not None
    assert "cuda:0" in problem and "140.00 GiB" in problem and "70.00 GiB" in problem
    assert "--tp-size" in problem


def _cpu_runner(**overrides) -> ModelRunner:
    args = ServerArgs(model="random:tiny-llama", device="cpu", max_running_requests=4, **overrides)
    return ModelRunner(args, load_model_source(args.model, dtype="float32", device="cpu"))


def _per_token(runner: ModelRunner) -> int:
    cfg = runner.model_config
    return TokenToKVPool.bytes_per_token(
        cfg.num_hidden_layers, runner.local_kv_heads, cfg.head_dim, runner.dtype
    )


def test_cpu_kv_pool_defaults_to_a_bounded_share_of_available_memory(monkeypatch):
    """Plenty of memory: the pool stops at CPU_DEFAULT_KV_BYTES (so `make serve` stays small);
    little memory: it is the share of what is available."""
    runner = _cpu_runner()
    per_token = _per_token(runner)
    assert runner.max_total_tokens == CPU_DEFAULT_KV_BYTES // per_token
    available = 64 * MiB
    monkeypatch.setattr(model_runner, "available_memory_bytes", lambda: available)
    small = _cpu_runner()
    assert small.max_total_tokens == int(available * 0.85 * 0.5 // per_token)
    assert small.max_total_tokens < runner.max_total_tokens
    # an explicit capacity is taken as given
    assert _cpu_runner(max_total_tokens=512).max_total_tokens == 512


def test_the_weights_are_read_last_only_where_their_buffers_fit_beside_the_pool():
    total = 140 * GiB  # at 0.85, 21 GiB of headroom for serving's activations
    assert reads_weights_last(True, 10 * GiB, total, 0.85)
    # a small GPU, or a read too large for the headroom: the weights first, the pool intact
    assert not reads_weights_last(True, 10 * GiB, 24 * GiB, 0.85)
    assert not reads_weights_last(True, 20.5 * GiB, total, 0.85)  # the margin does not fit
    assert not reads_weights_last(True, 10 * GiB, total, 0.95)
    # an FP8 KV cache bakes the checkpoint's scales into the graphs: always first
    assert not reads_weights_last(False, 0, total, 0.85)


def test_loading_writes_into_the_parameters_in_place(monkeypatch):
    model_cls = get_model_class("LlamaForCausalLM")
    load = model_cls.load_weights
    before: dict[str, int] = {}

    def recording_load(self, weights):
        before.update(parameter_addresses(self))
        load(self, weights)

    monkeypatch.setattr(model_cls, "load_weights", recording_load)
    runner = _cpu_runner()
    assert before and parameter_addresses(runner.model) == before
    # loaded: the random weights are not the zeros the network was built with
    assert runner.model.model.embed_tokens.weight.abs().sum() > 0
    # the read comes last (the CPU has no graphs, but the same order)
    phases = list(runner.startup.seconds)
    assert phases.index("kv_allocation") < phases.index("weight_read")


def test_a_load_that_replaces_a_parameter_fails_the_start(monkeypatch):
    """Graphs captured before the read would replay over freed memory: refuse, loudly."""
    model_cls = get_model_class("LlamaForCausalLM")
    load = model_cls.load_weights

    def load_then_replace(self, weights):
        load(self, weights)
        self.lm_head.weight = torch.nn.Parameter(self.lm_head.weight.clone())

    monkeypatch.setattr(model_cls, "load_weights", load_then_replace)
    with pytest.raises(RuntimeError, match="replaced 1 parameters.*lm_head.weight"):
        _cpu_runner()


def test_a_random_model_drawn_on_a_gpu_holds_its_largest_tensor_twice():
    """Nothing is drawn until the weights are read, so the source is built here without CUDA."""
    gpu = load_model_source("random:tiny-llama", dtype="bfloat16", device="cuda")
    shapes = random_init.parameter_shapes(random_init.random_hf_config("tiny-llama"))
    largest = max(shape.numel() for _, shape in shapes)
    assert gpu.load_device_bytes == (4 + 2) * largest > 0  # the float32 draw, the bf16 cast
    assert load_model_source("random:tiny-llama", device="cpu").load_device_bytes == 0


def test_fp8_quantization_at_load_works_in_float32_copies_of_one_matrix():
    plain = _cpu_runner()
    assert plain.quantization is None
    fp8 = _cpu_runner(quantization="fp8")
    matrices = [
        p.shape[-2] * p.shape[-1] for p in fp8.model.parameters() if p.dtype == torch.float8_e4m3fn
    ]
    assert matrices and fp8.quantization.load_working_bytes(fp8.model) == 3 * 4 * max(matrices)
    # a per-channel FP8 checkpoint is copied as stored; a block-scaled one is dequantized first
    assert Fp8Config("compressed-tensors").load_working_bytes(fp8.model) == 0
    blocks = Fp8Config("fp8", (128, 128)).load_working_bytes(fp8.model)
    assert blocks == 3 * 4 * max(matrices)
