"""spec.loras, loraPlacement and maxLoras: the CRD and parse_spec refuse the same specs, the
worker gets the flags it accepts, and a change of the adapter list leaves the pod template alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from operator_crd_checks import cel_violations, defaulted, schema_errors

from radixserve.contract import parse_server_args
from radixserve_operator.manifests import (
    Owner,
    build_children,
    build_deployment,
    build_lora_config_map,
    worker_args,
)
from radixserve_operator.spec import InvalidSpecError, parse_spec

OWNER = Owner("svc", "ns", "uid")
CACHED = {"model": {"uri": "builtin:smollm2-135m"}, "modelCache": {"claimName": "models"}}
SQL = {"name": "sql", "source": "adapters/sql"}
CHAT = {"name": "org/chat:v2", "source": "hf://org/chat-lora@v2.1"}


def parsed(**spec: Any) -> Any:
    return parse_spec({**CACHED, **spec}, name="svc", default_image="img")


INVALID = {
    "names twice": ({"loras": [SQL, {**CHAT, "name": "sql"}]}, "spec.loras names must be distinct"),
    "the model's name": (
        {"model": {"uri": "builtin:smollm2-135m", "name": "sql"}, "loras": [SQL]},
        "spec.loras names must differ from the served model's name",
    ),
    "out of the cache volume": (
        {"loras": [{"name": "a", "source": "adapters/../../etc"}]},
        "spec.loras sources must stay inside the model-cache volume (no .. segment)",
    ),
    "a cache path without a cache": (
        {"modelCache": None, "loras": [SQL]},
        "spec.loras sources on the model-cache volume need spec.modelCache",
    ),
}


@pytest.mark.parametrize("case", INVALID, ids=str)
def test_cel_rules_and_parse_spec_refuse_the_same_specs(case: str) -> None:
    extra, message = INVALID[case]
    spec = {key: value for key, value in {**CACHED, **extra}.items() if value is not None}
    document = defaulted({"spec": spec})
    assert schema_errors(document) == []
    assert message in cel_violations(document)
    with pytest.raises(InvalidSpecError):
        parse_spec(document["spec"], name="svc", default_image="img")


@pytest.mark.parametrize(
    "extra",
    [
        {"loras": [{"name": "-flag", "source": "a"}]},
        {"loras": [{"name": "a=b", "source": "a"}]},
        {"loras": [{"name": "a", "source": "/etc/passwd"}]},
        {"loras": [{"name": "a", "source": "s3://bucket/a"}]},
        {"loras": [{"name": "a", "source": "hf://just-a-name"}]},
        {"loras": [{"name": "a", "source": "hf://org/a@"}]},
        {"loras": [{"name": "a", "source": "hf://org/a@refs/pr/1"}]},
        {"loras": [{"name": "a"}]},
        {"loras": [{"name": f"a{i}", "source": "a"} for i in range(65)]},
        {"loraPlacement": "everywhere"},
        {"maxLoras": 0},
        {"maxLoras": 65},
    ],
    ids=repr,
)
def test_schema_rejects_what_parse_spec_rejects(extra: dict[str, Any]) -> None:
    assert schema_errors(defaulted({"spec": {**CACHED, **extra}})) != []
    with pytest.raises(InvalidSpecError):
        parsed(**extra)


def test_a_valid_spec_passes_both() -> None:
    document = defaulted({"spec": {**CACHED, "loras": [SQL, CHAT], "maxLoras": 8}})
    assert schema_errors(document) == [] and cel_violations(document) == []
    assert document["spec"]["loraPlacement"] == "all"
    assert parse_spec(document["spec"], name="svc", default_image="img") == parsed(
        loras=[SQL, CHAT], maxLoras=8
    )


def test_without_loras_nothing_of_lora_reaches_the_pod() -> None:
    spec = parsed()
    assert not any("lora" in arg for arg in worker_args(spec))
    kinds = [child["kind"] for child in build_children(OWNER, spec, prometheus_address="p")]
    assert "ConfigMap" not in kinds


def test_on_demand_passes_the_list_to_read_lazily(tmp_path: Path) -> None:
    """onDemand: the same ConfigMap list as all (every worker knows every adapter by name),
    read on each adapter's first request; all keeps reading them at start."""
    on_demand = parsed(loraPlacement="onDemand", maxLoras=2, loras=[SQL, CHAT])
    args = worker_args(on_demand)
    assert "--max-loras=2" in args and "--lora-load=lazy" in args
    assert "--lora-modules-file=/etc/radixserve/loras/modules" in args
    assert not any(arg.startswith("--lora-load") for arg in worker_args(parsed(loras=[SQL])))
    kinds = [child["kind"] for child in build_children(OWNER, on_demand, prometheus_address="p")]
    assert "ConfigMap" in kinds
    template = build_deployment(OWNER, on_demand)["spec"]["template"]["spec"]
    assert {"name": "loras", "configMap": {"name": "svc-loras"}} in template["volumes"]
    # the list changes no pod, as with all
    assert build_deployment(OWNER, on_demand) == build_deployment(
        OWNER, parsed(loraPlacement="onDemand", maxLoras=2, loras=[SQL])
    )
    modules = tmp_path / "modules"
    modules.write_text(build_lora_config_map(OWNER, on_demand.lora.adapters)["data"]["modules"])
    worker = parse_server_args(
        [arg.replace("/etc/radixserve/loras/modules", str(modules)) for arg in args[1:]]
    )
    assert worker.lora_load == "lazy" and worker.max_loras == 2
    assert set(worker.lora_module_paths()) == {"sql", "org/chat:v2"}


def test_all_placement_changes_the_config_map_not_the_pod_template(tmp_path: Path) -> None:
    one, two = parsed(loras=[SQL]), parsed(loras=[SQL, CHAT])
    assert build_deployment(OWNER, one) == build_deployment(OWNER, two)
    template = build_deployment(OWNER, two)["spec"]["template"]["spec"]
    args = template["containers"][0]["args"]
    assert "--max-loras=4" in args and "--lora-modules-file=/etc/radixserve/loras/modules" in args
    assert {"name": "loras", "configMap": {"name": "svc-loras"}} in template["volumes"]
    # hf:// adapters are fetched by the worker, whatever the list holds (no template change)
    assert {"name": "HF_HUB_OFFLINE", "value": "0"} in template["containers"][0]["env"]
    config_map = build_lora_config_map(OWNER, two.lora.adapters)
    assert config_map["metadata"]["name"] == "svc-loras"
    assert config_map != build_lora_config_map(OWNER, one.lora.adapters)
    # the worker's own parser and reader take the command line and the mounted file
    modules = tmp_path / "modules"
    modules.write_text(config_map["data"]["modules"])
    worker = parse_server_args(
        [arg.replace("/etc/radixserve/loras/modules", str(modules)) for arg in args[1:]]
    )
    assert worker.max_loras == 4
    assert worker.lora_module_paths() == {
        "sql": "/models/cache/adapters/sql",
        "org/chat:v2": "hf://org/chat-lora@v2.1",
    }
