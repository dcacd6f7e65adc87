"""The new families on the GPU's fast path (fused kernels, the fused MoE, CUDA graphs with
MoE decode, overlap scheduling) against the eager torch_native reference on the same random
weights: float32 token agreement with triton; bf16 logits of prefill, chunk and decode passes
with each GPU backend (FlashInfer planning one wrapper per attention variant)."""

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
from small_models import (  # noqa: E402
    SMALL_GEMMA2,
    SMALL_GEMMA3,
    SMALL_MIXTRAL,
    SMALL_QWEN3_MOE,
    random_model,
)
from test_fused_ops import model_passes, rel_err  # noqa: E402

from radixserve.model_loader.loader import load_model_source  # noqa: E402

FAMILIES = {
    "qwen3-moe": SMALL_QWEN3_MOE,
    "mixtral": SMALL_MIXTRAL,
    "gemma2": SMALL_GEMMA2,
    "gemma3": SMALL_GEMMA3,
}
BACKENDS = ["triton"] + (["flashinfer"] if importlib.util.find_spec("flashinfer") else [])
NEW = 32


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> str:
    return random_model(tmp_path_factory.mktemp("cfg"), request.param, FAMILIES[request.param])


def generate(model: str, dtype: str, prompts, **kw):
    source = load_model_source(model, dtype=dtype, device="cuda")
    scheduler = make_scheduler(
        model, source, device="cuda", dtype=dtype, max_total_tokens=20000, **kw
    )
    return run_to_completion(scheduler, prompts, greedy(NEW)), scheduler


def test_fp32_graphs_and_overlap_match_eager_reference(family):
    prompts = random_prompts(24, 8192, 10, 300, seed=13)  # most longer than the windows
    eager, _ = generate(
        family,
        "float32",
        prompts,
        attention_backend="torch_native",
        disable_cuda_graph=True,
        disable_overlap=True,
    )
    fast, scheduler = generate(family, "float32", prompts, attention_backend="triton")
    assert scheduler.worker.model_runner.cuda_graph_runner is not None and scheduler.overlap
    agreement = token_agreement(fast, eager)
    print(f"{family}: triton graphs+overlap vs eager fp32 agreement {agreement:.4f}")
    assert agreement >= 0.99


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_pass_logits_match_torch_native(family, backend):
    lens = [5, 90, 300]
    fast = model_passes(family, "bfloat16", "cuda", backend, True, lens)
    native = model_passes(family, "bfloat16", "cuda", "torch_native", False, lens)
    for i, (f, n) in enumerate(zip(fast, native, strict=True)):
        assert rel_err(f, n) < 5e-2, (i, rel_err(f, n))
        assert (f.argmax(-1) == n.argmax(-1)).float().mean() >= 0.8, i
