"""The CRD: a valid Kubernetes object whose schema, defaults and CEL rules say what parse_spec says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from operator_crd_checks import (
    CRD,
    EXAMPLES,
    REPO,
    VERSION,
    cel_violations,
    defaulted,
    schema_errors,
)

from radixserve_operator.spec import InvalidSpecError, parse_spec


@pytest.mark.parametrize("path", sorted((REPO / "crds").glob("*.yaml")), ids=lambda p: p.name)
def test_every_crd_is_a_valid_kubernetes_object(path: Path) -> None:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, "1.30.0", strict=True)


def test_crd_names_subresources_and_columns() -> None:
    names = CRD["spec"]["names"]
    assert "isvc" not in names["shortNames"]  # KServe's
    assert names["kind"] == "InferenceService"
    assert VERSION["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in VERSION["subresources"]
    columns = [column["name"] for column in VERSION["additionalPrinterColumns"]]
    assert columns == ["Model", "Replicas", "Ready", "URL", "Age"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda doc: doc["metadata"]["name"])
def test_examples_validate_against_the_crd(example: dict[str, Any]) -> None:
    assert schema_errors(defaulted(example)) == []
    assert cel_violations(defaulted(example)) == []
    parse_spec(example["spec"], name=example["metadata"]["name"], default_image="img")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda doc: doc["metadata"]["name"])
def test_crd_defaults_are_the_operators_defaults(example: dict[str, Any]) -> None:
    """Parsing the API server's defaulted object and the raw one gives the same spec."""
    name = example["metadata"]["name"]
    raw = parse_spec(example["spec"], name=name, default_image="img")
    assert parse_spec(defaulted(example)["spec"], name=name, default_image="img") == raw


INVALID_SPECS = {
    "draft without its model": (
        {"engine": {"speculative": {"method": "draft"}}},
        "speculative.draftModel goes with method draft, and only with it",
    ),
    "a draft model without method draft": (
        {"engine": {"speculative": {"method": "ngram", "draftModel": "builtin:smollm2-135m"}}},
        "speculative.draftModel goes with method draft, and only with it",
    ),
    "replicas with autoscaling": (
        {"replicas": 2, "autoscaling": {"maxReplicas": 3}},
        "set either replicas or autoscaling, not both",
    ),
    "min above max": (
        {"autoscaling": {"minReplicas": 5, "maxReplicas": 3}},
        "minReplicas must not exceed maxReplicas",
    ),
    "too few gpus for tp": (
        {"engine": {"tensorParallelSize": 4}, "resources": {"gpu": 2}},
        "resources.gpu must be at least engine.tensorParallelSize",
    ),
    "kv target above 1": (
        {"autoscaling": {"maxReplicas": 2, "metric": "kvCacheUsage", "target": 1.5}},
        "a kvCacheUsage target is a ratio between 0 and 1",
    ),
    "KV events without the radix cache": (
        {"engine": {"kvEvents": {"enabled": True}, "radixCache": False}},
        "engine.kvEvents needs engine.radixCache: the events tell what the radix cache holds",
    ),
    "KV events on the HTTP port": (
        {"engine": {"kvEvents": {"enabled": True, "port": 8000}}},
        "engine.kvEvents ports must differ from each other and from 8000",
    ),
    "host KV tier without the radix cache": (
        {"engine": {"kvHostMemory": 64, "radixCache": False}},
        "engine.kvHostMemory needs engine.radixCache: the host KV tier keeps what the radix cache evicts",
    ),
    "disk KV tier without the host tier": (
        {"engine": {"kvDiskSize": 100}},
        "engine.kvDiskSize needs engine.kvHostMemory: disk blocks are read back through the host tier",
    ),
    "disk KV tier with tensor parallelism": (
        {"engine": {"kvHostMemory": 64, "kvDiskSize": 100, "tensorParallelSize": 2}},
        "engine.kvDiskSize needs engine.tensorParallelSize 1",
    ),
}


@pytest.mark.parametrize("case", INVALID_SPECS, ids=str)
def test_cel_rules_and_parse_spec_refuse_the_same_specs(case: str) -> None:
    extra, message = INVALID_SPECS[case]
    document = defaulted({"spec": {"model": {"uri": "builtin:smollm2-135m"}, **extra}})
    assert message in cel_violations(document)
    if case != "replicas with autoscaling":  # the operator allows it: /scale writes replicas
        with pytest.raises(InvalidSpecError):
            parse_spec(document["spec"], name="x", default_image="img")


def test_replicas_may_join_autoscaling_after_create() -> None:
    """The scale subresource writes spec.replicas of an autoscaled service: updates pass."""
    document = defaulted(
        {
            "spec": {
                "model": {"uri": "builtin:smollm2-135m"},
                "replicas": 2,
                "autoscaling": {"maxReplicas": 3},
            }
        }
    )
    assert cel_violations(document, creating=False) == []


@pytest.mark.parametrize(
    "spec",
    [
        {"model": {"uri": "s3://bucket/model"}},
        {"model": {"uri": "builtin:llama-70b"}},
        {"model": {"uri": "builtin:smollm2-135m"}, "engine": {"attentionBackend": "cutlass"}},
        {"model": {"uri": "builtin:smollm2-135m"}, "replicas": -1},
        {"model": {"uri": "builtin:smollm2-135m"}, "engine": {"memFractionStatic": 1.0}},
        {"model": {"uri": "builtin:smollm2-135m"}, "engine": {"kvHostMemory": 0}},
        {"model": {"uri": "builtin:smollm2-135m"}, "engine": {"kvHostMemory": 1, "kvDiskSize": 0}},
        {"model": {"uri": "builtin:smollm2-135m"}, "engine": {"speculative": {"numTokens": 4}}},
        {"model": {"uri": "builtin:smollm2-135m"}, "engine": {"speculative": {"method": "eagle"}}},
        {
            "model": {"uri": "builtin:smollm2-135m"},
            "engine": {"speculative": {"method": "ngram", "numTokens": 17}},
        },
        {
            "model": {"uri": "builtin:smollm2-135m"},
            "engine": {"kvEvents": {"enabled": True, "port": 70000}},
        },
        {},
        {"model": {"uri": "builtin:smollm2-135m"}, "apiKeySecretRef": {"name": "keys"}},
        {"model": {"uri": "builtin:smollm2-135m"}, "apiKeySecretRef": {"name": "Keys", "key": "k"}},
        {"model": {"uri": "builtin:smollm2-135m"}, "apiKeySecretRef": {"name": "k", "key": "a/b"}},
    ],
)
def test_schema_rejects_what_parse_spec_rejects(spec: dict[str, Any]) -> None:
    assert schema_errors(defaulted({"spec": spec})) != []
    with pytest.raises(InvalidSpecError):
        parse_spec(spec, name="x", default_image="img")
