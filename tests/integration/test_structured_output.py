"""Constrained decoding on the bundled SmolLM2-135M (CPU, in-process scheduler): whatever the
model would rather say, a JSON Schema's output parses and validates, a regex's output matches in
full, an EBNF grammar's output is in its language; rows without a constraint in the same batch
decode exactly as they would alone; overlap scheduling changes no output; logit_bias forces and
bans tokens.

The schemas of the property test are drawn from the subset every output can finish inside:
every string has a maxLength, every array a maxItems, every number bounds. From a schema the test
computes the longest text it allows, so `max_new_tokens` leaves room for any output (a token is
at least one character) and every request must finish with the grammar's stop, never by length.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from engine_harness import make_scheduler, run_to_completion
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from radixserve.model_loader.loader import load_model_source
from radixserve.sampling.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
MODEL = "builtin:smollm2-135m"


@pytest.fixture(scope="module")
def source():
    return load_model_source(MODEL, device="cpu")


@pytest.fixture(scope="module")
def scheduler(source):
    """One scheduler for the module: its grammar cache and prefix cache carry over, as a
    server's do."""
    return make_scheduler(MODEL, source, max_total_tokens=16384)


def chat(source, instruction: str) -> list[int]:
    text = source.tokenizer.apply_chat_template(
        [{"role": "user", "content": instruction}], add_generation_prompt=True, tokenize=False
    )
    return source.tokenizer.encode(text)


def decode(source, ids: list[int]) -> str:
    return source.tokenizer.decode(ids, skip_special_tokens=True)


def generate(scheduler, prompts, params, overlap=False) -> dict[str, dict]:
    scheduler.overlap = overlap
    try:
        return run_to_completion(scheduler, prompts, params)
    finally:
        scheduler.overlap = False


# -- random schemas within the supported subset ------------------------------------------------

KEYS = st.sampled_from(["id", "name", "ok", "tags", "score", "kind", "x"])
LITERALS = st.one_of(
    st.sampled_from(["red", "green", "a b"]), st.integers(-50, 50), st.booleans(), st.none()
)


@st.composite
def bounded_integers(draw):
    low = draw(st.integers(-1000, 1000))
    return {"type": "integer", "minimum": low, "maximum": low + draw(st.integers(0, 500))}


@st.composite
def bounded_numbers(draw):
    low = draw(st.integers(-100, 100)) / 4
    return {"type": "number", "minimum": low, "maximum": low + draw(st.integers(1, 400)) / 4}


@st.composite
def bounded_strings(draw):
    high = draw(st.integers(1, 6))
    return {"type": "string", "minLength": draw(st.integers(0, min(high, 3))), "maxLength": high}


LEAVES = st.one_of(
    bounded_integers(),
    bounded_numbers(),
    bounded_strings(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(LITERALS, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
)


def containers(children):
    @st.composite
    def arrays(draw):
        low = draw(st.integers(0, 2))
        high = draw(st.integers(max(low, 1), 2))
        return {"type": "array", "items": draw(children), "minItems": low, "maxItems": high}

    @st.composite
    def objects(draw):
        keys = draw(st.lists(KEYS, min_size=1, max_size=3, unique=True))
        required = [k for k in keys if draw(st.booleans())]
        schema = {"type": "object", "properties": {k: draw(children) for k in keys}}
        return schema | ({"required": required} if required else {})

    return arrays() | objects()


SCHEMAS = st.recursive(LEAVES, containers, max_leaves=4)


def longest_text(schema: dict) -> int:
    """Characters of the longest compact JSON the schema allows (a string character may be a
    six-character escape)."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema["type"]
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "number":
        return 1 + len(str(int(max(abs(schema["minimum"]), abs(schema["maximum"]))))) + 1 + 6
    if kind == "string":
        return 2 + 6 * schema["maxLength"]
    if kind in ("boolean", "null"):
        return 5
    if kind == "array":
        return 2 + schema["maxItems"] * (longest_text(schema["items"]) + 2)
    props = schema["properties"]
    return 2 + sum(len(k) + 6 + longest_text(v) for k, v in props.items())


EVERY_KIND = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "scores": {
                "type": "array",
                "items": {"type": "number", "minimum": 0, "maximum": 10},
                "minItems": 1,
                "maxItems": 2,
            },
            "pet": {
                "type": "object",
                "properties": {"kind": {"enum": ["cat", "dog", None]}, "ok": {"type": "boolean"}},
                "required": ["kind"],
            },
            "note": {"type": "null"},
        },
        "required": ["name", "age", "pet"],
    },
    {"type": "array", "items": {"enum": ["red", 3, True]}, "minItems": 2, "maxItems": 3},
    {"type": "boolean"},
    {"type": "string", "maxLength": 4},
    {"type": "number", "minimum": -2.5, "maximum": 2.5},
]


@example(schemas=EVERY_KIND)
@settings(
    max_examples=3,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(schemas=st.lists(SCHEMAS, min_size=5, max_size=5, unique_by=json.dumps))
def test_every_output_validates_against_its_random_schema(source, scheduler, schemas):
    prompts, params = [], []
    for schema in schemas:
        text = json.dumps(schema)
        prompts.append(chat(source, f"Reply with JSON that follows this JSON Schema: {text}"))
        params.append(
            SamplingParams(
                max_new_tokens=longest_text(schema) + 2, temperature=0.0, json_schema=text
            )
        )
    results = generate(scheduler, prompts, params, overlap=True)
    for i, schema in enumerate(schemas):
        result = results[f"r{i}"]
        assert result["finish"]["type"] == "stop", (schema, result)
        output = decode(source, result["ids"])
        jsonschema.validate(json.loads(output), schema)


# -- regex, EBNF, mixed batches, overlap -------------------------------------------------------

REGEXES = [
    (r"\d{3}-\d{4}", "What is the phone number of the office?"),
    (r"(Mon|Tue|Wed|Thu|Fri) [0-2][0-9]:[0-5][0-9]", "When does the meeting start?"),
    (r"[a-z]+@[a-z]+\.(com|org)", "Give me an email address."),
    (r"(yes|no)", "Is the sky green? Answer in one word."),
]
ARITHMETIC = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]?
"""


def test_regex_outputs_match_in_full(source, scheduler):
    prompts = [chat(source, question) for _, question in REGEXES]
    params = [SamplingParams(max_new_tokens=40, temperature=0.0, regex=r) for r, _ in REGEXES]
    results = generate(scheduler, prompts, params)
    for i, (regex, _) in enumerate(REGEXES):
        assert results[f"r{i}"]["finish"]["type"] == "stop"
        assert re.fullmatch(regex, decode(source, results[f"r{i}"]["ids"]))


def test_ebnf_output_is_in_the_grammar_and_sampling_too(source, scheduler):
    prompt = chat(source, "Write an arithmetic expression.")
    params = [
        SamplingParams(max_new_tokens=16, temperature=0.0, ebnf=ARITHMETIC),
        SamplingParams(max_new_tokens=16, temperature=1.0, seed=1, ebnf=ARITHMETIC),
        SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.9, seed=2, ebnf=ARITHMETIC),
    ]
    results = generate(scheduler, [prompt] * 3, params)
    expression = re.compile(r"[0-9+\-()]+")
    for i in range(3):
        text = decode(source, results[f"r{i}"]["ids"])
        assert expression.fullmatch(text), text
        if results[f"r{i}"]["finish"]["type"] == "stop":
            # a complete expression: balanced, and Python evaluates it the same way
            assert isinstance(eval(text, {"__builtins__": {}}), int), text  # noqa: S307


def test_unconstrained_rows_decode_as_they_would_alone(source, scheduler):
    questions = ["Name a color.", "Count to five.", "Say hello in French."]
    prompts = [chat(source, q) for q in questions]
    plain = SamplingParams(max_new_tokens=12, temperature=0.0)
    alone = generate(scheduler, prompts, [plain] * 3)
    constrained = SamplingParams(max_new_tokens=12, temperature=0.0, regex=r"[A-Z][a-z]{2,6}")
    mixed = generate(scheduler, prompts + prompts, [plain] * 3 + [constrained] * 3)
    for i in range(3):
        assert mixed[f"r{i}"]["ids"] == alone[f"r{i}"]["ids"]
        assert re.fullmatch(r"[A-Z][a-z]{2,6}", decode(source, mixed[f"r{i + 3}"]["ids"]))


def test_overlap_changes_no_constrained_output(source, scheduler):
    schema = json.dumps(
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "population": {"type": "integer", "minimum": 0, "maximum": 10**8},
                "capital": {"type": "boolean"},
            },
            "required": ["city", "population"],
        }
    )
    prompts = [chat(source, f"Describe {c} as JSON.") for c in ("Paris", "Lyon", "Berlin")]
    params = [
        SamplingParams(max_new_tokens=40, temperature=0.0, json_schema=schema),
        SamplingParams(max_new_tokens=40, temperature=0.9, seed=7, json_schema=schema),
        SamplingParams(max_new_tokens=12, temperature=0.0, regex=r"[A-Z][a-z]+"),
        SamplingParams(max_new_tokens=8, temperature=0.0),
    ]
    prompts.append(prompts[0])
    without = generate(scheduler, prompts, params)
    with_overlap = generate(scheduler, prompts, params, overlap=True)
    for rid, result in without.items():  # the second run finds the prompts cached: no matter
        assert (with_overlap[rid]["ids"], with_overlap[rid]["finish"]) == (
            result["ids"],
            result["finish"],
        )
    for i in range(2):
        jsonschema.validate(json.loads(decode(source, without[f"r{i}"]["ids"])), json.loads(schema))


def test_logit_bias_forces_and_bans_a_token(source, scheduler):
    prompt = chat(source, "What is the capital of France?")
    plain = generate(scheduler, [prompt], SamplingParams(max_new_tokens=3, temperature=0.0))
    first = plain["r0"]["ids"][0]
    forced = source.tokenizer.encode(" banana")[0]
    results = generate(
        scheduler,
        [prompt, prompt],
        [
            SamplingParams(max_new_tokens=3, temperature=0.0, logit_bias={first: -100}),
            SamplingParams(max_new_tokens=3, temperature=0.7, seed=1, logit_bias={forced: 100}),
        ],
    )
    assert first not in results["r0"]["ids"]
    assert results["r1"]["ids"] == [forced] * 3
