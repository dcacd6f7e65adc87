"""GPU attention backends against a float64 dense reference and the torch_native backend.

Random paged batches (random slot permutations and req_to_token rows), GQA ratios 1/4/8,
head_dim 64/128, bf16 and fp16, decode / extend with cached prefixes / mixed. Each check is
the relative error ||out - ref|| / ||ref|| within the dtype's rounding (attention_cases.TOLERANCE)
and the pool holding this pass's K/V afterwards.
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from radixserve.forward.mode import ForwardMode
from radixserve.layers.attention.torch_native_backend import TorchNativeAttnBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from attention_cases import (  # noqa: E402  (after the skip marks: needs only torch)
    TOLERANCE,
    dense_reference,
    make_case,
    random_lengths,
    relative_error,
    run_backend,
    stored_kv_matches,
)

MODES = [ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED]
# (q heads, kv heads): GQA ratio 1, 4 and 8
HEADS = [(8, 8), (16, 4), (32, 4)]
HEAD_DIMS = [64, 128]
DTYPES = [torch.bfloat16, torch.float16]
GRID = list(itertools.product(MODES, HEADS, HEAD_DIMS, DTYPES))
# FlashInfer compiles one module per (dtype, head_dim, kernel) on first use, tens of seconds
# each: fp16 is checked at head_dim 128 only, every other combination in bf16.
FLASHINFER_GRID = [p for p in GRID if p[3] == torch.bfloat16 or p[2] == 128]
BACKEND_GRID = [("triton", p) for p in GRID] + [("flashinfer", p) for p in FLASHINFER_GRID]


def _ids(params) -> str:
    mode, (h, kvh), d, dtype = params
    return f"{mode.name.lower()}-h{h}kv{kvh}-d{d}-{str(dtype).removeprefix('torch.')}"


def _backend_class(name: str):
    if name == "flashinfer":
        pytest.importorskip("flashinfer")
        from radixserve.layers.attention.flashinfer_backend import FlashInferAttnBackend

        return FlashInferAttnBackend
    pytest.importorskip("triton")
    from radixserve.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend


@pytest.mark.parametrize(
    ("backend_name", "params"), BACKEND_GRID, ids=[f"{b}-{_ids(p)}" for b, p in BACKEND_GRID]
)
def test_backend_matches_dense_reference(backend_name, params) -> None:
    mode, (heads, kv_heads), head_dim, dtype = params
    # a seed fixed by the case's name: a failure reproduces (hash() of a str is salted per run)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{backend_name}-{_ids(params)}".encode()))
    for _ in range(2):
        prefix, extend = random_lengths(mode, gen)
        case = make_case(mode, prefix, extend, heads, kv_heads, head_dim, dtype, "cuda", gen)
        out = run_backend(_backend_class(backend_name)(case.context), case)
        assert out.shape == case.q.shape and out.dtype == dtype
        assert torch.isfinite(out).all()
        err = relative_error(out, dense_reference(case))
        assert err < TOLERANCE[dtype], f"{prefix=} {extend=} rel err {err:.2e}"
        assert stored_kv_matches(case)


@pytest.mark.parametrize("backend_name", ["triton", "flashinfer"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name.lower())
def test_backend_matches_torch_native(backend_name, mode) -> None:
    gen = torch.Generator().manual_seed(7)
    prefix, extend = random_lengths(mode, gen)
    dtype = torch.bfloat16
    case = make_case(mode, prefix, extend, 32, 8, 128, dtype, "cuda", gen)
    ref = run_backend(TorchNativeAttnBackend(case.context), case)
    out = run_backend(_backend_class(backend_name)(case.context), case)
    err = relative_error(out, ref)
    assert err < TOLERANCE[dtype], f"{prefix=} {extend=} rel err {err:.2e} vs torch_native"


# Gemma- and Mistral-like variants: a window shorter than most sequences, a soft-cap of the
# order of the scores (so tanh bends them), an FP8 pool (values on its grid: storing is exact),
# gpt-oss's attention sinks (with its 128-token window on alternate layers)
VARIANTS = {
    "window": {"sliding_window": 200},
    "sinks": {"sinks": True},
    "window-sinks": {"sliding_window": 128, "sinks": True},
    "window-softcap": {"sliding_window": 64, "logit_cap": 2.0},
    "fp8-kv": {"kv_dtype": torch.float8_e4m3fn, "kv_scales": (2**-2, 2**-3)},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name.lower())
@pytest.mark.parametrize("backend_name", ["triton", "flashinfer"])
def test_window_softcap_and_fp8_variants(backend_name, mode, variant) -> None:
    gen = torch.Generator().manual_seed(hash((backend_name, mode.name, variant)) % 2**31)
    dtype = torch.bfloat16
    for _ in range(2):
        prefix, extend = random_lengths(mode, gen)
        case = make_case(mode, prefix, extend, 32, 8, 128, dtype, "cuda", gen, **VARIANTS[variant])
        out = run_backend(_backend_class(backend_name)(case.context), case)
        assert torch.isfinite(out).all()
        err = relative_error(out, dense_reference(case))
        assert err < TOLERANCE[dtype], f"{prefix=} {extend=} rel err {err:.2e}"
        assert stored_kv_matches(case)


@pytest.mark.parametrize("backend_name", ["triton", "flashinfer"])
@pytest.mark.parametrize("heads", [(8, 8), (32, 8)], ids=["mha", "gqa4"])
def test_cuda_graph_replay_with_new_lengths(backend_name, heads) -> None:
    """Capture decode at a padded batch size, then replay other requests and lengths."""
    num_heads, kv_heads = heads
    head_dim, dtype, graph_bs, real_bs = 128, torch.bfloat16, 8, 5
    gen = torch.Generator().manual_seed(11)
    shape = dict(spare_rows=graph_bs, pool_size=8000, max_context=1600)

    def decode_case():
        prefix = torch.randint(0, 1500, (real_bs,), generator=gen).tolist()
        return make_case(
            ForwardMode.DECODE, prefix, [1] * real_bs, num_heads, kv_heads, head_dim,
            dtype, "cuda", gen, **shape,
        )  # fmt: skip

    captured = decode_case()
    backend = _backend_class(backend_name)(captured.context)
    fill = backend.get_cuda_graph_seq_len_fill_value()
    fb = captured.forward_batch
    static = {
        "req_pool_indices": torch.zeros(graph_bs, dtype=torch.int64, device="cuda"),
        "seq_lens": torch.full((graph_bs,), fill, dtype=torch.int64, device="cuda"),
        "out_cache_loc": torch.zeros(graph_bs, dtype=torch.int64, device="cuda"),
    }
    q = torch.zeros(graph_bs, num_heads * head_dim, dtype=dtype, device="cuda")
    k = torch.zeros(graph_bs, kv_heads * head_dim, dtype=dtype, device="cuda")
    v = torch.zeros_like(k)

    def load(case) -> torch.Tensor:
        """Copy a case into the captured pools and static inputs; padded host seq_lens."""
        src = case.forward_batch
        fb.token_to_kv_pool.k_buffers[0].copy_(src.token_to_kv_pool.k_buffers[0])
        fb.token_to_kv_pool.v_buffers[0].copy_(src.token_to_kv_pool.v_buffers[0])
        fb.req_to_token_pool.req_to_token.copy_(src.req_to_token_pool.req_to_token)
        for name, tensor in static.items():
            tensor[:real_bs] = getattr(src, name)
        for dst, part in ((q, case.q), (k, case.k), (v, case.v)):
            dst[:real_bs] = part
        padded = torch.full((graph_bs,), fill, dtype=torch.int64)
        padded[:real_bs] = src.seq_lens_cpu
        return padded

    padded = load(captured)
    fb.batch_size, fb.attn_backend = graph_bs, backend
    for name, tensor in static.items():
        setattr(fb, name, tensor)
    backend.init_cuda_graph_state(graph_bs)
    backend.init_forward_metadata_capture_cuda_graph(
        graph_bs, static["req_pool_indices"], static["seq_lens"], ForwardMode.DECODE
    )
    backend.forward(q, k, v, captured.layer, fb)  # warm-up: compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k, v, captured.layer, fb)

    for _ in range(2):
        replayed = decode_case()
        padded = load(replayed)
        backend.init_forward_metadata_replay_cuda_graph(
            graph_bs, static["req_pool_indices"], static["seq_lens"], int(padded.sum()), padded
        )
        out.fill_(float("nan"))
        graph.replay()
        err = relative_error(out[:real_bs], dense_reference(replayed))
        assert err < TOLERANCE[dtype], f"replay rel err {err:.2e}"
        # padded rows wrote their K/V to slot 0 and attended to something finite
        assert torch.isfinite(out).all()
