"""Embedding and reranking models against transformers on the same tiny random weights
(float32, CPU), through the in-process scheduler: continuous batching of mixed lengths,
prompts prefilled in chunks, and prefixes served from the radix cache all in play.

- Qwen3-Embedding's layout: last-token pooling + L2 normalisation, cosine >= 0.9999 against
  transformers' Qwen3Model with the same pooling, one request at a time and all at once;
  Matryoshka `dimensions` is the normalised cut of the same vector; mean pooling (radix cache
  off, chunk sums added) against transformers' mean;
- Qwen3-Reranker's (a causal LM scored by sigmoid(logit yes - logit no) at the last position)
  and a one-label Qwen3ForSequenceClassification (sigmoid of its score) against transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from engine_harness import make_scheduler, random_prompts
from pooling_checkpoints import (
    VOCAB,
    classifier_checkpoint,
    embedding_checkpoint,
    yes_no_reranker_checkpoint,
)

from radixserve.boundary import PoolingParams, TokenizedGenerateReqInput
from radixserve.sampling.sampling_params import SamplingParams

CHUNK = 16  # prompts longer than this are prefilled in chunks


def pool_all(scheduler, prompts, dims=None) -> dict[int, np.ndarray]:
    """Submit every prompt as a pooling request, step until idle: index -> vector."""
    for i, ids in enumerate(prompts):
        scheduler.handle_generate_request(
            TokenizedGenerateReqInput(
                f"p{i}", ids, SamplingParams(max_new_tokens=0), pooling=PoolingParams(dims)
            )
        )
    out = {}
    while scheduler.has_work():
        scheduler.step()
        for o in scheduler.pop_outputs():
            assert o.finished_reason == {"type": "stop"}, o.finished_reason
            out[int(o.rid[1:])] = np.frombuffer(o.pooled, dtype="<f4")
    return out


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("pooling")
    return {
        "embed": embedding_checkpoint(base / "Qwen3-Embedding-tiny"),
        "embed_mean": embedding_checkpoint(base / "mean-embedder", pooling="mean_tokens"),
        "yes_no": yes_no_reranker_checkpoint(base),
        "classifier": classifier_checkpoint(base / "classifier"),
    }


def prompts_with_shared_prefixes() -> list[list[int]]:
    """Mixed lengths (1 to 3 chunks), and prompts that extend others (radix cache hits)."""
    prompts = random_prompts(10, VOCAB, 1, 3 * CHUNK, seed=7)
    return prompts + [prompts[3] + [5, 6, 7], prompts[5][:-1] + [9]]


@torch.no_grad()
def hf_last_token_embedding(model, ids: list[int]) -> torch.Tensor:
    hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
    return F.normalize(hidden, dim=-1)


def test_qwen3_embedding_matches_transformers_alone_and_batched(checkpoints):
    hf = transformers.Qwen3Model.from_pretrained(checkpoints["embed"]).eval()
    prompts = prompts_with_shared_prefixes()
    scheduler = make_scheduler(str(checkpoints["embed"]), chunked_prefill_size=CHUNK)
    assert scheduler.model.task.task == "embed" and scheduler.model.task.normalize
    alone = {}
    for i, ids in enumerate(prompts):
        alone[i] = pool_all(scheduler, [ids])[0]
    batched = pool_all(scheduler, prompts)
    cut = pool_all(scheduler, prompts[:3], dims=16)
    assert scheduler.counters.prefix_cache_hit_tokens > 0  # the radix cache served prefixes
    for i, ids in enumerate(prompts):
        want = hf_last_token_embedding(hf, ids)
        for got in (alone[i], batched[i]):
            assert got.shape == (64,)
            assert cosine(got, want) >= 0.9999
            assert abs(np.linalg.norm(got) - 1.0) < 1e-5
    for i in range(3):
        want = F.normalize(hf_last_token_embedding(hf, prompts[i])[:16], dim=-1)
        assert cut[i].shape == (16,) and cosine(cut[i], want) >= 0.9999


def test_overlap_bookkeeping_two_full_batches_of_rows(checkpoints):
    """Under overlap (as on CUDA; the CPU runs each launch at once, so the bookkeeping alone is
    emulated) the next batch forms while the last still holds its request rows: no row runs
    out (an OutOfSlots crash before rows were sized for two batches), every row and KV slot
    given back, the same vectors."""
    hf = transformers.Qwen3Model.from_pretrained(checkpoints["embed"]).eval()
    scheduler = make_scheduler(str(checkpoints["embed"]), max_running_requests=4)
    scheduler.overlap = True
    prompts = random_prompts(18, VOCAB, 1, 8, seed=9)  # short: a batch is 4 requests
    got = pool_all(scheduler, prompts)
    for i, ids in enumerate(prompts):
        assert cosine(got[i], hf_last_token_embedding(hf, ids)) >= 0.9999
    pool = scheduler.worker.req_to_token_pool
    assert pool.available_size() == pool.size
    assert scheduler.tree_cache.protected_size() == 0


def test_mean_pooling_sums_chunks_without_the_prefix_cache(checkpoints):
    hf = transformers.Qwen3Model.from_pretrained(checkpoints["embed_mean"]).eval()
    prompts = prompts_with_shared_prefixes()
    scheduler = make_scheduler(str(checkpoints["embed_mean"]), chunked_prefill_size=CHUNK)
    assert scheduler.model.task.pooling == "mean" and scheduler.tree_cache.disabled
    got = pool_all(scheduler, prompts)
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            mean = hf(torch.tensor([ids])).last_hidden_state[0].mean(0)
        assert cosine(got[i], F.normalize(mean, dim=-1)) >= 0.9999


def test_yes_no_reranker_matches_transformers(checkpoints):
    hf = transformers.Qwen3ForCausalLM.from_pretrained(checkpoints["yes_no"]).eval()
    scheduler = make_scheduler(str(checkpoints["yes_no"]), chunked_prefill_size=CHUNK)
    task = scheduler.model.task
    assert (task.task, task.head) == ("rerank", "yes_no")
    vocab = scheduler.model.tokenizer.get_vocab()
    yes, no = vocab["yes"], vocab["no"]
    query = random_prompts(1, VOCAB, 20, 20, seed=3)[0]
    prompts = [query + doc for doc in random_prompts(6, VOCAB, 1, 30, seed=4)]
    got = pool_all(scheduler, prompts)
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        want = torch.sigmoid(logits[yes] - logits[no]).item()
        assert got[i].shape == (1,) and abs(got[i][0] - want) < 1e-5


def test_sequence_classifier_matches_transformers(checkpoints):
    hf = transformers.Qwen3ForSequenceClassification.from_pretrained(
        checkpoints["classifier"]
    ).eval()
    scheduler = make_scheduler(str(checkpoints["classifier"]), chunked_prefill_size=CHUNK)
    assert (scheduler.model.task.task, scheduler.model.task.head) == ("rerank", "score")
    prompts = random_prompts(6, VOCAB, 1, 40, seed=5)
    prompts = [[t or 1 for t in p] for p in prompts]  # token 0 is its pad token
    got = pool_all(scheduler, prompts)
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            want = torch.sigmoid(hf(torch.tensor([ids])).logits[0, 0]).item()
        assert abs(got[i][0] - want) < 1e-5


def test_a_pooling_model_refuses_generation_and_the_reverse(checkpoints):
    scheduler = make_scheduler(str(checkpoints["embed"]))
    scheduler.handle_generate_request(
        TokenizedGenerateReqInput("g", [1, 2, 3], SamplingParams(max_new_tokens=4))
    )
    (out,) = scheduler.pop_outputs()
    assert (
        out.finished_reason["type"] == "error"
        and "does not generate" in out.finished_reason["message"]
    )
    generator = make_scheduler("random:tiny-qwen3")
    generator.handle_generate_request(
        TokenizedGenerateReqInput(
            "e", [1, 2], SamplingParams(max_new_tokens=0), pooling=PoolingParams()
        )
    )
    (out,) = generator.pop_outputs()
    assert "makes no embeddings" in out.finished_reason["message"]
