"""The architectures beyond the Llama family, greedy token-identical to transformers in
float32 on the same random weights: Qwen3-MoE and Mixtral (top-k routing, renormalised as each
config says), Gemma 2 and Gemma 3 text (local and global layers, soft-caps, the query
pre-attention scalar, (1 + w) norms, the scaled embedding, Gemma 3's q/k norms and local RoPE
base), and sliding-window Mistral and Qwen2 with windows shorter than the prompts.

Every run has 16 concurrent requests of mixed lengths with chunked prefill (8-token chunks)
and the radix cache on; half of them share a 24-token prefix, longer than any window here, so
cached KV from before a window is served to later requests; then the same prompts again, from
the cache."""

from __future__ import annotations

import json

import pytest
from engine_harness import check_against_hf, make_scheduler, random_prompts, run_to_completion

from radixserve.model_loader.loader import build_hf_reference, load_model_source
from radixserve.model_loader.random_init import PRESETS

pytestmark = pytest.mark.slow
NEW = 8
WINDOW = 16  # the presets' sliding window
# Qwen2 slides only with use_sliding_window, and only from layer max_window_layers on
QWEN2_SLIDING = {
    **PRESETS["tiny-qwen2"],
    "use_sliding_window": True,
    "sliding_window": WINDOW,
    "max_window_layers": 1,
}
FAMILIES = [
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-mistral-sw",
    "qwen2-sliding",
]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    name = request.param
    if name == "qwen2-sliding":
        path = tmp_path_factory.mktemp("qwen2") / "config.json"
        path.write_text(json.dumps(QWEN2_SLIDING))
        name = str(path)
    model = f"random:{name}"
    source = load_model_source(model, device="cpu")
    return model, source, build_hf_reference(source)


def test_windows_are_resolved_per_layer(family):
    model, source, _ = family
    windows = source.config.sliding_windows
    expected = {
        "random:tiny-gemma2": (WINDOW, -1),
        "random:tiny-gemma3": (WINDOW, -1, WINDOW),
        "random:tiny-mistral-sw": (WINDOW, WINDOW),
    }.get(model, (-1, WINDOW) if model.endswith("config.json") else (-1,) * len(windows))
    assert windows == expected


def test_concurrent_chunked_radix_requests_match_transformers(family, greedy):
    model, source, hf = family
    vocab = source.config.vocab_size
    shared = random_prompts(1, vocab, 24, 24, seed=40)[0]
    prompts = [shared + tail for tail in random_prompts(8, vocab, 1, 30, seed=41)]
    prompts += random_prompts(8, vocab, 2, 50, seed=42)
    assert max(len(p) for p in prompts) > 2 * WINDOW
    scheduler = make_scheduler(model, source, chunked_prefill_size=8)
    first = run_to_completion(scheduler, prompts, greedy(NEW))
    check_against_hf(hf, prompts, first, NEW)
    assert scheduler.get_server_info()["prefix_cache_hit_tokens"] > 0

    again = run_to_completion(scheduler, prompts, greedy(NEW))
    assert {rid: r["ids"] for rid, r in again.items()} == {
        rid: r["ids"] for rid, r in first.items()
    }
    # the prompts came back from the cache, windows' worth and more of them
    assert all(again[f"r{i}"]["cached"] == len(p) - 1 for i, p in enumerate(prompts))
