"""The LoRA adapters' metrics: the Gateway API Inference Extension's model-server gauge (its
LoRA-affinity scorer reads it as vLLM's `vllm:lora_requests_info`), per-adapter requests and
tokens, prefix-cache hits per adapter, and the adapters' loads and evictions. Created by
ServerMetrics only when the server serves adapters; applied from the scheduler's report
(`LoRAManager.report`)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

PREFIX = "radixserve_"


class LoRAMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self._model_name = model_name
        self._info = Gauge(
            PREFIX + "lora_requests_info",
            "LoRA adapters of running and waiting requests (comma lists) and the device slots; "
            "the value is the report's Unix time (the Gateway API Inference Extension protocol)",
            ["model_name", "running_lora_adapters", "waiting_lora_adapters", "max_lora"],
            registry=registry,
        )
        by_adapter = ["model_name", "lora_name"]

        def counter(name: str, doc: str, labels: list[str] = by_adapter) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=registry)

        self._requests = counter("lora_requests", "Requests per LoRA adapter")
        self._prompt_tokens = counter("lora_prompt_tokens", "Prompt tokens per LoRA adapter")
        self._generation_tokens = counter(
            "lora_generation_tokens", "Generated tokens per LoRA adapter"
        )
        self._prefix_hits = counter(
            "lora_prefix_cache_hit_tokens",
            'Prompt tokens served from the prefix cache, per adapter (lora_name "": the base)',
        )
        self._prefix_lookups = counter(
            "lora_prefix_cache_lookups", "Admissions that looked up the prefix cache, per adapter"
        )
        self._loads = counter("lora_loads", "LoRA adapters read from disk", ["model_name"])
        self._load_seconds = counter(
            "lora_load_seconds", "Seconds spent reading LoRA adapters from disk", ["model_name"]
        )
        self._evictions = counter(
            "lora_evictions", "LoRA adapters evicted from a device slot", ["model_name"]
        )
        self._resident = Gauge(
            PREFIX + "lora_resident_adapters",
            "LoRA adapters in the device slots",
            ["model_name"],
            registry=registry,
        )

    def apply(self, report: dict[str, Any]) -> None:
        name = self._model_name
        self._info.clear()  # one series: the latest lists
        self._info.labels(
            name, ",".join(report["running"]), ",".join(report["waiting"]), str(report["max_lora"])
        ).set(time.time())
        for metric, key in (
            (self._requests, "requests"),
            (self._prompt_tokens, "prompt_tokens"),
            (self._generation_tokens, "generated_tokens"),
            (self._prefix_hits, "prefix_hit_tokens"),
            (self._prefix_lookups, "prefix_lookups"),
        ):
            for adapter, n in report[key].items():
                metric.labels(name, adapter).inc(n)
        self._loads.labels(name).inc(report["loads"])
        self._load_seconds.labels(name).inc(report["load_seconds"])
        self._evictions.labels(name).inc(report["evictions"])
        self._resident.labels(name).set(report["resident"])
