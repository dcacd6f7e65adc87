"""The InferenceService CRD loaded from crds/, and checks a real API server would make with it:
OpenAPI schema validation, structural defaulting and CEL rules (through cel-python)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((REPO / "crds" / "radixserve.io_inferenceservices.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = [yaml.safe_load(path.read_text()) for path in sorted((REPO / "examples").glob("*.yaml"))]
EXAMPLES = [doc for doc in EXAMPLES if doc.get("kind") == "InferenceService"]


# The Gateway API Inference Extension's InferencePool CRD (vendored, see its header).
INFERENCE_POOL_CRD = yaml.safe_load(
    (REPO / "tests" / "data" / "inference.networking.k8s.io_inferencepools.yaml").read_text()
)
INFERENCE_POOL_SCHEMA = INFERENCE_POOL_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def schema_errors(document: dict[str, Any], schema: dict[str, Any] = SCHEMA) -> list[str]:
    # The CRD dialect is OpenAPI 3.0: boolean exclusiveMinimum, as in JSON Schema draft 4.
    validator = jsonschema.Draft4Validator(schema)
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


def cel_violations(
    document: dict[str, Any], *, creating: bool = True, schema: dict[str, Any] = SCHEMA
) -> list[str]:
    """Evaluate every CEL rule on its node; ``oldSelf`` is absent on create, present on update."""
    env = celpy.Environment()
    messages = []
    for path, rule in cel_rules(schema):
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


def defaulted(doc: dict[str, Any], schema: dict[str, Any] = SCHEMA) -> dict[str, Any]:
    return with_defaults(doc, schema)


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused, as an API server's pruning would drop them."""
    if not isinstance(schema, dict):
        return schema
    result = {key: closed(value) for key, value in schema.items()}
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        result["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
        result.setdefault("additionalProperties", False)
    return result


def inference_pool_problems(pool: dict[str, Any]) -> list[str]:
    """Everything the InferencePool v1 CRD (schema, unknown fields, CEL) refuses in `pool`."""
    crd = INFERENCE_POOL_CRD["spec"]
    (version,) = crd["versions"]
    problems = []
    if (
        pool.get("apiVersion") != f"{crd['group']}/{version['name']}"
        or pool.get("kind") != (crd["names"]["kind"])
    ):
        problems.append(f"not an {crd['names']['kind']} of {crd['group']}/{version['name']}")
    document = defaulted(pool, INFERENCE_POOL_SCHEMA)
    problems += schema_errors(document, closed(INFERENCE_POOL_SCHEMA))
    return problems + cel_violations(document, schema=INFERENCE_POOL_SCHEMA)
