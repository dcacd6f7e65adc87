"""The pooling endpoints on real servers, as users call them: `radixserve serve --model DIR` on
a Qwen3-Embedding-shaped checkpoint (detected from its sentence-transformers files, no flag)
driven by the official `openai` client's `client.embeddings.create` (strings, token ids,
base64, dimensions), and a Qwen3-Reranker-shaped one on `/v1/rerank` and `/v1/score`;
vectors and scores against transformers on the same weights; every bad input a 400 naming its
field, generation refused on a pooling model (and the reverse), the server alive after all."""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import openai
import pytest
import requests
import torch
import torch.nn.functional as F
import transformers
from pooling_checkpoints import embedding_checkpoint, yes_no_reranker_checkpoint

from radixserve.bench.server_process import ServerProcess
from radixserve.frontend.embeddings.rerank_prompt import yes_no_prompt
from radixserve.model_loader.tokenizer import bundled_tokenizer

pytestmark = pytest.mark.slow
TEXTS = ["the cat sat on the mat", "a dog", "embeddings map text to vectors " * 8]


def serve(workdir, checkpoint, *extra):
    args = ["--model", str(checkpoint), "--max-total-tokens", "4096"]
    args += ["--chunked-prefill-size", "32", "--max-queued-requests", "64", *extra]
    return ServerProcess(args, log_path=workdir / "server.log")


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("embed")
    checkpoint = embedding_checkpoint(workdir / "Qwen3-Embedding-tiny")
    with serve(workdir, checkpoint, "--log-requests", "--log-format", "json") as server:
        yield server, checkpoint
    assert server.process.returncode == 0, (workdir / "server.log").read_text()[-3000:]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rerank")
    checkpoint = yes_no_reranker_checkpoint(workdir)
    with serve(workdir, checkpoint) as server:
        yield server, checkpoint
    assert server.process.returncode == 0, (workdir / "server.log").read_text()[-3000:]


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


@torch.no_grad()
def hf_embedding(hf, ids: list[int]) -> np.ndarray:
    return F.normalize(hf(torch.tensor([ids])).last_hidden_state[0, -1], dim=-1).numpy()


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_openai_client_embeddings_match_transformers(embedder):
    """The client asks for base64 itself when no encoding_format is given (and decodes it),
    so both encodings are on the wire here."""
    server, checkpoint = embedder
    hf = transformers.Qwen3Model.from_pretrained(checkpoint).eval()
    tokenizer = bundled_tokenizer()
    ids = [tokenizer.encode(t) for t in TEXTS]
    with client_of(server) as client:
        batch = client.embeddings.create(model="Qwen3-Embedding-tiny", input=TEXTS)
        one = client.embeddings.create(model="Qwen3-Embedding-tiny", input=TEXTS[2])
        by_ids = client.embeddings.create(model="Qwen3-Embedding-tiny", input=ids)
        packed = client.embeddings.create(
            model="Qwen3-Embedding-tiny", input=TEXTS, encoding_format="base64", dimensions=16
        )
    assert [d.index for d in batch.data] == [0, 1, 2]
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == sum(map(len, ids))
    for i, prompt in enumerate(ids):
        want = hf_embedding(hf, prompt)
        assert len(batch.data[i].embedding) == 64
        assert cosine(batch.data[i].embedding, want) >= 0.9999
        assert cosine(by_ids.data[i].embedding, want) >= 0.9999
        # asked for base64, the client hands the wire form over as it came
        packed_vector = np.frombuffer(base64.b64decode(packed.data[i].embedding), dtype="<f4")
        cut = F.normalize(torch.tensor(want[:16]), dim=-1).numpy()
        assert packed_vector.shape == (16,) and cosine(packed_vector, cut) >= 0.9999
    assert cosine(one.data[0].embedding, batch.data[2].embedding) >= 0.99999
    floats = requests.post(
        server.base_url + "/v1/embeddings", json={"input": "a dog"}, timeout=30
    ).json()
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    assert cosine(floats["data"][0]["embedding"], batch.data[1].embedding) >= 0.99999


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input.1"),
        ({"input": [[1, 2], []]}, "input.1"),
        ({"input": 3}, "input"),
        ({"input": ["a", 3]}, "input.1"),
        ({"input": [10**9]}, "input"),
        ({"input": ["x"] * 2049}, "input"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 65}, "dimensions"),
        ({"input": "x", "dimensions": "8"}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "word " * 5000}, "input"),
        ({"input": ["ok", "x" * 300_000]}, "input.1"),  # refused untokenized
        ({"input": ["x"] * 65}, "input"),  # more than the queue can ever hold
    ],
)
def test_bad_embedding_requests_are_400s_naming_the_field(embedder, body, param):
    server, _ = embedder
    reply = requests.post(server.base_url + "/v1/embeddings", json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


def test_an_embeddings_request_is_one_request_log_line(embedder):
    server, checkpoint = embedder
    body = {"input": ["one two", "three"]}
    headers = {"X-Request-Id": "emb-log"}
    reply = requests.post(
        server.base_url + "/v1/embeddings", json=body, headers=headers, timeout=30
    )
    tokens = reply.json()["usage"]["prompt_tokens"]

    def logged() -> list[dict]:
        log = (checkpoint.parent / "server.log").read_text().splitlines()
        lines = [json.loads(line) for line in log if '"radixserve.requests"' in line]
        return [r for r in lines if r.get("id") == "emb-log"]

    deadline = time.monotonic() + 10
    while not logged() and time.monotonic() < deadline:
        time.sleep(0.1)
    (line,) = logged()
    assert (line["path"], line["status"], line["prompt_tokens"]) == ("/v1/embeddings", 200, tokens)
    assert (line["completion_tokens"], line["finish_reason"]) == (0, "stop")


def test_generation_on_an_embedding_model_is_a_400(embedder):
    server, _ = embedder
    for path, body in [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/generate", {"text": "hi"}),
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
    ]:
        reply = requests.post(server.base_url + path, json=body, timeout=30)
        assert reply.status_code == 400, (path, reply.text)
        error = reply.json()["error"]
        assert error["code"] == "unsupported_task" and "/v1/embeddings" in error["message"]
    assert requests.get(server.base_url + "/ready", timeout=10).status_code == 200


def hf_yes_no_score(hf, tokenizer, query: str, document: str) -> float:
    head, tail = yes_no_prompt(query, document, None)
    ids = tokenizer.encode(head + tail, add_special_tokens=False)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, -1]
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    return torch.sigmoid(logits[yes] - logits[no]).item()


def test_rerank_and_score_match_transformers_and_share_the_query(reranker):
    server, checkpoint = reranker
    hf = transformers.Qwen3ForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = bundled_tokenizer()
    query = "which animal sits on mats? " * 3
    documents = ["the cat sat on the mat", "stock prices fell", "a dog barked", "mats"]
    want = [hf_yes_no_score(hf, tokenizer, query, d) for d in documents]
    body = {"model": "tiny-Qwen3-Reranker", "query": query, "documents": documents, "top_n": 3}
    reply = requests.post(server.base_url + "/v1/rerank", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    result = reply.json()
    order = sorted(range(4), key=lambda i: -want[i])[:3]
    assert [r["index"] for r in result["results"]] == order
    for r in result["results"]:
        assert abs(r["relevance_score"] - want[r["index"]]) < 1e-5
        assert r["document"] == {"text": documents[r["index"]]}
    info = requests.get(server.base_url + "/get_server_info", timeout=10).json()
    assert info["prefix_cache_hit_tokens"] > 0  # the later documents found the query cached
    score = requests.post(
        server.base_url + "/v1/score",
        json={"text_1": query, "text_2": documents, "return_documents": False},
        timeout=60,
    ).json()
    assert [d["index"] for d in score["data"]] == [0, 1, 2, 3]
    for d in score["data"]:
        assert abs(d["score"] - want[d["index"]]) < 1e-5
    bare = requests.post(
        server.base_url + "/v1/rerank",
        json={"query": query, "documents": [{"text": "mats"}], "return_documents": False},
        timeout=60,
    ).json()
    assert bare["results"] == [{"index": 0, "relevance_score": pytest.approx(want[3], abs=1e-5)}]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "", "documents": ["d"]}, "query"),
        ("/v1/rerank", {"query": "q", "documents": ["d", ""]}, "documents.1"),
        ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": [3]}, "documents.0"),
        ("/v1/rerank", {"documents": ["d"]}, "query"),
        ("/v1/rerank", {"query": "q", "documents": ["d"] * 1025}, "documents"),
        ("/v1/rerank", {"query": "q " * 5000, "documents": ["d"]}, "documents"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
        ("/v1/score", {"text_1": "a", "text_2": []}, "text_2"),
    ],
)
def test_bad_rerank_requests_are_400s_naming_the_field(reranker, path, body, param):
    server, _ = reranker
    reply = requests.post(server.base_url + path, json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.json()


def test_embeddings_on_a_reranker_are_a_400(reranker):
    server, _ = reranker
    reply = requests.post(server.base_url + "/v1/embeddings", json={"input": "x"}, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "unsupported_task"
