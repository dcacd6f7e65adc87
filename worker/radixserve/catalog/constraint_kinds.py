"""The front end's check of a constraint before anything is admitted: torch-free and cheap.

xgrammar cannot be imported here (it loads torch, which the front-end process must not), so this
checks what can be checked without it: a JSON Schema must parse and pass its metaschema, a regex
must be one that Python's `re` accepts and an EBNF grammar must define `root`. What only the
compiler finds (an xgrammar-unsupported regex feature, a contradictory schema such as
minLength > maxLength, an EBNF syntax error) fails the compile in the scheduler process, before
admission too, and reaches the client the same way: an error naming the parameter.
"""

from __future__ import annotations

import json
import re

CONSTRAINT_KINDS = ("json_schema", "regex", "ebnf")

_ROOT_RULE = re.compile(r"^\s*root\s*::=", re.MULTILINE)


def validate_constraint(kind: str, text: object) -> str | None:
    """Why `text` cannot be a constraint of `kind` (one of CONSTRAINT_KINDS), or None.

    The message reads after the parameter's name: `f"{kind} {message}"`."""
    if kind not in CONSTRAINT_KINDS:
        raise ValueError(f"unknown constraint kind {kind!r}; one of {CONSTRAINT_KINDS}")
    if not isinstance(text, str):
        return f"must be a string, got {type(text).__name__}"
    if not text.strip():
        return "must not be empty"
    if kind == "json_schema":
        return _schema_problem(text)
    if kind == "regex":
        try:
            re.compile(text)
        except re.error as exc:
            return f"is not a valid regular expression: {exc}"
        return None
    if not _ROOT_RULE.search(text):
        return "must define the rule `root` (root ::= ...)"
    return None


def _schema_problem(text: str) -> str | None:
    # imported here: the scheduler process imports this module (through SamplingParams) but
    # never calls it, and a lean GPU image need not carry jsonschema for it
    import jsonschema

    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"is not valid JSON: {exc}"
    if not isinstance(schema, dict | bool):
        return f"must be a JSON Schema (an object or a boolean), got {type(schema).__name__}"
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"is not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
    return None
