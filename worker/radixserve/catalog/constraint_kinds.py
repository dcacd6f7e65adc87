"""The front end's check of a constraint before anything is admitted: torch-free and cheap.

xgrammar cannot be imported here (it loads torch, which the front-end process must not), so this
checks what can be checked without it: a JSON Schema must parse, pass its metaschema, nest at
most MAX_SCHEMA_DEPTH levels, reference only itself (`$ref` to `#...`: a remote reference would
leave the output unconstrained) and use only regexes of the dialect below in `pattern` and
`patternProperties`; a regex must be one that Python's `re` accepts, in the dialect xgrammar
enforces (no lookarounds, no backreferences: xgrammar refuses them in a `regex` and would
silently ignore them in a schema's `pattern`); an EBNF grammar must define `root`; no text may
hold a lone surrogate (not Unicode: nothing downstream can encode it). What only the compiler
finds (a contradictory schema such as minLength > maxLength, an EBNF syntax error) fails the
compile in the scheduler process, before admission too, and reaches the client the same way: an
error naming the parameter.
"""

from __future__ import annotations

import json
import re
from typing import Any

try:  # the regex parser behind `re` (a private module, stable since 3.11; sre_parse before)
    import re._constants as _re_constants
    import re._parser as _re_parser
except ImportError:  # pragma: no cover
    import sre_constants as _re_constants  # type: ignore[no-redef]
    import sre_parse as _re_parser  # type: ignore[no-redef]

CONSTRAINT_KINDS = ("json_schema", "regex", "ebnf")
# how deep a JSON Schema may nest (every object and array counts): real schemas stay far below;
# the metaschema check and the grammar compiler recurse once or more per level
MAX_SCHEMA_DEPTH = 64

_ROOT_RULE = re.compile(r"^\s*root\s*::=", re.MULTILINE)
_SURROGATE = re.compile("[\ud800-\udfff]")
# regex constructs the grammar engine cannot enforce, by the parser's name for them
_UNSUPPORTED_REGEX = (
    (_re_constants.ASSERT, "a lookahead or lookbehind ((?=...), (?<=...))"),
    (_re_constants.ASSERT_NOT, "a negative lookahead or lookbehind ((?!...), (?<!...))"),
    (_re_constants.GROUPREF, "a backreference (\\1, (?P=name))"),
    (_re_constants.GROUPREF_EXISTS, "a conditional group ((?(1)...))"),
)
# schema keywords whose value is data, not a schema: never read as keywords
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})
# schema keywords whose value maps names (not keywords) to schemas
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")


def validate_constraint(kind: str, text: object) -> str | None:
    """Why `text` cannot be a constraint of `kind` (one of CONSTRAINT_KINDS), or None.

    The message reads after the parameter's name: `f"{kind} {message}"`."""
    if kind not in CONSTRAINT_KINDS:
        raise ValueError(f"unknown constraint kind {kind!r}; one of {CONSTRAINT_KINDS}")
    if not isinstance(text, str):
        return f"must be a string, got {type(text).__name__}"
    if not text.strip():
        return "must not be empty"
    surrogate = surrogate_problem(text)
    if surrogate is not None:
        return surrogate
    if kind == "json_schema":
        return _schema_text_problem(text)
    if kind == "regex":
        return regex_problem(text)
    if not _ROOT_RULE.search(text):
        return "must define the rule `root` (root ::= ...)"
    return None


def surrogate_problem(text: str) -> str | None:
    """Why `text` is not Unicode that can be encoded (a lone UTF-16 surrogate such as the JSON
    escape \\ud800), or None."""
    if text.isascii():  # the common case, checked at memory speed (a 60 MB prompt: ~5 ms)
        return None
    try:
        text.encode("utf-8")  # C speed (60 MB: ~50 ms); fails only on a lone surrogate
        return None
    except UnicodeEncodeError:
        pass
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (
        f"holds a lone surrogate (\\u{ord(found.group()):04x} at position {found.start()}), "
        "which is not valid Unicode"
    )


def regex_problem(pattern: str) -> str | None:
    """Why `pattern` is not a regex constrained decoding can enforce, or None: it must parse
    (Python's `re`) and use no lookaround, backreference or conditional group."""
    try:
        parsed = _re_parser.parse(pattern)
    except re.error as exc:
        return f"is not a valid regular expression: {exc}"
    except (RecursionError, OverflowError, ValueError) as exc:
        return f"is not a regular expression this server can read: {type(exc).__name__}"
    stack: list[Any] = [parsed]
    while stack:
        item = stack.pop()
        if isinstance(item, _re_parser.SubPattern):
            stack.extend(item.data)
        elif isinstance(item, tuple | list):
            # opcodes are ints: compared by identity, so a group number or a repeat count
            # that happens to equal one is not taken for it
            what = next((w for op, w in _UNSUPPORTED_REGEX if item and item[0] is op), None)
            if what is not None:
                return (
                    f"uses {what}, which constrained decoding cannot enforce (no lookarounds "
                    "or backreferences)"
                )
            stack.extend(item)
    return None


def schema_problem(schema: Any) -> str | None:
    """Why the decoded JSON Schema `schema` cannot constrain an output, or None. The message
    reads after the parameter's name."""
    import jsonschema  # here: a lean GPU image need not carry it (only the front end checks)

    if not isinstance(schema, dict | bool):
        return f"must be a JSON Schema (an object or a boolean), got {type(schema).__name__}"
    if json_depth(schema) > MAX_SCHEMA_DEPTH:
        return f"nests more than {MAX_SCHEMA_DEPTH} levels deep"
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"is not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
    except RecursionError:
        return "nests too deeply to be checked"
    return schema_features_problem(schema)


def schema_features_problem(schema: Any) -> str | None:
    """What in a (valid) JSON Schema constrained decoding cannot honour, or None: a `$ref`
    that leaves the document (a remote schema, which would leave the output unconstrained),
    a `pattern` or `patternProperties` key outside the regex dialect."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((item, f"{where}/{i}") for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            at = f"{where}/{key}"
            if key in _DATA_KEYWORDS:
                continue
            if key in _REFERENCES and isinstance(value, str) and not value.startswith("#"):
                return (
                    f"has a {key} to {value!r} at {at}: only references inside the schema "
                    "(starting with #) are supported"
                )
            if key == "pattern" and isinstance(value, str):
                problem = regex_problem(value)
                if problem is not None:
                    return f"has a pattern at {at} that {problem}"
            if key in _NAMED_SCHEMAS and isinstance(value, dict):
                for name, sub in value.items():
                    if key == "patternProperties":
                        problem = regex_problem(name)
                        if problem is not None:
                            return f"has a patternProperties key {name!r} at {at} that {problem}"
                    stack.append((sub, f"{at}/{name}"))
            elif isinstance(value, dict | list):
                stack.append((value, at))
    return None


def json_depth(value: Any) -> int:
    """How deep a decoded JSON value nests (a scalar is 0, `[]` and `{}` are 1), level by
    level, without recursion."""
    depth = 0
    level = [value] if isinstance(value, dict | list) else []
    while level:
        depth += 1
        deeper: list[Any] = []
        for node in level:
            children = node.values() if isinstance(node, dict) else node
            deeper += [child for child in children if isinstance(child, dict | list)]
        level = deeper
    return depth


def _schema_text_problem(text: str) -> str | None:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"is not valid JSON: {exc}"
    except RecursionError:
        return f"nests more than {MAX_SCHEMA_DEPTH} levels deep"
    except ValueError as exc:  # an integer too long to convert
        return f"is not valid JSON: {exc}"
    return schema_problem(schema)
