"""The fused Triton kernels (kernels/fused_ops.py) against the torch code they replace, at real
sizes, and a model's fused CUDA forward against the same model forced onto its torch path.

The comparison helpers are shared with tests/unit/fused_ops_interpret_check.py, which runs them
at small sizes in Triton's CPU interpreter.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from small_models import SMALL_LLAMA, SMALL_QWEN3, random_model

from radixserve.forward.mode import ForwardMode
from radixserve.forward.worker_batch import ModelWorkerBatch
from radixserve.kernels import fused_ops, triton_support
from radixserve.layers.activation import gelu_tanh_and_mul_native, silu_and_mul_native
from radixserve.layers.layernorm import GemmaRMSNorm, RMSNorm
from radixserve.layers.rotary_embedding import RotaryEmbedding
from radixserve.mem_cache.memory_pool import quantize_fp8
from radixserve.model_executor.forward_inputs import build_forward_batch
from radixserve.model_executor.future_tokens import FutureSlots
from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_loader.loader import load_model_source
from radixserve.server_args import ServerArgs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# max |fused - reference| / max |reference|: the references round like the kernels, so what is
# left is summation order, FMA and approximate rsqrt/exp: float32 to a few ulp, half precision
# to a rounding flip (1-2 ulp: 2**-10 is float16's, 2**-7 bfloat16's, relative).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
MAX_POSITION = 4096


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.float().abs().max().clamp_min(1e-30)
    return float((actual.float() - expected.float()).abs().max() / scale)


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: str, gen: torch.Generator):
    return torch.randn(shape, generator=gen, device="cpu").to(device=device, dtype=dtype)


def _norm(
    hidden: int, dtype: torch.dtype, device: str, gen: torch.Generator, cls: type = RMSNorm
) -> RMSNorm:
    norm = cls(hidden, eps=1e-5).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.1 * _randn((hidden,), dtype, device, gen))
    return norm


def _rotary(head_dim: int, device: str) -> RotaryEmbedding:
    config = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    with torch.device(device):
        return RotaryEmbedding(config, head_dim, MAX_POSITION)


@torch.no_grad()
def check_rms_norm(
    rows: int, hidden: int, dtype, device: str, gen, cls: type = RMSNorm
) -> dict[str, float]:
    """Out of place, in place, on a strided view in place, and with the residual add (both
    outputs in place); `cls` GemmaRMSNorm for the (1 + w) form."""
    norm = _norm(hidden, dtype, device, gen, cls)
    eps, offset = norm.variance_epsilon, norm.unit_offset
    x = 3.0 * _randn((rows, hidden), dtype, device, gen)
    residual = _randn((rows, hidden), dtype, device, gen)
    expected = norm.forward_native(x)
    fresh = fused_ops.rms_norm(x, norm.weight, eps, unit_offset=offset)
    in_place = x.clone()
    returned = fused_ops.rms_norm(in_place, norm.weight, eps, out=in_place, unit_offset=offset)
    exp_out, exp_res = norm.forward_native(x, residual)
    x_io, res_io = x.clone(), residual.clone()
    out, res = fused_ops.fused_add_rms_norm(x_io, res_io, norm.weight, eps, offset)
    assert returned is in_place and out is x_io and res is res_io
    wide = _randn((rows, hidden + 32), dtype, device, gen)  # rows of a wider buffer
    before = wide.clone()
    strided = wide[:, 16 : 16 + hidden]
    expected_strided = norm.forward_native(strided)
    fused_ops.rms_norm(strided, norm.weight, eps, out=strided, unit_offset=offset)
    outside = torch.cat([wide[:, :16], wide[:, 16 + hidden :]], dim=1)
    before_outside = torch.cat([before[:, :16], before[:, 16 + hidden :]], dim=1)
    return {
        "rms_norm": rel_err(fresh, expected),
        "rms_norm_in_place": rel_err(in_place, expected),
        "rms_norm_strided_in_place": rel_err(strided, expected_strided),
        "outside_untouched": float(not torch.equal(outside, before_outside)),
        "add_rms_norm_out": rel_err(x_io, exp_out),
        "add_rms_norm_residual": rel_err(res_io, exp_res),
    }


@torch.no_grad()
def check_silu_and_mul(tokens: int, d: int, dtype, device: str, gen) -> dict[str, float]:
    """Against the torch code in float32, rounded once: the kernel's contract (the reference in
    half precision rounds after the silu too; the model tests cover that difference)."""
    gate_up = 2.0 * _randn((tokens, 2 * d), dtype, device, gen)
    expected = silu_and_mul_native(gate_up.float()).to(dtype)
    expected_gelu = gelu_tanh_and_mul_native(gate_up.float()).to(dtype)
    return {
        "silu_and_mul": rel_err(fused_ops.silu_and_mul(gate_up), expected),
        "gelu_tanh_and_mul": rel_err(fused_ops.gelu_tanh_and_mul(gate_up), expected_gelu),
    }


def check_store_cells(device: str, gen) -> dict[str, float]:
    """A decode step's scatter of KV slots into req_to_token (int64 values into an int32
    table), 300 distinct cells over two programs, against index_put_: 0.0 when identical."""
    table = torch.randint(0, 1000, (9, 40), generator=gen, dtype=torch.int32).to(device)
    cells = torch.randperm(9 * 40, generator=gen)[:300]
    rows, cols = (cells // 40).to(device), (cells % 40).to(device)
    values = torch.randint(0, 1 << 20, (300,), generator=gen).to(device)
    expected = table.clone()
    expected[rows, cols] = values.to(torch.int32)
    fused_ops.store_cells(table, rows, cols, values)
    return {"store_cells": float(not torch.equal(table, expected))}


@torch.no_grad()
def check_rotary_and_store_kv(
    tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype,
    device: str,
    gen,
    padded: int = 0,
    cache_dtype=None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    qk_norm_cls=None,
) -> dict[str, float]:
    """The fused kernel against RotaryEmbedding.forward in float32, rounded once (the kernel's
    contract), plus the pool's index store (an FP8 cache gets value / scale, saturated; its
    comparison is of the dequantized values, as `k_cache_fp8`: a rounding flip of the rotated
    k moves an FP8 value a step, 2**-3 relative). The last `padded` tokens are CUDA-graph
    padding: position 0, KV slot 0 (not compared: several tokens race to it). `qk_norm_cls`:
    the q and k heads normalized first in the same kernel (Qwen3's RMSNorm, Gemma 3's
    GemmaRMSNorm), against the norm's torch code per head, in the activation dtype as the
    reference rounds it, then the rotary."""
    cache_dtype = cache_dtype or dtype
    fp8 = cache_dtype.itemsize == 1
    rotary = _rotary(head_dim, device)
    qkv = _randn((tokens, (heads + 2 * kv_heads) * head_dim), dtype, device, gen)
    slots = tokens + 9
    k_cache = _randn((slots, kv_heads, head_dim), cache_dtype, device, gen)
    v_cache = _randn((slots, kv_heads, head_dim), cache_dtype, device, gen)
    positions = torch.randint(0, MAX_POSITION, (tokens,), generator=gen).to(device)
    loc = (torch.randperm(slots - 1, generator=gen)[:tokens] + 1).to(device)
    positions[tokens - padded :] = 0
    loc[tokens - padded :] = 0

    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q.reshape(-1, heads, head_dim), k.reshape(-1, kv_heads, head_dim)
    qk_norm = None
    if qk_norm_cls is not None:
        q_norm = _norm(head_dim, dtype, device, gen, qk_norm_cls)
        k_norm = _norm(head_dim, dtype, device, gen, qk_norm_cls)
        q, k = q_norm.forward_native(q), k_norm.forward_native(k)
        qk_norm = fused_ops.QKNorm(
            q_norm.weight, k_norm.weight, q_norm.variance_epsilon, q_norm.unit_offset
        )
    exp_q, exp_k = rotary(positions, q.float(), k.float())
    exp_q, exp_k = exp_q.to(dtype), exp_k.to(dtype)
    exp_k_cache, exp_v_cache = k_cache.clone(), v_cache.clone()
    exp_v = qkv[:, q_size + kv_size :].clone()
    if fp8:
        exp_k_cache[loc] = quantize_fp8(exp_k, kv_scales[0], cache_dtype)
        exp_v_cache[loc] = quantize_fp8(
            exp_v.reshape(-1, kv_heads, head_dim), kv_scales[1], cache_dtype
        )
    else:
        exp_k_cache[loc] = exp_k.to(cache_dtype)
        exp_v_cache[loc] = exp_v.reshape(-1, kv_heads, head_dim).to(cache_dtype)

    rotary.rotate_and_store_kv(
        positions, qkv, heads, kv_heads, k_cache, v_cache, loc, kv_scales, qk_norm
    )
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    k_metric = "k_cache_fp8" if fp8 else "k_cache"
    return {
        "rotary_q": rel_err(q, exp_q.reshape(tokens, -1)),
        "rotary_k": rel_err(k, exp_k.reshape(tokens, -1)),
        "v_untouched": float(not torch.equal(v, exp_v)),
        k_metric: rel_err(k_cache[1:].float(), exp_k_cache[1:].float()),
        "v_cache": float(not torch.equal(v_cache[1:], exp_v_cache[1:])),
    }


@contextmanager
def fused_path(on: bool):
    """Force the layers onto the fused kernels (on) or their torch code (off)."""
    with mock.patch.object(triton_support, "enabled_for", lambda x: on):
        yield


def _runner(model: str, dtype: str, device: str, backend: str, **overrides) -> ModelRunner:
    settings = {
        "model": model,
        "device": device,
        "dtype": dtype,
        "attention_backend": "torch_native" if device == "cpu" else backend,
        "max_total_tokens": 4096,
        "max_running_requests": 8,
        "disable_cuda_graph": True,
        "disable_overlap": True,
    }
    args = ServerArgs(**(settings | overrides))
    runner = ModelRunner(args, load_model_source(model, dtype=dtype, device=device))
    if device == "cpu" and backend == "triton":  # the registry keeps triton to CUDA
        from radixserve.layers.attention.triton_backend import TritonAttnBackend

        runner.attn_backend = TritonAttnBackend(runner.attention_context())
    return runner


def _pass(
    runner: ModelRunner, prefix: list[int], new: list[list[int]], slots: list
) -> torch.Tensor:
    """One pass of len(new) requests in rows 0.. that have `prefix` tokens cached: extend, or
    decode when every request brings one token."""
    decode = all(p > 0 and len(n) == 1 for p, n in zip(prefix, new, strict=True))
    seq_lens = [p + len(n) for p, n in zip(prefix, new, strict=True)]
    for row, (p, n) in enumerate(zip(prefix, new, strict=True)):
        runner.req_to_token_pool.write(row, p, slots[row][p : p + len(n)])
    batch = ModelWorkerBatch(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        input_ids=torch.tensor([t for n in new for t in n], dtype=torch.int64),
        req_pool_indices=torch.arange(len(new), dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        seq_lens_sum=sum(seq_lens),
        out_cache_loc=torch.cat(
            [s[p : p + len(n)] for s, p, n in zip(slots, prefix, new, strict=True)]
        ),
        sampling_info=None,
        extend_seq_lens=None if decode else [len(n) for n in new],
        extend_prefix_lens=None if decode else list(prefix),
    )
    fb = build_forward_batch(
        batch,
        runner.req_to_token_pool,
        runner.token_to_kv_pool,
        runner.attn_backend,
        runner.device,
        FutureSlots(1, len(new)),
    )
    runner.attn_backend.init_forward_metadata(fb)
    return runner.model(fb.input_ids, fb.positions, fb)


def model_passes(
    model: str,
    dtype: str,
    device: str,
    backend: str,
    fused: bool,
    prompt_lens: list[int],
    decode_steps: int = 2,
    **overrides,
) -> list[torch.Tensor]:
    """Logits of a prefill, a second chunk on top of that cached prefix, then `decode_steps`
    decode steps (random tokens, the same for either path: teacher-forced), on a fresh runner
    so the KV pool starts equal. `overrides`: more ServerArgs (quantization, KV dtype)."""
    runner = _runner(model, dtype, device, backend, **overrides)
    gen = torch.Generator().manual_seed(7)
    vocab = runner.model_config.vocab_size
    chunk = 4
    total = [n + chunk + decode_steps for n in prompt_lens]
    first = torch.cumsum(torch.tensor([1, *total[:-1]]), 0)  # slot 0 is reserved
    slots = [torch.arange(int(f), int(f) + t) for f, t in zip(first, total, strict=True)]
    logits = []
    with fused_path(fused), torch.no_grad():
        prefix = [0] * len(prompt_lens)
        decode = [1] * len(prompt_lens)
        for lens in (prompt_lens, [chunk] * len(prompt_lens), *[decode] * decode_steps):
            new = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lens]
            logits.append(_pass(runner, prefix, new, slots).float().cpu())
            prefix = [p + n for p, n in zip(prefix, lens, strict=True)]
    return logits


# ---- GPU tests -------------------------------------------------------------------------------

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOKENS = [1, 7, 4096]


def _assert_within(results: dict[str, float], dtype) -> None:
    for name, err in results.items():
        assert err <= TOLERANCE[dtype], (name, err, results)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_rms_norm(tokens, dtype, gen) -> None:
    _assert_within(check_rms_norm(tokens, 4096, dtype, "cuda", gen), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("head_dim", [128, 64])
def test_rotary_with_qk_norm(head_dim, tokens, dtype, gen) -> None:
    """Qwen3's q/k norm in the rotary kernel."""
    padded = 3 if tokens > 3 else 0
    results = check_rotary_and_store_kv(
        tokens, 32, 8, head_dim, dtype, "cuda", gen, padded, qk_norm_cls=RMSNorm
    )
    _assert_within(results, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_silu_and_mul(tokens, dtype, gen) -> None:
    _assert_within(check_silu_and_mul(tokens, 14336, dtype, "cuda", gen), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("head_dim", [128, 64])
def test_rotary_and_store_kv(head_dim, tokens, dtype, gen) -> None:
    padded = 3 if tokens > 3 else 0
    results = check_rotary_and_store_kv(tokens, 32, 8, head_dim, dtype, "cuda", gen, padded)
    _assert_within(results, dtype)


@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_rotary_stores_into_fp8_cache(tokens, gen) -> None:
    """value / scale, saturated, in float8_e4m3fn: equal to the pool's own quantization up to
    one FP8 step where the rotated k's last bit differs (v is a copy: exact)."""
    results = check_rotary_and_store_kv(
        tokens, 32, 8, 128, torch.bfloat16, "cuda", gen, 0, torch.float8_e4m3fn, (0.5, 2.0)
    )
    fp8_step = results.pop("k_cache_fp8")
    assert fp8_step <= 2**-3, fp8_step
    assert results.pop("v_cache") == 0.0 and results.pop("v_untouched") == 0.0
    _assert_within(results, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_norms(dtype, gen) -> None:
    _assert_within(check_rms_norm(300, 2304, dtype, "cuda", gen, GemmaRMSNorm), dtype)
    results = check_rotary_and_store_kv(7, 8, 4, 256, dtype, "cuda", gen, qk_norm_cls=GemmaRMSNorm)
    _assert_within(results, dtype)


@pytest.mark.parametrize(
    "shape",
    [
        ("qwen3-30b-a3b", 2048, 128, False),
        ("gpt-oss-20b", 2880, 32, True),
        ("deepseek", 2048, 64, None),
    ],
)
def test_router_logits_in_the_norm_launch(shape, gen) -> None:
    """Batch 1, bf16, the served MoE shapes: a router's logits computed in the norm's launch
    (`norm_and_project`) equal the norm's own kernel then the router's own product (Qwen3's
    bf16 GEMV, gpt-oss's biased one, DeepSeek's float32 router GEMV) to a rounding, the normed
    row and the residual sum too, also replayed in a CUDA graph after the inputs changed."""
    from radixserve.kernels.moe_gemv import router_gemv
    from radixserve.layers.moe.router import RouterLinear
    from radixserve.models.deepseek_v2 import DeepseekRouter
    from radixserve.models.llama import LlamaDecoderLayer

    name, hidden, experts, bias = shape
    if bias is None:  # DeepSeek's float32 router
        config = SimpleNamespace(hidden_size=hidden, num_experts_per_tok=6, topk_method="greedy")
        router = DeepseekRouter(config, experts).cuda()
        router.weight.data.copy_(_randn((experts, hidden), torch.float32, "cuda", gen) * 0.05)
        separate_logits = lambda x: router_gemv(x, router.weight)  # noqa: E731
    else:
        router = RouterLinear(hidden, experts, bias=bias).cuda().bfloat16()
        for param in router.parameters():
            param.data.copy_(_randn(param.shape, torch.bfloat16, "cuda", gen) * 0.05)
        separate_logits = router
    norm = _norm(hidden, torch.bfloat16, "cuda", gen)
    x = _randn((1, hidden), torch.bfloat16, "cuda", gen)
    residual = _randn((1, hidden), torch.bfloat16, "cuda", gen)

    def fused() -> tuple[torch.Tensor, ...]:
        normed, summed = LlamaDecoderLayer.norm_before(norm, router, x, residual)
        logits = router.logits_after_norm(normed)
        assert logits is not None, name  # the fused launch was taken
        return logits, normed, summed

    with torch.no_grad():
        fused()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fused()
        for _ in range(2):
            x.copy_(_randn((1, hidden), torch.bfloat16, "cuda", gen))
            graph.replay()
            normed, summed = norm(x.clone(), residual.clone())
            want = separate_logits(normed)
            assert captured[0].dtype == want.dtype, name
            assert rel_err(captured[0], want) < 1e-2, name
            assert rel_err(captured[1], normed) < 1e-3 and torch.equal(captured[2], summed), name


def test_store_cells(gen) -> None:
    assert check_store_cells("cuda", gen) == {"store_cells": 0.0}


def test_per_step_kernels_compile_once_for_every_batch_size() -> None:
    """The scatter runs eagerly every decode step and RMSNorm on every prefill's token count:
    a new count or an index view at another alignment must not compile a new variant
    mid-serving (seen as a second of idle GPU in the offline benchmark)."""
    table = torch.zeros(64, 300, dtype=torch.int32, device="cuda")
    # a model's hidden size: one row per program whatever the count (BLOCK_M stays 1)
    x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16)
    weight = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    kernels = (fused_ops._store_cells_kernel, fused_ops._rms_norm_kernel)

    def variants() -> list[int]:  # compiled so far, this session (Triton 3.x internals)
        return [len(k.device_caches[torch.cuda.current_device()][0]) for k in kernels]

    def step(n: int) -> None:
        packed = torch.arange(6 * n, device="cuda").view(6, n) % 64
        fused_ops.store_cells(table, packed[2], packed[1], packed[4])
        fused_ops.rms_norm(x[:n], weight, 1e-5)

    step(5)  # compiles this signature (other tests may have compiled others)
    before = variants()
    for n in (1, 2, 3, 16, 17, 32, 255, 256, 300):
        step(n)
    assert variants() == before


def test_rotary_casts_to_the_cache_dtype(gen) -> None:
    results = check_rotary_and_store_kv(
        7, 32, 8, 128, torch.float32, "cuda", gen, 0, torch.bfloat16
    )
    assert results["rotary_q"] <= TOLERANCE[torch.float32], results
    assert results["k_cache"] <= TOLERANCE[torch.bfloat16] and results["v_cache"] == 0, results


def test_kernels_replay_in_a_cuda_graph(gen) -> None:
    """Captured once, replayed on new inputs: no host syncs or allocations inside."""
    tokens, heads, kv_heads, head_dim, hidden = 8, 32, 8, 128, 4096
    dtype = torch.bfloat16
    norm = _norm(hidden, dtype, "cuda", gen)
    rotary = _rotary(head_dim, "cuda")
    x = _randn((tokens, hidden), dtype, "cuda", gen)
    residual = _randn((tokens, hidden), dtype, "cuda", gen)
    gate_up = _randn((tokens, 2 * 14336), dtype, "cuda", gen)
    qkv = _randn((tokens, (heads + 2 * kv_heads) * head_dim), dtype, "cuda", gen)
    k_cache = torch.zeros((64, kv_heads, head_dim), dtype=dtype, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    positions = torch.arange(tokens, device="cuda") + 100
    loc = torch.arange(tokens, device="cuda") + 1

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        normed, _ = fused_ops.fused_add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)
        rotary.rotate_and_store_kv(positions, qkv, heads, kv_heads, k_cache, v_cache, loc)
        return normed, fused_ops.silu_and_mul(gate_up)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, act = step()
    new_x, new_res = _randn(x.shape, dtype, "cuda", gen), _randn(x.shape, dtype, "cuda", gen)
    new_gate_up = _randn(gate_up.shape, dtype, "cuda", gen)
    new_qkv = _randn(qkv.shape, dtype, "cuda", gen)
    expected_out, expected_res = norm.forward_native(new_x, new_res)
    expected_act = silu_and_mul_native(new_gate_up)
    for static, new in ((x, new_x), (residual, new_res), (gate_up, new_gate_up), (qkv, new_qkv)):
        static.copy_(new)
    positions += 5
    loc += tokens
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(x, expected_out) <= TOLERANCE[dtype]
    assert rel_err(residual, expected_res) <= TOLERANCE[dtype]
    assert rel_err(act, expected_act) <= TOLERANCE[dtype]
    v_new = new_qkv[:, (heads + kv_heads) * head_dim :].reshape(tokens, kv_heads, head_dim)
    assert torch.equal(v_cache[tokens + 1 : 2 * tokens + 1], v_new)


SMALL_MODELS = {"llama": SMALL_LLAMA, "qwen3": SMALL_QWEN3}
GPU_BACKENDS = ["torch_native", "triton"]
# flashinfer's kernels are half precision only
BF16_BACKENDS = GPU_BACKENDS + (["flashinfer"] if importlib.util.find_spec("flashinfer") else [])
# three requests, and one: batch-1 decode and the LM head of one prompt take the GEMV
PROMPT_LENS = [[5, 130, 300], [130]]


@pytest.fixture(scope="module", params=sorted(SMALL_MODELS))
def small_model(request, tmp_path_factory) -> str:
    return random_model(tmp_path_factory.mktemp("cfg"), request.param, SMALL_MODELS[request.param])


@pytest.mark.parametrize("prompt_lens", PROMPT_LENS)
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_model_fused_matches_torch_path_fp32(small_model, backend, prompt_lens) -> None:
    fused = model_passes(small_model, "float32", "cuda", backend, True, prompt_lens)
    native = model_passes(small_model, "float32", "cuda", backend, False, prompt_lens)
    for a, b in zip(fused, native, strict=True):
        assert rel_err(a, b) < 1e-4
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("prompt_lens", PROMPT_LENS)
@pytest.mark.parametrize("backend", BF16_BACKENDS)
def test_model_fused_matches_torch_path_bf16(small_model, backend, prompt_lens) -> None:
    """In bf16 the fused path may round differently, but is no further from the float32
    model than the torch path is."""
    fused = model_passes(small_model, "bfloat16", "cuda", backend, True, prompt_lens)
    native = model_passes(small_model, "bfloat16", "cuda", backend, False, prompt_lens)
    exact = model_passes(small_model, "float32", "cuda", "triton", False, prompt_lens)
    for f, n, e in zip(fused, native, exact, strict=True):
        print(f"bf16 fused {rel_err(f, e):.4f} native {rel_err(n, e):.4f} vs fp32")
        assert rel_err(f, n) < 5e-2
        assert rel_err(f, e) <= 1.5 * rel_err(n, e) + 1e-3
