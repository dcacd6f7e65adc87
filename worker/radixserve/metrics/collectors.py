"""Prometheus collectors of one worker, fed by the front end.

The scheduler process never touches Prometheus: it sends `SchedulerStats` deltas with its
outputs and the front end applies them here, so one process owns every series and `/metrics`
needs no multiprocess mode. Latencies (TTFT, ITL, E2E) are measured where the client sees them,
in the front end. Each `ServerMetrics` has its own registry so that several engines in one
process (tests, benchmarks) do not collide.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from radixserve.metrics.lora import LoRAMetrics
from radixserve.metrics.stats import SchedulerStats

# `_created` series double the exposition size and no dashboard reads them.
disable_created_metrics()

PREFIX = "radixserve_"
FINISH_REASONS = ("stop", "length", "abort", "error")
FORWARD_MODES = ("prefill", "decode", "mixed", "verify")

LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
RESTORE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# where a cached prompt token was found: on the device, or restored from a lower tier
KV_TIERS = ("gpu", "host", "disk")
# tokens a verified request emits per step: accepted proposals + 1 (up to 16 + 1)
ACCEPTANCE_LENGTH_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 17)
BATCH_TOKENS_BUCKETS = (1, 4, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """Every metric of the architecture page, labelled with the served model name."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model_name = model_name
        self._lora: LoRAMetrics | None = None
        labels = ["model_name"]
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=reg).labels(model_name)

        def counter(name: str, doc: str):
            return Counter(PREFIX + name, doc, labels, registry=reg).labels(model_name)

        def histogram(name: str, doc: str, buckets=LATENCY_BUCKETS):
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=reg).labels(
                model_name
            )

        self.num_running_requests = gauge("num_running_requests", "Requests in the running batch")
        self.num_queued_requests = gauge("num_queued_requests", "Requests waiting for admission")
        self.kv_cache_usage_ratio = gauge(
            "kv_cache_usage_ratio",
            "KV slots held by running or queued requests / total slots (not the evictable cache)",
        )
        self.kv_cache_evictable_ratio = gauge(
            "kv_cache_evictable_ratio",
            "KV slots holding prefix cache that no request pins (reclaimable) / total slots",
        )
        self.prefix_cache_hit_rate = gauge(
            "prefix_cache_hit_rate", "Cached prompt tokens / prompt tokens over a recent window"
        )
        self.max_total_tokens = gauge("max_total_tokens", "KV cache capacity in tokens")
        self._startup_seconds = Gauge(
            PREFIX + "startup_seconds",
            "Seconds this worker's start-up spent in each phase (and in total)",
            ["model_name", "phase"],
            registry=reg,
        )
        self.prefix_cache_queries_tokens = counter(
            "prefix_cache_queries_tokens", "Prompt tokens looked up in the radix cache"
        )
        self._prefix_cache_hits_tokens = Counter(
            PREFIX + "prefix_cache_hits_tokens",
            "Prompt tokens found in the radix cache, by the tier they were found in (gpu: "
            "already on the device; host, disk: restored from the KV tiers)",
            ["model_name", "tier"],
            registry=reg,
        )
        for tier in KV_TIERS:
            self._prefix_cache_hits_tokens.labels(model_name, tier)
        # the KV tiers' series appear with their first report (--kv-host-memory)
        self._kv_tier_usage = Gauge(
            PREFIX + "kv_tier_usage_ratio",
            "Used / capacity of a lower KV tier (host memory, disk)",
            ["model_name", "tier"],
            registry=reg,
        )
        self._kv_tier_bytes = Counter(
            PREFIX + "kv_tier_bytes",
            "Bytes of KV a lower tier took in (written), gave back to the device (restored) "
            "or let go (dropped)",
            ["model_name", "tier", "op"],
            registry=reg,
        )
        self._kv_restore_seconds = Histogram(
            PREFIX + "kv_restore_seconds",
            "Time of one admission round's copies from the host tier back to the device",
            ["model_name"],
            buckets=RESTORE_BUCKETS,
            registry=reg,
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.retractions = counter("retractions", "Requests retracted for lack of KV slots")
        self.kv_events_published = counter(
            "kv_events_published", "KV cache events published (--kv-events-endpoint)"
        )
        self.kv_events_dropped = counter(
            "kv_events_dropped",
            "Prefix cache updates not published: the event publisher's queue was full",
        )
        # the Gateway API Inference Extension's prefix-cache metric: value 1, the facts in labels
        self._cache_config_info = Gauge(
            PREFIX + "cache_config_info",
            "KV cache configuration (block_size: tokens per KV event block; num_gpu_blocks)",
            ["model_name", "block_size", "num_gpu_blocks"],
            registry=reg,
        )
        self._requests = Counter(
            PREFIX + "requests",
            "Finished requests by finish reason",
            ["model_name", "finish_reason"],
            registry=reg,
        )
        for reason in FINISH_REASONS:
            self._requests.labels(model_name, reason)
        self.spec_proposed_tokens = counter(
            "spec_decode_proposed_tokens", "Tokens proposed by speculative decoding"
        )
        self.spec_accepted_tokens = counter(
            "spec_decode_accepted_tokens", "Proposed tokens the verify step accepted"
        )
        self.spec_acceptance_length = histogram(
            "spec_decode_acceptance_length",
            "Tokens a request emits per verify step (accepted proposals + 1)",
            buckets=ACCEPTANCE_LENGTH_BUCKETS,
        )
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "Arrival to first generated token"
        )
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Time between consecutive generated tokens"
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Arrival to the last token"
        )
        self.queue_time = histogram("queue_time_seconds", "Arrival at the scheduler to admission")
        by_mode = ["model_name", "mode"]
        self._batch_size = Histogram(
            PREFIX + "batch_size",
            "Requests per forward step",
            by_mode,
            buckets=BATCH_SIZE_BUCKETS,
            registry=reg,
        )
        self._batch_tokens = Histogram(
            PREFIX + "batch_tokens",
            "Tokens per forward step",
            by_mode,
            buckets=BATCH_TOKENS_BUCKETS,
            registry=reg,
        )
        self._forward_step_seconds = Histogram(
            PREFIX + "forward_step_seconds",
            "Wall time of one forward step",
            by_mode,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        for mode in FORWARD_MODES:
            self._batch_size.labels(model_name, mode)
            self._batch_tokens.labels(model_name, mode)
            self._forward_step_seconds.labels(model_name, mode)

    def set_startup(self, phases: dict[str, float]) -> None:
        for phase, seconds in phases.items():
            self._startup_seconds.labels(self._model_name, phase).set(seconds)
        self._startup_seconds.labels(self._model_name, "total").set(sum(phases.values()))

    def set_cache_config(self, block_size: int, max_total_tokens: int) -> None:
        """`cache_config_info`: the KV pool in blocks of the events' size."""
        self._cache_config_info.clear()
        self._cache_config_info.labels(
            self._model_name, str(block_size), str(max_total_tokens // block_size)
        ).set(1)

    def apply_scheduler_stats(self, stats: SchedulerStats) -> None:
        self.num_running_requests.set(stats.num_running_requests)
        self.num_queued_requests.set(stats.num_queued_requests)
        self.kv_cache_usage_ratio.set(stats.kv_cache_usage_ratio)
        self.kv_cache_evictable_ratio.set(stats.kv_cache_evictable_ratio)
        self.prefix_cache_hit_rate.set(stats.prefix_cache_hit_rate)
        self.max_total_tokens.set(stats.max_total_tokens)
        self.prefix_cache_queries_tokens.inc(stats.prefix_cache_queries_tokens)
        lower = stats.prefix_cache_hits_by_tier
        for tier, n in lower.items():
            self._prefix_cache_hits_tokens.labels(self._model_name, tier).inc(n)
        gpu_hits = stats.prefix_cache_hits_tokens - sum(lower.values())
        self._prefix_cache_hits_tokens.labels(self._model_name, "gpu").inc(gpu_hits)
        if stats.kv_tiers is not None:
            self._apply_kv_tiers(stats.kv_tiers)
        if stats.lora is not None:
            if self._lora is None:  # made at the first report: a server without adapters has none
                self._lora = LoRAMetrics(self.registry, self._model_name)
            self._lora.apply(stats.lora)
        self.retractions.inc(stats.retractions)
        self.kv_events_published.inc(stats.kv_events_published)
        self.kv_events_dropped.inc(stats.kv_events_dropped)
        self.spec_proposed_tokens.inc(stats.spec_proposed_tokens)
        self.spec_accepted_tokens.inc(stats.spec_accepted_tokens)
        for length in stats.spec_acceptance_lengths:
            self.spec_acceptance_length.observe(length)
        for mode, batch_size, batch_tokens, seconds in stats.steps:
            self._batch_size.labels(self._model_name, mode).observe(batch_size)
            self._batch_tokens.labels(self._model_name, mode).observe(batch_tokens)
            self._forward_step_seconds.labels(self._model_name, mode).observe(seconds)

    def _apply_kv_tiers(self, report: dict[str, Any]) -> None:
        name = self._model_name
        for tier, ratio in report["usage"].items():
            self._kv_tier_usage.labels(name, tier).set(ratio)
        for op in ("written", "restored", "dropped"):
            for tier, n in report[op].items():
                self._kv_tier_bytes.labels(name, tier, op).inc(n)
        # made by the first report (the start-up probe's), before any restore: a series born
        # with its first observations would show Prometheus no increase
        restores = self._kv_restore_seconds.labels(name)
        for seconds in report["restore_seconds"]:
            restores.observe(seconds)

    def count_finished_request(self, finish_reason: str, prompt_tokens: int) -> None:
        self._requests.labels(self._model_name, finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
