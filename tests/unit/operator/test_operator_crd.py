"""The CRD: a valid Kubernetes object whose schema, defaults and CEL rules say what parse_spec says."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

from radixserve_operator.spec import InvalidSpecError, parse_spec

REPO = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((REPO / "crds" / "radixserve.io_inferenceservices.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = [yaml.safe_load(path.read_text()) for path in sorted((REPO / "examples").glob("*.yaml"))]
EXAMPLES = [doc for doc in EXAMPLES if doc.get("kind") == "InferenceService"]


def schema_errors(document: dict[str, Any]) -> list[str]:
    # The CRD dialect is OpenAPI 3.0: boolean exclusiveMinimum, as in JSON Schema draft 4.
    validator = jsonschema.Draft4Validator(SCHEMA)
    return [error.message for error in validator.iter_errors(document)]


def with_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Apply the schema's ``default``s the way the API server does (structural defaulting)."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    result = dict(value)
    for key, sub in schema["properties"].items():
        if key not in result and "default" in sub:
            result[key] = copy.deepcopy(sub["default"])
        if key in result:
            result[key] = with_defaults(result[key], sub)
    return result


def cel_rules(
    schema: dict[str, Any], path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], dict]]:
    rules = [(path, rule) for rule in schema.get("x-kubernetes-validations", [])]
    for key, sub in schema.get("properties", {}).items():
        rules += cel_rules(sub, (*path, key))
    return rules


def cel_violations(document: dict[str, Any], *, creating: bool = True) -> list[str]:
    """Evaluate every CEL rule on its node; ``oldSelf`` is absent on create, present on update."""
    env = celpy.Environment()
    messages = []
    for path, rule in cel_rules(SCHEMA):
        node: Any = document
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            continue
        program = env.program(
            env.compile(rule["rule"]),
            functions={"hasValue": lambda _old: celpy.celtypes.BoolType(not creating)},
        )
        activation = {"self": celpy.json_to_cel(node), "oldSelf": celpy.json_to_cel(node)}
        if not program.evaluate(activation):
            messages.append(rule["message"])
    return messages


def defaulted(doc: dict[str, Any]) -> dict[str, Any]:
    return with_defaults(doc, SCHEMA)


def test_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate.validate(CRD, "1.30.0", strict=True)


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
        {},
    ],
)
def test_schema_rejects_what_parse_spec_rejects(spec: dict[str, Any]) -> None:
    assert schema_errors(defaulted({"spec": spec})) != []
    with pytest.raises(InvalidSpecError):
        parse_spec(spec, name="x", default_image="img")
