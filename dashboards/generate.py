"""Build the Grafana dashboards of radixserve from one table of panels.

The JSON files beside this script are what Grafana and the Helm chart load; they are generated
so that the fleet view and the single-service view cannot drift apart on a query, a unit or a
metric name. Run `python dashboards/generate.py` after editing a panel; a unit test fails when
the committed JSON is not what this script writes.

Every query uses only metrics the worker exports (docs/architecture.md, "Metrics"), filtered by
the `$namespace` and `$model_name` variables, and rates over Grafana's `$__rate_interval`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DASHBOARD_DIR = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SELECTOR = 'namespace=~"$namespace", model_name=~"$model_name"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel and how Grafana names its series."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A panel as the generator knows it: what it shows, not where it sits."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"
    repeat: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _rate(metric: str, by: str, matchers: str = "") -> str:
    selector = SELECTOR + (f", {matchers}" if matchers else "")
    return f"sum by ({by}) (rate({metric}{{{selector}}}{RATE}))"


def _legend(by: str) -> str:
    """A series' legend: the last label of the split (the pod, or the model in the fleet)."""
    return "{{" + by.split(", ")[-1] + "}}"


def _quantile(q: float, histogram: str, by: str) -> str:
    return f"histogram_quantile({q}, {_rate(histogram + '_bucket', 'le, ' + by)})"


def _latency_panel(title: str, histogram: str, by: str, description: str) -> Panel:
    legend = _legend(by)
    return Panel(
        title=title,
        description=description,
        unit="s",
        queries=(
            Query(_quantile(0.5, histogram, by), f"p50 {legend}"),
            Query(_quantile(0.99, histogram, by), f"p99 {legend}"),
        ),
    )


def _error_ratio(by: str) -> str:
    """Errored / finished requests; 0 rather than no data when no request has errored yet."""
    errors = _rate("radixserve_requests_total", by, 'finish_reason="error"')
    finished = _rate("radixserve_requests_total", by)
    return f"(({errors}) or ({finished} * 0)) / {finished}"


def panels(by: str) -> list[Panel]:
    """The panels of one dashboard, their series split by the label list `by`."""
    legend = _legend(by)
    return [
        Panel(
            "Request throughput",
            "Finished requests per second, all finish reasons.",
            "reqps",
            (Query(_rate("radixserve_requests_total", by), legend),),
        ),
        Panel(
            "Token throughput",
            "Prompt tokens read and generation tokens written per second.",
            "short",
            (
                Query(_rate("radixserve_prompt_tokens_total", by), f"prompt {legend}"),
                Query(_rate("radixserve_generation_tokens_total", by), f"generated {legend}"),
            ),
        ),
        _latency_panel(
            "Time to first token",
            "radixserve_time_to_first_token_seconds",
            by,
            "From request arrival to the first generated token: queueing plus prefill.",
        ),
        _latency_panel(
            "Inter-token latency",
            "radixserve_inter_token_latency_seconds",
            by,
            "Time between two generated tokens of one request: the decode step as users feel it.",
        ),
        _latency_panel(
            "End-to-end request latency",
            "radixserve_e2e_request_latency_seconds",
            by,
            "From request arrival to the last token.",
        ),
        _latency_panel(
            "Queue time",
            "radixserve_queue_time_seconds",
            by,
            "Time a request waits for admission into the running batch.",
        ),
        Panel(
            "Prefix cache hit rate",
            "Prompt tokens found in the radix cache / prompt tokens looked up.",
            "percentunit",
            (
                Query(
                    f"{_rate('radixserve_prefix_cache_hits_tokens_total', by)}"
                    f" / {_rate('radixserve_prefix_cache_queries_tokens_total', by)}",
                    legend,
                ),
            ),
            extra={"min": 0, "max": 1},
        ),
        Panel(
            "Running and queued requests",
            "Requests in the running batch and requests waiting for admission.",
            "short",
            (
                Query(
                    f"sum by ({by}) (radixserve_num_running_requests{{{SELECTOR}}})",
                    f"running {legend}",
                ),
                Query(
                    f"sum by ({by}) (radixserve_num_queued_requests{{{SELECTOR}}})",
                    f"queued {legend}",
                ),
            ),
        ),
        Panel(
            "KV cache usage",
            "KV held by running and queued requests / KV capacity of the fullest worker; near 1 "
            "means admission stalls and decode retracts requests. Evictable: prefix cache no "
            "request pins, reclaimed on demand (a warm idle worker is all evictable, no usage).",
            "percentunit",
            (
                Query(
                    f"max by ({by}) (radixserve_kv_cache_usage_ratio{{{SELECTOR}}})",
                    f"used {legend}",
                ),
                Query(
                    f"max by ({by}) (radixserve_kv_cache_evictable_ratio{{{SELECTOR}}})",
                    f"evictable {legend}",
                ),
            ),
            extra={"min": 0, "max": 1},
        ),
        Panel(
            "KV capacity",
            "KV cache capacity in tokens, summed over workers.",
            "short",
            (Query(f"sum by ({by}) (radixserve_max_total_tokens{{{SELECTOR}}})", legend),),
        ),
        Panel(
            "Retractions",
            "Requests retracted per second because a decode step found no free KV slots.",
            "short",
            (Query(_rate("radixserve_retractions_total", by), legend),),
        ),
        Panel(
            "Finish reasons",
            "Finished requests per second by finish reason (stop, length, abort, error).",
            "reqps",
            (Query(_rate("radixserve_requests_total", "finish_reason"), "{{finish_reason}}"),),
        ),
        Panel(
            "Error ratio",
            "Requests that finished with an engine error / finished requests.",
            "percentunit",
            (Query(_error_ratio(by), legend),),
        ),
        Panel(
            "Mean batch size by mode",
            "Requests per forward step, averaged, for prefill, decode and mixed steps.",
            "short",
            (
                Query(
                    f"{_rate('radixserve_batch_size_sum', 'mode')}"
                    f" / {_rate('radixserve_batch_size_count', 'mode')}",
                    "{{mode}}",
                ),
            ),
        ),
        Panel(
            "Mean tokens per step by mode",
            "Tokens per forward step, averaged: prefill steps near the chunked prefill size "
            "mean long prompts are being chunked.",
            "short",
            (
                Query(
                    f"{_rate('radixserve_batch_tokens_sum', 'mode')}"
                    f" / {_rate('radixserve_batch_tokens_count', 'mode')}",
                    "{{mode}}",
                ),
            ),
        ),
        Panel(
            "Forward step time by mode",
            "Wall time of one forward step, p50 and p99, per mode.",
            "s",
            (
                Query(_quantile(0.5, "radixserve_forward_step_seconds", "mode"), "p50 {{mode}}"),
                Query(_quantile(0.99, "radixserve_forward_step_seconds", "mode"), "p99 {{mode}}"),
            ),
        ),
        *kv_tier_panels(by),
        *router_panels(),
        *spec_decode_panels(by),
        *lora_panels(by),
        Panel(
            "Batch size distribution: $mode",
            "How many requests each forward step carried (radixserve_batch_size), one panel "
            "per mode.",
            "short",
            (
                Query(
                    _rate("radixserve_batch_size_bucket", "le", 'mode=~"$mode"'),
                    "{{le}}",
                ),
            ),
            kind="heatmap",
            repeat="mode",
        ),
    ]


def kv_tier_panels(by: str) -> list[Panel]:
    """The cache tiers: where prefix hits came from, and the host and disk KV tiers
    (`--kv-host-memory`, `--kv-disk-path`; their series exist only where a tier is on)."""
    legend = _legend(by)
    return [
        Panel(
            "Cache tiers: prefix hits by tier",
            "Prompt tokens served from the prefix cache per second, by where they were found: "
            "gpu (already in the device pool), host and disk (copied back from the KV tiers "
            "instead of being recomputed).",
            "short",
            (Query(_rate("radixserve_prefix_cache_hits_tokens_total", "tier"), "{{tier}}"),),
        ),
        Panel(
            "Cache tiers: usage",
            "Used / capacity of the host-memory and disk KV tiers, of the fullest worker.",
            "percentunit",
            (
                Query(
                    f"max by ({by}, tier) (radixserve_kv_tier_usage_ratio{{{SELECTOR}}})",
                    f"{{{{tier}}}} {legend}",
                ),
            ),
            extra={"min": 0, "max": 1},
        ),
        Panel(
            "Cache tiers: bytes moved",
            "KV bytes per second each tier took in (written), gave back to the GPU (restored) "
            "or let go (dropped: evicted, or a corrupt disk file).",
            "Bps",
            (Query(_rate("radixserve_kv_tier_bytes_total", "tier, op"), "{{tier}} {{op}}"),),
        ),
        Panel(
            "Cache tiers: restore latency",
            "One copy of a prefix from the host tier back to the GPU, p50 and p99: with the "
            "restore bandwidth, what a host hit costs instead of a prefill.",
            "s",
            (
                Query(_quantile(0.5, "radixserve_kv_restore_seconds", by), f"p50 {legend}"),
                Query(_quantile(0.99, "radixserve_kv_restore_seconds", by), f"p99 {legend}"),
            ),
        ),
        Panel(
            "Cache tiers: KV events",
            "KV events published per second (--kv-events-endpoint: what routers and llm-d's "
            "indexer read of the tiers), and cache updates dropped because the publisher fell "
            "behind: any drop leaves the consumers' view stale until those blocks change again.",
            "short",
            (
                Query(_rate("radixserve_kv_events_published_total", by), f"published {legend}"),
                Query(_rate("radixserve_kv_events_dropped_total", by), f"dropped {legend}"),
            ),
        ),
    ]


def spec_decode_panels(by: str) -> list[Panel]:
    """Speculative decoding (`--speculative-method`; its series exist only where it is on):
    how much of what is proposed the target keeps, per pod (per model in the fleet view)."""
    legend = _legend(by)
    accepted = _rate("radixserve_spec_decode_accepted_tokens_total", by)
    proposed = _rate("radixserve_spec_decode_proposed_tokens_total", by)
    lengths = "radixserve_spec_decode_acceptance_length"
    return [
        Panel(
            "Speculative decoding: acceptance",
            "Proposed tokens the verify step accepted / proposed tokens: low acceptance means "
            "speculation costs more than it saves (requests turn it down on their own).",
            "percentunit",
            (Query(f"{accepted} / {proposed}", legend),),
            extra={"min": 0, "max": 1},
        ),
        Panel(
            "Speculative decoding: tokens per verify step",
            "Tokens a request emits per verify step (accepted proposals + 1), the mean: the "
            "speed-up over plain decode is this divided by the verify step's cost in decode "
            "steps (radixserve_forward_step_seconds, mode verify against decode).",
            "short",
            (
                Query(
                    f"{_rate(lengths + '_sum', by)} / {_rate(lengths + '_count', by)}",
                    legend,
                ),
            ),
        ),
    ]


def lora_panels(by: str) -> list[Panel]:
    """LoRA adapters (`--lora-modules`, `--max-loras`; their series exist only on workers that
    serve adapters): traffic per adapter, what the device slots hold, and their churn."""
    legend = _legend(by)
    return [
        Panel(
            "LoRA: requests per adapter",
            "Requests per second that named each LoRA adapter as their model.",
            "reqps",
            (Query(_rate("radixserve_lora_requests_total", "lora_name"), "{{lora_name}}"),),
        ),
        Panel(
            "LoRA: tokens per adapter",
            "Prompt and generated tokens per second, per adapter.",
            "short",
            (
                Query(
                    _rate("radixserve_lora_prompt_tokens_total", "lora_name"),
                    "prompt {{lora_name}}",
                ),
                Query(
                    _rate("radixserve_lora_generation_tokens_total", "lora_name"),
                    "generated {{lora_name}}",
                ),
            ),
        ),
        Panel(
            "LoRA: resident adapters",
            "Adapters in the device slots of each worker (at most --max-loras), the fullest.",
            "short",
            (
                Query(
                    f"max by ({by}) (radixserve_lora_resident_adapters{{{SELECTOR}}})",
                    legend,
                ),
            ),
        ),
        Panel(
            "LoRA: loads and evictions",
            "Adapters read from disk and adapters evicted from a device slot, per second: "
            "evictions that keep pace with loads mean more adapters in use than slots.",
            "short",
            (
                Query(_rate("radixserve_lora_loads_total", by), f"loads {legend}"),
                Query(_rate("radixserve_lora_evictions_total", by), f"evictions {legend}"),
            ),
        ),
    ]


def router_panels() -> list[Panel]:
    """What the router (`radixserve router`) sees; its series carry the same `model_name`.

    Grouped by service (`namespace, model_name`) in both dashboards: one router fleet per
    service, whose worker label names the worker pods it spreads requests over.
    """
    service = "namespace, model_name"
    requests = "radixserve_router_requests_total"

    def zero_when_absent(expr: str) -> str:
        """0 rather than no data while no request has failed yet (the series do not exist)."""
        return f"({expr}) or on() vector(0)"

    return [
        Panel(
            "Router: share of requests per worker",
            "Each worker's share of the requests the routers sent: cache-aware routing keeps "
            "conversations on the worker that caches them, so shares follow the conversations, "
            "not a strict 1/N.",
            "percentunit",
            (
                Query(
                    f"{_rate(requests, service + ', worker')}"
                    f" / on ({service}) group_left {_rate(requests, service)}",
                    "{{worker}}",
                ),
            ),
            extra={"min": 0, "max": 1},
        ),
        Panel(
            "Router: routing decisions",
            "Requests per second by what decided their worker: prefix (the longest cached "
            "prefix), least_loaded (no long enough prefix), balance (the load was skewed), "
            "round_robin, power_of_two.",
            "reqps",
            (Query(_rate(requests, "decision"), "{{decision}}"),),
        ),
        Panel(
            "Router: retries and upstream errors",
            "Attempts repeated on another worker, and failed attempts by kind: connect (worker "
            "unreachable), status_429 / status_503 (queue full, draining), stream_broken (a "
            "stream cut midway; the client got an error event).",
            "reqps",
            (
                Query(_rate("radixserve_router_retries_total", service), "retries {{model_name}}"),
                Query(
                    zero_when_absent(_rate("radixserve_router_upstream_errors_total", "kind")),
                    "{{kind}}",
                ),
            ),
        ),
        Panel(
            "Router: pending requests",
            "Requests the routers hold because no worker is ready: nonzero while a service "
            "scaled to zero starts a worker (KEDA's router-pending trigger reads it).",
            "short",
            (
                Query(
                    f"sum by ({service}) (radixserve_router_pending_requests{{{SELECTOR}}})",
                    "{{model_name}}",
                ),
            ),
        ),
        Panel(
            "Router: workers by state",
            "Workers the routers know: ready (taking requests), not_ready (loading or "
            "draining), down (unreachable).",
            "short",
            (Query(f"sum by (state) (radixserve_router_workers{{{SELECTOR}}})", "{{state}}"),),
        ),
        _latency_panel(
            "Router: request latency",
            "radixserve_router_request_latency_seconds",
            service,
            "From a request's arrival at a router to its last byte: waiting for a worker, "
            "retries and the worker's own latency together.",
        ),
    ]


def _panel_json(panel_id: int, panel: Panel, x: int, y: int, width: int) -> dict[str, Any]:
    targets = [
        {
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": q.expr,
            "legendFormat": q.legend,
            "range": True,
            **({"format": "heatmap"} if panel.kind == "heatmap" else {}),
        }
        for i, q in enumerate(panel.queries)
    ]
    body: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": panel.unit, **panel.extra}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
    }
    if panel.kind == "heatmap":
        body["options"] = {"calculate": False, "yAxis": {"unit": panel.unit}}
    if panel.repeat:
        body["repeat"] = panel.repeat
        body["repeatDirection"] = "h"
        body["maxPerRow"] = 3
    return body


def _query_variable(name: str, label: str, query: str, *, multi: bool) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        **({"allValue": ".*"} if multi else {}),
        "current": {},
        "options": [],
        "hide": 0,
    }


def _variables(*, multi_model: bool) -> list[dict[str, Any]]:
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "options": [],
            "refresh": 1,
        },
        _query_variable(
            "namespace",
            "Namespace",
            "label_values(radixserve_max_total_tokens, namespace)",
            multi=True,
        ),
        _query_variable(
            "model_name",
            "Model",
            'label_values(radixserve_max_total_tokens{namespace=~"$namespace"}, model_name)',
            multi=multi_model,
        ),
        _query_variable(
            "mode",
            "Forward mode",
            'label_values(radixserve_batch_size_count{namespace=~"$namespace", '
            'model_name=~"$model_name"}, mode)',
            multi=True,
        ),
    ]


def dashboard(uid: str, title: str, description: str, by: str, *, multi_model: bool) -> dict:
    """One complete Grafana dashboard document."""
    body = []
    x = y = 0
    for i, panel in enumerate(panels(by)):
        if panel.repeat and x:
            x, y = 0, y + 8  # a repeated panel takes a row of its own: Grafana splits it
        body.append(_panel_json(i + 1, panel, x=x, y=y, width=24 if panel.repeat else 12))
        x, y = (x + 12, y) if x == 0 and not panel.repeat else (0, y + 8)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["radixserve", "llm"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": _variables(multi_model=multi_model)},
        "panels": body,
    }


DASHBOARDS: dict[str, dict] = {
    "radixserve-fleet.json": dashboard(
        "radixserve-fleet",
        "radixserve / Fleet",
        "Every radixserve InferenceService side by side, one series per model.",
        "namespace, model_name",
        multi_model=True,
    ),
    "radixserve-service.json": dashboard(
        "radixserve-service",
        "radixserve / Service",
        "One InferenceService, one series per worker pod.",
        "instance",
        multi_model=False,
    ),
}


def render(document: dict) -> str:
    """The exact text committed for a dashboard (stable key order, trailing newline)."""
    return json.dumps(document, indent=2) + "\n"


def main() -> None:
    for filename, document in DASHBOARDS.items():
        (DASHBOARD_DIR / filename).write_text(render(document))


if __name__ == "__main__":
    main()
