"""DeepSeek's MLA on the GPU: the Triton MLA decode kernel at DeepSeek's sizes (latent 512 +
rope 64; V2-Lite's 16 heads and V3's 128) in bf16 against the float32 torch reference, batch 1
to 64, lengths on and off the kernel's blocks, ragged batches, inside a CUDA graph replayed at
other lengths; the extend path (kernels/mla_extend.py) at the same sizes against a float64
reference, prefixes cached or not, in one group and several; the absorbed projections' per-head
GEMVs against torch.bmm; and the tiny DeepSeek V3 and V2-Lite layouts end to end on the
fast path (the MLA kernel in the captured decode graphs, the fused MoE with the model's own
routing, overlap scheduling) against the model's own torch path, float32."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_harness import (  # noqa: E402
    greedy,
    make_scheduler,
    random_prompts,
    run_to_completion,
    token_agreement,
)
from mla_extend_case import dense_extend, extend_case  # noqa: E402

from radixserve.kernels import triton_support  # noqa: E402
from radixserve.layers import mla  # noqa: E402
from radixserve.layers.mla import mla_decode_native, num_sms  # noqa: E402
from radixserve.model_loader.loader import load_model_source  # noqa: E402

LATENT, ROPE = 512, 64


def latent_case(seq_lens: list[int], heads: int, dtype=torch.bfloat16, seed: int = 0):
    """A pool with each request's slots scattered, and absorbed queries."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(seq_lens)
    pool = torch.randn(total + 2, 1, LATENT + ROPE, device="cuda", generator=g).to(dtype)
    # rows a multiple of 16 wide: Triton specializes the kernel on the row stride, and one
    # stride for every case saves a compile per case (the kernel takes any stride)
    width = -(-(max(seq_lens) + 8) // 16) * 16
    req_to_token = torch.zeros(len(seq_lens) + 1, width, dtype=torch.int32, device="cuda")
    order = torch.randperm(total, device="cuda", generator=g).to(torch.int32) + 1
    start = 0
    for b, n in enumerate(seq_lens):
        req_to_token[b + 1, :n] = order[start : start + n]
        start += n
    rows = torch.arange(1, len(seq_lens) + 1, device="cuda")
    lens = torch.tensor(seq_lens, device="cuda")
    q = torch.randn(len(seq_lens), heads, LATENT + ROPE, device="cuda", generator=g).to(dtype)
    return q, pool, req_to_token, rows, lens


def relative_error(out: torch.Tensor, q, pool, req_to_token, rows, lens, scale: float) -> float:
    """out against the float32 torch reference on the same (bf16-rounded) inputs."""
    max_len = int(lens.max())
    ref = mla_decode_native(
        q.float(), pool.float(), req_to_token, rows, lens, max_len, LATENT, scale
    )
    return ((out.float() - ref).norm() / ref.norm()).item()


def ragged(bs: int, longest: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, longest + 1, (bs,), generator=g).tolist()


# batch 1 to 64; lengths off every block (32- and 64-token tiles, 64-token splits) and on them;
# ragged batches whose requests fill different numbers of splits
LENGTHS = {
    "bs1-short": [1],
    "bs1-odd": [4097],
    "bs1-long": [33000],
    "bs4-ragged": [1, 77, 4096, 33000],
    "bs8-edges": [31, 32, 33, 63, 64, 65, 127, 129],
    "bs64-ragged": ragged(64, 3000, seed=5),
}


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("case", LENGTHS)
def test_mla_decode_kernel_matches_reference_bf16(heads, case):
    from radixserve.kernels.mla_decode import default_config, mla_decode_fwd, num_splits

    seq_lens = LENGTHS[case]
    q, pool, req_to_token, rows, lens = latent_case(seq_lens, heads)
    scale, sms = 192**-0.5, num_sms(q.device)
    out = mla_decode_fwd(
        q[..., :LATENT], q[..., LATENT:], pool, req_to_token, rows, lens, scale, sms
    )
    assert out.shape == (len(seq_lens), heads, LATENT) and out.dtype == torch.bfloat16
    err = relative_error(out, q, pool, req_to_token, rows, lens, scale)
    splits = num_splits(len(seq_lens), heads, sms, default_config(heads, q.dtype).block_h)
    print(f"MLA decode bf16, {heads} heads, {case} ({splits} splits): relative error {err:.2e}")
    assert err < 1e-2


@pytest.mark.parametrize("heads", [16, 128])
def test_mla_decode_replays_in_a_cuda_graph_at_other_lengths(heads):
    from radixserve.kernels.mla_decode import mla_decode_fwd

    q, pool, req_to_token, rows, lens = latent_case([300, 5, 2000], heads, seed=1)
    static_lens = lens.clone()
    sms = num_sms(q.device)
    halves = q[..., :LATENT], q[..., LATENT:]
    mla_decode_fwd(*halves, pool, req_to_token, rows, static_lens, 0.1, sms)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mla_decode_fwd(*halves, pool, req_to_token, rows, static_lens, 0.1, sms)
    for new_lens in ([300, 5, 2000], [1, 1999, 64], [299, 6, 2001], [2007, 1, 33]):
        static_lens.copy_(torch.tensor(new_lens))
        graph.replay()
        err = relative_error(out, q, pool, req_to_token, rows, static_lens, 0.1)
        assert err < 1e-2, (new_lens, err)


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("group_tokens", [mla.EXPAND_GROUP_TOKENS, 1024])
def test_mla_extend_matches_reference_bf16(heads, group_tokens, monkeypatch):
    """Prompts without a prefix, chunks on a cached one, a one-token row (a mixed pass), on
    and off the 64-token tiles; bf16 against float64 on the same bf16 inputs. With 1,024-key
    groups the pass goes in four launches: the first two requests together, the rest alone
    (the 2,000-key one over the bound)."""
    monkeypatch.setattr(mla, "EXPAND_GROUP_TOKENS", group_tokens)
    prefix, new = [0, 0, 300, 1500, 63], [1, 700, 129, 500, 1]
    case = extend_case(prefix, new, heads, 512, 64, 128, 128, torch.bfloat16, "cuda", seed=heads)
    scale = 192**-0.5
    out = mla.mla_extend(case.q, case.pool, case.batch, case.expand, 512, scale)
    ref = dense_extend(case, scale)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    print(f"MLA extend, {heads} heads, groups of {group_tokens}: relative error {err:.2e}")
    assert err < 1e-2, err


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("rows", [1, 4])
def test_absorbed_projections_per_head_match_bmm_bf16(heads, rows):
    """W_UK (128 -> 512 a head) on q_nope's strided view and W_UV (512 -> 128) into a
    token-major output, as decode runs them at a few rows (kernels/mla_absorb.py), against
    torch.bmm on the same bf16 inputs."""
    from radixserve.kernels.mla_absorb import per_head_gemv

    g = torch.Generator(device="cuda").manual_seed(rows + heads)
    bf = torch.bfloat16
    q = torch.randn(rows, heads, 192, device="cuda", generator=g).to(bf)
    # output-major, as DeepseekMLA keeps them: [heads, out, in]
    w_uk = (torch.randn(heads, LATENT, 128, device="cuda", generator=g) / 128**0.5).to(bf)
    w_uv = (torch.randn(heads, 128, LATENT, device="cuda", generator=g) / LATENT**0.5).to(bf)
    q_latent = per_head_gemv(q[..., :128], w_uk)
    want = torch.bmm(q[..., :128].transpose(0, 1), w_uk.transpose(1, 2)).transpose(0, 1)
    assert ((q_latent.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
    out = torch.empty(rows, heads, 128, device="cuda", dtype=bf)
    per_head_gemv(q_latent, w_uv, out)
    want = torch.bmm(q_latent.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
    assert ((out.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


@pytest.mark.parametrize("preset", ["tiny-deepseek-v3", "tiny-deepseek-v2-lite"])
def test_fp32_graphs_and_overlap_match_the_torch_path(preset, monkeypatch):
    model = f"random:{preset}"
    # half of them behind one 96-token prefix: extends over cached prefixes, chunk by chunk
    shared = random_prompts(1, 1024, 96, 96, seed=16)[0]
    prompts = [shared + tail for tail in random_prompts(8, 1024, 1, 100, seed=18)]
    prompts += random_prompts(8, 1024, 10, 200, seed=17)

    def generate(**kw):
        source = load_model_source(model, dtype="float32", device="cuda")
        scheduler = make_scheduler(
            model, source, device="cuda", dtype="float32", chunked_prefill_size=64, **kw
        )
        return run_to_completion(scheduler, prompts, greedy(24)), scheduler

    fast, scheduler = generate()
    runner = scheduler.worker.model_runner
    assert runner.cuda_graph_runner is not None and scheduler.overlap
    assert runner.attention_backend_name == "triton"
    assert scheduler.get_server_info()["prefix_cache_hit_tokens"] > 0
    monkeypatch.setattr(triton_support, "enabled_for", lambda x: False)
    eager, _ = generate(
        attention_backend="torch_native", disable_cuda_graph=True, disable_overlap=True
    )
    agreement = token_agreement(fast, eager)
    print(
        f"{preset}: fast path (MLA kernel, graphs, overlap) vs torch path agreement {agreement:.4f}"
    )
    assert agreement >= 0.99
