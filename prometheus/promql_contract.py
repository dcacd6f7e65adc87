"""What the dashboards and rules may query, and every query they make.

The worker's metric contract is the "Metrics" table of docs/architecture.md; this module reads
that table so that tests hold the dashboards and rules to the contract itself, not to a copy of
it. The dashboard, rule and live-Prometheus tests load this file by path (prometheus/ is not a
package).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE_DOC = REPO_ROOT / "docs" / "architecture.md"
DASHBOARD_FILES = sorted((REPO_ROOT / "dashboards").glob("*.json"))
RULE_FILES = [
    REPO_ROOT / "prometheus" / "recording-rules.yaml",
    REPO_ROOT / "prometheus" / "alert-rules.yaml",
]

_TABLE_ROW = re.compile(r"^\|\s*(`radixserve_[^|]+)\|\s*([^|]+)\|")
_BACKTICKED = re.compile(r"`(radixserve_[a-z0-9_]+)`")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_GRAFANA_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class NamedQuery:
    """A PromQL expression and where it lives, for test ids and failure messages."""

    where: str
    expr: str


def exported_series() -> set[str]:
    """Series names the worker exports, as Prometheus stores them (histograms expanded)."""
    series: set[str] = set()
    for line in ARCHITECTURE_DOC.read_text().splitlines():
        row = _TABLE_ROW.match(line)
        if not row:
            continue
        names, kind = _BACKTICKED.findall(row.group(1)), row.group(2)
        for name in names:
            if "histogram" in kind:
                series |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            else:
                series.add(name)
    return series


def series_in(expr: str) -> set[str]:
    """The radixserve_ series an expression reads (recorded `a:b:c` names excluded)."""
    return {
        token
        for token in _IDENTIFIER.findall(expr)
        if token.startswith("radixserve_") and ":" not in token
    }


def recorded_series_in(expr: str) -> set[str]:
    """The recorded (`level:metric:operations`) series an expression reads."""
    return {token for token in _IDENTIFIER.findall(expr) if ":" in token}


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana's `$name` and `${name}` variables the way Grafana would."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return values[name]

    return _GRAFANA_VARIABLE.sub(value, expr)


def dashboard_queries() -> list[NamedQuery]:
    """Every panel target of every dashboard."""
    queries = []
    for path in DASHBOARD_FILES:
        document = json.loads(path.read_text())
        for panel in document["panels"]:
            for target in panel["targets"]:
                where = f"{path.name}: {panel['title']} [{target['refId']}]"
                queries.append(NamedQuery(where, target["expr"]))
    return queries


def variable_queries() -> list[NamedQuery]:
    """The label_values() queries behind the dashboards' template variables."""
    queries = []
    for path in DASHBOARD_FILES:
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["type"] == "query":
                queries.append(
                    NamedQuery(f"{path.name}: ${variable['name']}", variable["definition"])
                )
    return queries


def rule_groups() -> list[dict]:
    """The rule groups of every rule file, recording rules first."""
    return [group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]]


def rule_queries(kind: str) -> list[NamedQuery]:
    """Expressions of the recording rules (`kind="record"`) or alerts (`kind="alert"`)."""
    return [
        NamedQuery(f"{group['name']}: {rule[kind]}", rule["expr"])
        for group in rule_groups()
        for rule in group["rules"]
        if kind in rule
    ]
