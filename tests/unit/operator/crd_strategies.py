"""Hypothesis strategies for InferenceService specs, drawn from the CRD's own schema.

Each schema node becomes a strategy: enums, bounds, patterns (`from_regex`), required and
optional properties, int-or-string values. Free-form strings come from a small pool of values
that mean something for the field (`STRING_POOLS`), so a drawn spec is one a user could write;
free-form objects (affinity, a toleration) are left out. The CRD's CEL rules are checked by the
caller (`operator_crd_checks.cel_violations`).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from operator_crd_checks import SCHEMA, cel_violations, defaulted, schema_errors

SPEC_SCHEMA = SCHEMA["properties"]["spec"]
# Free-form strings by the property's path (dotted, list items as their parent's name).
STRING_POOLS: dict[str, list[str]] = {
    # served names the worker gets as a flag's value, a leading dash included
    "model.name": ["small", "meta-llama/Llama-3.1-8B-Instruct", "-dash", "--flag", "a b"],
    "image": ["registry.example/radixserve:1"],
    "resources.gpuResourceName": ["nvidia.com/gpu", "amd.com/gpu"],
    "engine.extraArgs": ["--log-level", "debug", "--random-seed", "3"],
    "monitoring.interval": ["15s", "1m"],
    "modelCache.claimName": ["hf-cache", "models"],
    "nodeSelector": ["a", "true"],
    "runtimeClassName": ["nvidia"],
    # the cache locations the operator sets, and names it does not
    "env.name": ["HF_HOME", "HOME", "TRITON_CACHE_DIR", "HF_TOKEN", "LOG_LEVEL"],
}
MAP_KEYS = {
    "resources.requests": ["cpu", "memory"],
    "resources.limits": ["cpu", "memory"],
    "nodeSelector": ["pool", "nvidia.com/gpu.present"],
}
QUANTITIES = ["500m", "2", "4Gi", "16Gi"]
# How far above its minimum an unbounded integer is drawn.
INTEGER_SPAN = 64


def from_schema(schema: dict[str, Any], path: str = "") -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(0, 4), st.sampled_from([*QUANTITIES, "25%"]))
    kind = schema.get("type")
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low = schema.get("minimum", 0)
        return st.integers(low, schema.get("maximum", low + INTEGER_SPAN))
    if kind == "number":
        return st.floats(
            schema.get("minimum", 0.0),
            schema.get("maximum", 100.0),
            exclude_min=schema.get("exclusiveMinimum", False),
            exclude_max=schema.get("exclusiveMaximum", False),
        )
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda s: s.isprintable() and s.isascii()
            )
        return st.sampled_from(STRING_POOLS[path])
    if kind == "array":
        return st.lists(from_schema(schema["items"], path), max_size=3)
    if kind == "object":
        return _object(schema, path)
    raise AssertionError(f"no strategy for {path}: {schema}")


def _object(schema: dict[str, Any], path: str) -> st.SearchStrategy[Any]:
    if "additionalProperties" in schema:
        values = from_schema(schema["additionalProperties"], path)
        return st.dictionaries(st.sampled_from(MAP_KEYS[path]), values, max_size=2)
    properties = schema.get("properties") or {}
    if schema.get("x-kubernetes-preserve-unknown-fields") and not properties:
        return st.nothing()  # free-form (affinity, a toleration): nothing to draw from
    required = set(schema.get("required") or [])

    def sub(name: str) -> st.SearchStrategy[Any]:
        return from_schema(properties[name], f"{path}.{name}".lstrip("."))

    drawable = {n for n in properties if n in required or not _free_form(properties[n])}
    return st.fixed_dictionaries(
        {name: sub(name) for name in sorted(required)},
        optional={name: sub(name) for name in sorted(drawable - required)},
    )


def _free_form(schema: dict[str, Any]) -> bool:
    node = schema.get("items", schema)
    return bool(node.get("x-kubernetes-preserve-unknown-fields")) and not node.get("properties")


specs = from_schema(SPEC_SCHEMA)


def accepted(spec: dict[str, Any]) -> bool:
    """Whether the API server would accept the spec: its schema and CEL rules, defaulted."""
    document = defaulted({"spec": spec})
    return schema_errors(document) == [] and cel_violations(document) == []
