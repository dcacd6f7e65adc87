"""The InferenceService CRD loaded from crds/, and checks a real API server would make with it:
OpenAPI schema validation, structural defaulting and CEL rules (through cel-python)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml
from hypothesis import strategies as st

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


def strategy_for(schema: dict[str, Any]) -> st.SearchStrategy:
    """Documents the (structural, OpenAPI 3.0) schema describes, for the keywords our CRD uses.
    Draws are not yet checked against CEL rules or cross-field constraints: see `valid_specs`."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        return st.sampled_from([0, 1, 2, "25%", "500m", "1", "4Gi"])
    kind = schema.get("type")
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low = schema.get("minimum", -(2**31)) + (1 if schema.get("exclusiveMinimum") else 0)
        high = schema.get("maximum", low + 100_000) - (1 if schema.get("exclusiveMaximum") else 0)
        return st.integers(low, high)
    if kind == "number":
        return st.floats(
            schema.get("minimum", -1e6),
            schema.get("maximum", 1e6),
            exclude_min=bool(schema.get("exclusiveMinimum")),
            exclude_max=bool(schema.get("exclusiveMaximum")),
            allow_nan=False,
        )
    if kind == "string":
        if "pattern" in schema:
            text = st.from_regex(schema["pattern"], fullmatch=True)
        else:  # names, images, quantities: printable text, leading dashes included
            text = st.text(
                st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=24
            )
        return text.filter(lambda s: len(s) <= schema.get("maxLength", 1 << 16))
    if kind == "array":
        return st.lists(strategy_for(schema["items"]), max_size=2)
    if kind == "object":
        properties = schema.get("properties", {})
        if properties:
            required = set(schema.get("required", ()))
            return st.fixed_dictionaries(
                {k: strategy_for(v) for k, v in properties.items() if k in required},
                optional={k: strategy_for(v) for k, v in properties.items() if k not in required},
            )
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            return st.dictionaries(
                st.sampled_from(["a", "b", "cpu"]), strategy_for(values), max_size=2
            )
        return st.just({})  # x-kubernetes-preserve-unknown-fields: opaque to us
    raise ValueError(f"no strategy for schema keywords {sorted(schema)}")


def spec_strategy() -> st.SearchStrategy:
    """InferenceService specs drawn from the CRD's own schema, kept when the API server would
    accept them (schema and CEL rules, after defaulting)."""
    return strategy_for(SCHEMA["properties"]["spec"]).filter(_accepted)


def _accepted(spec: dict[str, Any]) -> bool:
    document = {"apiVersion": "radixserve.io/v1alpha1", "kind": "InferenceService", "spec": spec}
    document = defaulted(document)
    return not schema_errors(document) and not cel_violations(document)
