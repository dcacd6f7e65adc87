"""The LoRA metrics as Prometheus exposes them: the Gateway API Inference Extension's
`radixserve_lora_requests_info` (one series, the latest running and waiting adapters, max_lora,
the report's time as value), per-adapter counters, loads and evictions; none without adapters."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from radixserve.metrics.collectors import ServerMetrics
from radixserve.metrics.stats import SchedulerStats


def stats(lora=None) -> SchedulerStats:
    return SchedulerStats(1, 1, 0.1, 0.0, 0.0, 100, lora=lora)


def report(running, waiting, **counts) -> dict:
    base = {"requests": {}, "prompt_tokens": {}, "generated_tokens": {}, "prefix_lookups": {}}
    base |= {"prefix_hit_tokens": {}, "loads": 0, "load_seconds": 0.0, "evictions": 0}
    base |= {"resident": len(running)}
    return {"running": running, "waiting": waiting, "max_lora": 4, **base, **counts}


def samples(metrics: ServerMetrics) -> dict[str, list]:
    text = metrics.exposition().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_lora_metrics_follow_the_reports():
    metrics = ServerMetrics("base")
    metrics.apply_scheduler_stats(stats())
    assert not any(name.startswith("radixserve_lora") for name in samples(metrics))
    metrics.apply_scheduler_stats(
        stats(report(["sql", "poet"], ["chat"], requests={"sql": 2}, loads=3, evictions=1))
    )
    metrics.apply_scheduler_stats(
        stats(report(["sql"], [], requests={"sql": 1, "poet": 4}, generated_tokens={"sql": 9}))
    )
    got = samples(metrics)
    (info,) = got["radixserve_lora_requests_info"]
    labels, value = info
    assert labels["running_lora_adapters"] == "sql" and labels["waiting_lora_adapters"] == ""
    assert labels["max_lora"] == "4" and abs(value - time.time()) < 60
    requests = {s[0]["lora_name"]: s[1] for s in got["radixserve_lora_requests_total"]}
    assert requests == {"sql": 3, "poet": 4}
    assert got["radixserve_lora_generation_tokens_total"][0][1] == 9
    assert got["radixserve_lora_loads_total"][0][1] == 3
    assert got["radixserve_lora_evictions_total"][0][1] == 1
    assert got["radixserve_lora_resident_adapters"][0][1] == 1
