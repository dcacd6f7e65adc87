"""The GPU fast path gives the reference's tokens: CUDA graphs and overlap scheduling with each
GPU attention backend against eager torch_native (and transformers) on the same random weights."""

from __future__ import annotations

import importlib.util
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
from small_models import SMALL_LLAMA, random_model  # noqa: E402

from radixserve.model_loader.loader import build_hf_reference, load_model_source  # noqa: E402
from radixserve.sampling.sampling_params import SamplingParams  # noqa: E402

NEW = 48
BACKENDS = ["triton"] + (["flashinfer"] if importlib.util.find_spec("flashinfer") else [])
FP32_BACKENDS = ["triton"]  # flashinfer kernels are half precision only


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return random_model(tmp_path_factory.mktemp("cfg"), "small-llama", SMALL_LLAMA)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(32, SMALL_LLAMA["vocab_size"], 10, 300, seed=11)


def generate(model: str, dtype: str, prompts, params=None, **kw) -> dict[str, dict]:
    source = load_model_source(model, dtype=dtype, device="cuda")
    scheduler = make_scheduler(
        model, source, device="cuda", dtype=dtype, max_total_tokens=20000, **kw
    )
    return run_to_completion(scheduler, prompts, params or greedy(NEW)), scheduler


@pytest.fixture(scope="module")
def eager_fp32(model_path, prompts):
    results, _ = generate(
        model_path,
        "float32",
        prompts,
        attention_backend="torch_native",
        disable_cuda_graph=True,
        disable_overlap=True,
    )
    return results


def test_eager_reference_matches_transformers(model_path, prompts, eager_fp32):
    source = load_model_source(model_path, dtype="float32", device="cuda")
    hf = build_hf_reference(source).to("cuda")
    for i in range(0, len(prompts), 8):  # a sample: transformers is slow
        ids = hf_greedy_cuda(hf, prompts[i])
        assert eager_fp32[f"r{i}"]["ids"] == ids


def hf_greedy_cuda(hf, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt], device="cuda"),
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def test_overlap_is_exact_fp32(model_path, prompts, eager_fp32):
    """Same kernels scheduled with overlap (torch_native never captures graphs): identical."""
    results, scheduler = generate(model_path, "float32", prompts, attention_backend="torch_native")
    assert scheduler.worker.model_runner.cuda_graph_runner is None and scheduler.overlap
    assert token_agreement(results, eager_fp32) == 1.0


@pytest.mark.parametrize("backend", FP32_BACKENDS)
def test_graphs_match_eager_same_backend_fp32(model_path, prompts, backend):
    """Graph replay (padded batches) against the same backend run eagerly."""
    eager, _ = generate(
        model_path,
        "float32",
        prompts,
        attention_backend=backend,
        disable_cuda_graph=True,
        disable_overlap=True,
    )
    results, scheduler = generate(model_path, "float32", prompts, attention_backend=backend)
    assert scheduler.worker.model_runner.cuda_graph_runner is not None
    agreement = token_agreement(results, eager)
    print(f"{backend} graphs+overlap vs eager fp32 agreement {agreement:.4f}")
    assert agreement >= 0.99


@pytest.mark.parametrize("backend", FP32_BACKENDS)
def test_graphs_sample_like_eager_fp32(model_path, prompts, backend):
    """Batches that the sampler decides (seeded sampling, penalties, logprobs beside greedy
    rows): the replayed graph's own greedy choice must give way to the sampler's, in the
    tokens returned and in the future-token ring that the next step reads."""
    params = [
        SamplingParams(max_new_tokens=NEW, temperature=0.8, top_k=20, seed=i, ignore_eos=True)
        if i % 3 == 0
        else greedy(NEW, repetition_penalty=1.3)
        if i % 3 == 1
        else greedy(NEW)
        for i in range(len(prompts))
    ]
    eager, _ = generate(
        model_path,
        "float32",
        prompts,
        params,
        attention_backend=backend,
        disable_cuda_graph=True,
        disable_overlap=True,
    )
    results, scheduler = generate(model_path, "float32", prompts, params, attention_backend=backend)
    assert scheduler.worker.model_runner.cuda_graph_runner is not None and scheduler.overlap
    agreement = token_agreement(results, eager)
    print(f"{backend} sampled graphs+overlap vs eager fp32 agreement {agreement:.4f}")
    assert agreement >= 0.99


@pytest.mark.parametrize("backend", FP32_BACKENDS)
def test_fast_backends_fp32(model_path, prompts, eager_fp32, backend):
    results, scheduler = generate(model_path, "float32", prompts, attention_backend=backend)
    assert scheduler.worker.model_runner.cuda_graph_runner is not None and scheduler.overlap
    agreement = token_agreement(results, eager_fp32)
    print(f"{backend} fp32 agreement {agreement:.4f}")
    assert agreement >= 0.99


@pytest.fixture(scope="module")
def bf16_reference(model_path, prompts):
    results, _ = generate(
        model_path,
        "bfloat16",
        prompts,
        attention_backend="torch_native",
        disable_cuda_graph=True,
        disable_overlap=True,
    )
    return results


@pytest.fixture(scope="module")
def hf_bf16_fp32(model_path):
    """transformers on the engine's bf16 weights, run in bf16 and (upcast) in float32."""
    source = load_model_source(model_path, dtype="bfloat16", device="cuda")
    return (
        build_hf_reference(source, dtype=torch.bfloat16).to("cuda"),
        build_hf_reference(source, dtype=torch.float32).to("cuda"),
    )


def last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids], device="cuda")).logits[0, -1].float()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fast_backends_bf16_diverge_only_at_near_ties(
    model_path, prompts, bf16_reference, hf_bf16_fp32, backend
):
    """bf16, CUDA graphs and overlap against eager torch_native in bf16.

    Random weights give flat next-token distributions whose top two logits are often closer
    than bf16 rounding moves them, so greedy runs of two correct bf16 implementations part
    ways (measured 0.61 agreement over 48 tokens on the H200; float32 agrees exactly, above).
    What is checked instead is that every parting is such a near-tie: at the first divergence
    of each request, on the common prefix, the float32 logits of the two chosen tokens differ
    by no more than twice the bf16 rounding noise measured on that same prefix (bf16 vs float32
    transformers), and both tokens are among the float32 top 3.
    """
    results, scheduler = generate(model_path, "bfloat16", prompts, attention_backend=backend)
    assert scheduler.worker.model_runner.cuda_graph_runner is not None and scheduler.overlap
    hf_bf16, hf_fp32 = hf_bf16_fp32
    divergences = 0
    for i, prompt in enumerate(prompts):
        ours, ref = results[f"r{i}"]["ids"], bf16_reference[f"r{i}"]["ids"]
        assert len(ours) == len(ref) == NEW
        at = next((j for j, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), None)
        if at is None:
            continue
        divergences += 1
        prefix = prompt + ref[:at]
        exact, rounded = last_logits(hf_fp32, prefix), last_logits(hf_bf16, prefix)
        noise = (exact - rounded).abs().max().item()
        gap = (exact[ours[at]] - exact[ref[at]]).abs().item()
        top3 = set(exact.topk(3).indices.tolist())
        print(f"{backend} r{i} step {at}: gap {gap:.4f}, bf16 noise {noise:.4f}")
        assert gap <= 2 * noise, (i, at, gap, noise)
        assert {ours[at], ref[at]} <= top3, (i, at, top3)
    agreement = token_agreement(results, bf16_reference)
    print(f"{backend} bf16 agreement {agreement:.4f}, {divergences} of {len(prompts)} diverged")
