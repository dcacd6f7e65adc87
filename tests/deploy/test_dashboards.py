"""The Grafana dashboards: generated as committed, well-formed, and querying only real metrics."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


import radixserve_dashboards_generate as generate  # noqa: E402  (loaded by conftest)
import radixserve_promql_contract as contract  # noqa: E402  (loaded by conftest)

DOCUMENTS = {path.name: json.loads(path.read_text()) for path in contract.DASHBOARD_FILES}
# What Grafana would put in each variable for a fleet-wide view.
GRAFANA_VALUES = {
    "datasource": "prometheus",
    "namespace": ".*",
    "model_name": ".*",
    "mode": ".*",
    "__rate_interval": "1m",
}


def test_committed_json_is_what_the_generator_writes() -> None:
    assert set(DOCUMENTS) == set(generate.DASHBOARDS)
    for filename, document in generate.DASHBOARDS.items():
        committed = (REPO_ROOT / "dashboards" / filename).read_text()
        assert committed == generate.render(document), f"run dashboards/generate.py ({filename})"


def test_uids_and_titles_are_unique_across_dashboards() -> None:
    uids = [d["uid"] for d in DOCUMENTS.values()]
    titles = [d["title"] for d in DOCUMENTS.values()]
    assert len(set(uids)) == len(uids) == 2
    assert len(set(titles)) == len(titles)
    assert all(0 < len(uid) <= 40 for uid in uids)


@pytest.mark.parametrize("filename", sorted(DOCUMENTS))
def test_dashboard_follows_grafana_schema_basics(filename: str) -> None:
    document = DOCUMENTS[filename]
    assert isinstance(document["schemaVersion"], int)
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "model_name"} <= set(variables)
    panel_ids = [panel["id"] for panel in document["panels"]]
    assert len(set(panel_ids)) == len(panel_ids)
    for panel in document["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(set(ref_ids)) == len(ref_ids)
        assert all(target["datasource"] == panel["datasource"] for target in panel["targets"])
        if "repeat" in panel:
            assert panel["repeat"] in variables


@pytest.mark.parametrize("filename", sorted(DOCUMENTS))
def test_dashboard_shows_every_required_signal(filename: str) -> None:
    exprs = " ".join(t["expr"] for p in DOCUMENTS[filename]["panels"] for t in p["targets"])
    for series in (
        "radixserve_requests_total",
        "radixserve_generation_tokens_total",
        "radixserve_time_to_first_token_seconds_bucket",
        "radixserve_inter_token_latency_seconds_bucket",
        "radixserve_e2e_request_latency_seconds_bucket",
        "radixserve_prefix_cache_hits_tokens_total",
        "radixserve_batch_size_bucket",
        "radixserve_num_running_requests",
        "radixserve_num_queued_requests",
        "radixserve_kv_cache_usage_ratio",
        "radixserve_retractions_total",
        "radixserve_forward_step_seconds_bucket",
    ):
        assert series in exprs, series
    assert "histogram_quantile(0.99" in exprs and "histogram_quantile(0.5" in exprs
    assert 'finish_reason="error"' in exprs and "sum by (finish_reason)" in exprs
    heatmaps = [p for p in DOCUMENTS[filename]["panels"] if p["type"] == "heatmap"]
    assert [p["repeat"] for p in heatmaps] == ["mode"]


@pytest.mark.parametrize(
    "query", contract.dashboard_queries() + contract.variable_queries(), ids=lambda q: q.where
)
def test_every_query_reads_only_exported_metrics(query) -> None:
    used = contract.series_in(query.expr)
    assert used, f"{query.where} reads no radixserve metric"
    assert used <= contract.exported_series(), used - contract.exported_series()


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each substituted expression as a recording rule: a real PromQL parser."""
    queries = contract.dashboard_queries()
    rules = [
        {"record": f"dashboard_query_{i}", "expr": contract.substitute(q.expr, GRAFANA_VALUES)}
        for i, q in enumerate(queries)
    ]
    rule_file = tmp_path / "dashboard-queries.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(rule_file)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_substitute_fails_loudly_on_an_unknown_variable() -> None:
    with pytest.raises(KeyError, match=r"\$pod"):
        contract.substitute('up{pod="$pod"}', GRAFANA_VALUES)
    assert contract.substitute('x{a=~"${namespace}"}[$__rate_interval]', GRAFANA_VALUES) == (
        'x{a=~".*"}[1m]'
    )


@pytest.mark.parametrize("filename", sorted(DOCUMENTS))
def test_panels_do_not_overlap(filename: str) -> None:
    occupied: set[tuple[int, int]] = set()
    for panel in DOCUMENTS[filename]["panels"]:
        grid = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, panel["title"]
        occupied |= cells


def row(filename: str, prefix: str) -> tuple[list[dict], str]:
    """A dashboard's panels whose titles start with `prefix`, and their queries joined."""
    panels = [p for p in DOCUMENTS[filename]["panels"] if p["title"].startswith(prefix)]
    return panels, " ".join(t["expr"] for p in panels for t in p["targets"])


@pytest.mark.parametrize("filename", sorted(DOCUMENTS))
def test_dashboard_shows_the_router(filename: str) -> None:
    panels, exprs = row(filename, "Router: ")
    for series in (
        "radixserve_router_requests_total",
        "radixserve_router_retries_total",
        "radixserve_router_upstream_errors_total",
        "radixserve_router_pending_requests",
        "radixserve_router_workers",
        "radixserve_router_request_latency_seconds_bucket",
    ):
        assert series in exprs, series
    share = next(p for p in panels if "share" in p["title"])
    assert "worker" in share["targets"][0]["expr"] and share["fieldConfig"]["defaults"]["max"] == 1


@pytest.mark.parametrize("filename", sorted(DOCUMENTS))
def test_dashboard_shows_speculative_acceptance_per_pod(filename: str) -> None:
    panels = {p["title"]: p for p in DOCUMENTS[filename]["panels"]}
    acceptance = panels["Speculative decoding: acceptance"]
    expr = acceptance["targets"][0]["expr"]
    by = "instance" if "service" in filename else "namespace, model_name"
    assert f"sum by ({by}) (rate(radixserve_spec_decode_accepted_tokens_total" in expr
    assert "radixserve_spec_decode_proposed_tokens_total" in expr
    assert acceptance["fieldConfig"]["defaults"]["max"] == 1
    length = panels["Speculative decoding: tokens per verify step"]["targets"][0]["expr"]
    assert "radixserve_spec_decode_acceptance_length_sum" in length


@pytest.mark.parametrize("filename", sorted(DOCUMENTS))
def test_dashboard_has_the_cache_tiers_row(filename: str) -> None:
    _, exprs = row(filename, "Cache tiers: ")
    for series in (
        "radixserve_prefix_cache_hits_tokens_total",
        "radixserve_kv_tier_usage_ratio",
        "radixserve_kv_tier_bytes_total",
        "radixserve_kv_restore_seconds_bucket",
    ):
        assert series in exprs, series
    assert "sum by (tier)" in exprs and "tier, op" in exprs


@pytest.mark.parametrize("filename", sorted(DOCUMENTS))
def test_dashboard_has_the_lora_row(filename: str) -> None:
    _, exprs = row(filename, "LoRA: ")
    for series in (
        "radixserve_lora_requests_total",
        "radixserve_lora_prompt_tokens_total",
        "radixserve_lora_generation_tokens_total",
        "radixserve_lora_resident_adapters",
        "radixserve_lora_loads_total",
        "radixserve_lora_evictions_total",
    ):
        assert series in exprs, series
    assert "sum by (lora_name)" in exprs
