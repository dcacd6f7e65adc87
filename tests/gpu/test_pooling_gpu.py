"""Embedding and reranking models on the GPU's path (fused rotary + KV store, the Triton or
FlashInfer extend kernels, overlap scheduling, no CUDA graphs) against transformers on the same
weights, float32: a Qwen3-Embedding-shaped model (last token, normalised) with mixed lengths,
chunks and prefix hits, and a Qwen3-Reranker-shaped one (yes/no logits), each backend."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_harness import random_prompts  # noqa: E402
from pooling_checkpoints import (  # noqa: E402
    VOCAB,
    embedding_checkpoint,
    yes_no_reranker_checkpoint,
)
from test_pooling_parity import cosine, pool_all  # noqa: E402

from radixserve.scheduler.scheduler_process import build_scheduler  # noqa: E402
from radixserve.server_args import ServerArgs  # noqa: E402

# FlashInfer builds no kernels for these tiny models' 16-wide heads (nor float32 ones); the
# backends' own agreement is tests/gpu/test_attention_backends.py's
BACKENDS = ["triton"]


def gpu_scheduler(checkpoint: Path, backend: str):
    args = ServerArgs(
        model=str(checkpoint),
        device="cuda",
        dtype="float32",
        attention_backend=backend,
        max_total_tokens=8192,
        chunked_prefill_size=16,
    )
    return build_scheduler(args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_embeddings_match_transformers_on_the_gpu(tmp_path, backend):
    import transformers

    checkpoint = embedding_checkpoint(tmp_path / "Qwen3-Embedding-tiny")
    hf = transformers.Qwen3Model.from_pretrained(checkpoint).eval()
    scheduler = gpu_scheduler(checkpoint, backend)
    assert scheduler.overlap and scheduler.worker.model_runner.cuda_graph_runner is None
    prompts = random_prompts(24, VOCAB, 1, 60, seed=11)
    prompts += [prompts[0] + [3, 4], prompts[1][:-1] + [7]]
    got = pool_all(scheduler, prompts)
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            want = F.normalize(hf(torch.tensor([ids])).last_hidden_state[0, -1], dim=-1)
        assert cosine(got[i], want.numpy()) >= 0.9999


@pytest.mark.parametrize("backend", BACKENDS)
def test_yes_no_reranker_matches_transformers_on_the_gpu(tmp_path, backend):
    import transformers

    checkpoint = yes_no_reranker_checkpoint(tmp_path)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(checkpoint).eval()
    scheduler = gpu_scheduler(checkpoint, backend)
    vocab = scheduler.model.tokenizer.get_vocab()
    query = random_prompts(1, VOCAB, 30, 30, seed=1)[0]
    prompts = [query + doc for doc in random_prompts(8, VOCAB, 1, 40, seed=2)]
    got = pool_all(scheduler, prompts)
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        want = torch.sigmoid(logits[vocab["yes"]] - logits[vocab["no"]]).item()
        assert np.isclose(got[i][0], want, atol=1e-4)
