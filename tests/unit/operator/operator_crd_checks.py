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
