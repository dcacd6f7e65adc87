"""Recording and alert rules: promtool accepts them, unit tests cover every alert both ways."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
RULES_TEST = REPO_ROOT / "prometheus" / "tests" / "rules-test.yaml"
REQUIRED_ALERTS = {
    "RadixserveWorkerDown",
    "RadixserveHighQueue",
    "RadixserveKVCacheNearFull",
    "RadixserveTTFTHigh",
    "RadixserveHighErrorRate",
}


import radixserve_promql_contract as contract  # noqa: E402  (loaded by conftest)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=REPO_ROOT)


def test_promtool_check_rules_accepts_every_rule_file() -> None:
    checked = _promtool("check", "rules", *map(str, contract.RULE_FILES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("SUCCESS") == len(contract.RULE_FILES)


def test_promtool_unit_tests_pass() -> None:
    tested = _promtool("test", "rules", str(RULES_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_alerts_are_the_required_set_with_severity_and_docs() -> None:
    alerts = [r for g in contract.rule_groups() for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} == REQUIRED_ALERTS
    for alert in alerts:
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert "docs/operations.md" in alert["annotations"]["description"]
        assert alert["annotations"]["summary"]


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = [
        case
        for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for alert in REQUIRED_ALERTS:
        expectations = [case["exp_alerts"] for case in cases if case["alertname"] == alert]
        assert any(expectations), f"{alert} is never tested firing"
        assert [] in expectations, f"{alert} is never tested quiet"


def test_alert_runbook_sections_exist_in_operations_doc() -> None:
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    for group in contract.rule_groups():
        for rule in group.get("rules", []):
            if "alert" in rule:
                section = rule["annotations"]["description"].rsplit('"', 2)[-2]
                assert f"### {section}" in operations, section


def test_rules_read_only_exported_metrics() -> None:
    exported = contract.exported_series()
    for query in contract.rule_queries("record") + contract.rule_queries("alert"):
        assert contract.series_in(query.expr) <= exported, query.where
    recorded = {q.where.split(": ", 1)[1] for q in contract.rule_queries("record")}
    for query in contract.rule_queries("alert"):
        assert contract.recorded_series_in(query.expr) <= recorded, query.where
