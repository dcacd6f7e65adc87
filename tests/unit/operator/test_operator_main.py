"""The operator process: flags, environment, kopf settings (peering, storage, events)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from radixserve_operator.main import build_settings, parse_args


def test_defaults_are_cluster_wide_with_leader_election() -> None:
    config = parse_args([])
    assert config.clusterwide and config.namespaces == ()
    assert config.peering == "radixserve-operator"
    assert (config.liveness_port, config.metrics_port, config.log_format) == (8081, 8080, "json")


def test_namespace_scope_and_standalone() -> None:
    config = parse_args(["-n", "team-a", "--namespace", "team-b", "--standalone"])
    assert config.namespaces == ("team-a", "team-b")
    assert not config.clusterwide
    assert config.peering is None
    settings = build_settings(config)
    assert settings.peering.standalone and not settings.peering.mandatory


def test_namespace_and_all_namespaces_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse_args(["-n", "a", "-A"])


def test_environment_configures_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_OPERATOR_NAMESPACE", "x,y")
    monkeypatch.setenv("RADIXSERVE_OPERATOR_WORKER_IMAGE", "reg/radixserve:2")
    monkeypatch.setenv("RADIXSERVE_OPERATOR_METRICS_PORT", "0")
    monkeypatch.setenv("RADIXSERVE_OPERATOR_STANDALONE", "true")
    config = parse_args([])
    assert config.namespaces == ("x", "y")
    assert config.worker_image == "reg/radixserve:2"
    assert config.metrics_port is None
    assert config.peering is None
    assert parse_args(["-n", "z"]).namespaces == ("z",)  # flags replace the environment's list


def test_peered_replicas_get_distinct_priorities() -> None:
    """kopf pauses every peer of equal priority: distinct ones let exactly one lead."""
    config = parse_args([])
    priorities = {build_settings(config).peering.priority for _ in range(20)}
    assert len(priorities) > 1
    settings = build_settings(parse_args(["--priority", "7", "--peering", "rs"]))
    assert (settings.peering.priority, settings.peering.name, settings.peering.mandatory) == (
        7,
        "rs",
        True,
    )


def test_events_and_storage_settings() -> None:
    settings = build_settings(parse_args([]))
    assert settings.posting.level == logging.WARNING
    assert settings.persistence.progress_storage.prefix == "radixserve.io"


def test_console_script_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "radixserve_operator.main", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--all-namespaces" in result.stdout and "--peering" in result.stdout
