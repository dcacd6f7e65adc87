"""SamplingParams: types checked on construction, ranges checked by verify, picklable."""

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixserve.api_errors import InvalidParameterError
from radixserve.sampling.sampling_params import SamplingParams

VOCAB = 1000


def test_defaults_verify_and_are_not_greedy():
    params = SamplingParams()
    params.verify(VOCAB)
    assert not params.is_greedy
    assert params.stop == [] and params.stop_token_ids == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 100.5),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_k", -2),
        ("top_k", VOCAB + 1),
        ("top_k", 2**63),  # used to reach an int64 tensor in the scheduler and kill it
        ("top_k", -(2**63) - 1),
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("frequency_penalty", 2.5),
        ("frequency_penalty", -2.5),
        ("presence_penalty", 2.01),
        ("presence_penalty", -3.0),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", 2.5),
        ("max_new_tokens", -1),
        ("max_new_tokens", 2**31),
        ("max_new_tokens", 2**64),
        ("min_new_tokens", -1),
        ("min_new_tokens", -(2**63)),
        ("min_new_tokens", 200),
        ("n", 0),
        ("n", 129),
        ("n", 2**64),
        ("stop_token_ids", [VOCAB]),
        ("stop_token_ids", [2**63]),
        ("stop_token_ids", [-1]),
        ("stop", [""]),
        ("stop", [f"s{i}" for i in range(17)]),
        ("seed", -1),
        ("seed", 2**64),
        ("logit_bias", {VOCAB: 1.0}),
        ("logit_bias", {"-1": 1.0}),
        ("logit_bias", {5: 100.5}),
        ("logit_bias", {5: -101}),
        ("logit_bias", {2**64: 1.0}),
        ("logit_bias", {5: float("inf")}),
        ("temperature", float("inf")),
        ("top_p", float("nan")),
        ("min_p", float("-inf")),
        ("repetition_penalty", float("nan")),
        ("frequency_penalty", 1e308),
        ("json_schema", '{"type": "objekt"}'),
        ("json_schema", "{not json"),
        ("regex", "(unclosed"),
        ("regex", "(?=a)a"),
        ("regex", "(a)\\1"),
        ("regex", "a\ud800"),
        ("json_schema", '{"$ref": "https://example.com/schema.json"}'),
        ("json_schema", '{"type": "string", "pattern": "^(?!x)"}'),
        ("json_schema", "[" * 5000 + "]" * 5000),
        ("ebnf", 'start ::= "a"'),
    ],
)
def test_verify_rejects_out_of_range_naming_the_parameter(field, value):
    params = SamplingParams(**{field: value})
    with pytest.raises(InvalidParameterError, match=field) as info:
        params.verify(VOCAB)
    assert info.value.param == field
    assert isinstance(info.value, ValueError)  # in-process callers catch ValueError


@pytest.mark.parametrize(
    "overrides",
    [
        {"temperature": 0.0},
        {"temperature": 100.0},
        {"top_p": 1e-6},
        {"top_k": 0},
        {"top_k": 1},
        {"top_k": VOCAB},
        {"min_p": 1.0},
        {"frequency_penalty": -2.0, "presence_penalty": 2.0},
        {"repetition_penalty": 2.0},
        {"repetition_penalty": 0.01},
        {"max_new_tokens": 0, "min_new_tokens": 0},
        {"min_new_tokens": 128},
        {"n": 128},
        {"stop_token_ids": [0, VOCAB - 1]},
        {"stop": [f"s{i}" for i in range(16)]},
        {"seed": 0},
        {"seed": 2**64 - 1},
        {"logit_bias": {0: -100, VOCAB - 1: 100}},
        {"logit_bias": {}},
        {"json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}}}'},
        {"regex": "[a-z]+@[a-z]+\\.com"},
        {"ebnf": 'root ::= "yes" | "no"'},
    ],
)
def test_verify_accepts_boundaries(overrides):
    SamplingParams(**overrides).verify(VOCAB)


@given(
    temperature=st.floats(0.0, 100.0),
    top_p=st.floats(0.0, 1.0, exclude_min=True),
    top_k=st.one_of(st.just(-1), st.integers(0, VOCAB)),
    min_p=st.floats(0.0, 1.0),
    frequency_penalty=st.floats(-2.0, 2.0),
    repetition_penalty=st.floats(0.0, 2.0, exclude_min=True),
)
def test_verify_accepts_every_in_range_combination(
    temperature, top_p, top_k, min_p, frequency_penalty, repetition_penalty
):
    SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        repetition_penalty=repetition_penalty,
    ).verify(VOCAB)


def test_from_dict_rejects_unknown_key_by_name():
    with pytest.raises(InvalidParameterError, match="max_tokens") as info:
        SamplingParams.from_dict({"temperature": 0.5, "max_tokens": 3})
    assert info.value.param == "max_tokens"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "hot"),
        ("top_k", 2.5),
        ("max_new_tokens", True),
        ("n", "2"),
        ("ignore_eos", 1),
        ("stop", 5),
        ("stop", ["a", 3]),
        ("stop_token_ids", [1, "2"]),
        ("stop_token_ids", 7),
        ("seed", 1.5),
        ("top_p", False),
        ("json_schema", {"type": "object"}),
        ("regex", ["a"]),
        ("ebnf", 3),
        ("logit_bias", [[5, 1.0]]),
        ("logit_bias", {"five": 1.0}),
        ("logit_bias", {"5": "high"}),
        ("logit_bias", {"5": float("nan")}),
        ("logit_bias", {True: 1.0}),
        ("logit_bias", {"5": 10**400}),  # beyond a float: refused, not an OverflowError
        ("logit_bias", {"1" * 5000: 1.0}),  # no token id (and beyond int()'s digit limit)
        ("temperature", 10**400),
        ("top_p", 10**309),
        ("stop", ["ok", "\udc00"]),  # a lone surrogate no tokenizer can encode
    ],
)
def test_from_dict_rejects_wrong_types_naming_the_parameter(field, value):
    with pytest.raises(InvalidParameterError, match=field) as info:
        SamplingParams.from_dict({field: value})
    assert info.value.param == field


def test_from_dict_rejects_a_non_object():
    with pytest.raises(ValueError, match="sampling_params"):
        SamplingParams.from_dict(["temperature", 0.5])


def test_from_dict_normalizes_values():
    params = SamplingParams.from_dict(
        {"temperature": 1, "stop": "###", "seed": None, "top_p": None, "max_new_tokens": 7}
    )
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert params.stop == ["###"]
    assert params.top_p == 1.0 and params.seed is None
    assert params.max_new_tokens == 7


def test_logit_bias_keys_from_json_become_token_ids():
    params = SamplingParams.from_dict({"logit_bias": {"50": -100, " 7 ": 2, 3: 1.5}})
    assert params.logit_bias == {50: -100.0, 7: 2.0, 3: 1.5}
    assert all(isinstance(v, float) for v in params.logit_bias.values())


def test_at_most_one_constraint_naming_the_second():
    with pytest.raises(ValueError, match=r"^ebnf cannot be combined with regex"):
        SamplingParams(regex="a", ebnf='root ::= "a"')
    assert SamplingParams(regex="a+").constraint == ("regex", "a+")
    assert SamplingParams().constraint is None


def test_a_constraint_cannot_hold_back_the_end():
    params = SamplingParams(json_schema='{"type": "integer"}', min_new_tokens=2)
    with pytest.raises(ValueError, match="^min_new_tokens cannot be combined with json_schema"):
        params.verify(VOCAB)


def test_constructor_wraps_a_single_stop_string():
    assert SamplingParams(stop="END").stop == ["END"]


@pytest.mark.parametrize(
    ("overrides", "greedy"),
    [
        ({"temperature": 0.0}, True),
        ({"top_k": 1}, True),
        ({"temperature": 0.7, "top_k": 1}, True),
        ({"temperature": 0.7}, False),
        ({"top_k": 2}, False),
    ],
)
def test_is_greedy(overrides, greedy):
    assert SamplingParams(**overrides).is_greedy is greedy


def test_pickle_roundtrip():
    params = SamplingParams(
        temperature=0.3,
        stop=["x"],
        stop_token_ids=[3],
        seed=42,
        n=2,
        json_schema='{"type": "string"}',
        logit_bias={"4": -100},
    )
    assert pickle.loads(pickle.dumps(params)) == params


def test_max_new_tokens_is_bounded_by_the_context_given():
    SamplingParams(max_new_tokens=4096).verify(VOCAB, 4096)
    with pytest.raises(InvalidParameterError, match=r"max_new_tokens must be in \[0, 4096\]"):
        SamplingParams(max_new_tokens=4097).verify(VOCAB, 4096)


@given(
    field=st.sampled_from(
        ["max_new_tokens", "min_new_tokens", "top_k", "n", "seed", "temperature", "top_p"]
    ),
    value=st.one_of(
        st.integers(min_value=2**63 - 2, max_value=2**80),
        st.integers(min_value=-(2**80), max_value=-(2**63) + 2),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
    ),
)
def test_extreme_numbers_are_400s_naming_the_field_never_other_errors(field, value):
    """Whatever number a client sends, the answer is valid params or InvalidParameterError
    naming the field: no OverflowError, no value that would overflow an int64 tensor."""
    try:
        params = SamplingParams.from_dict({field: value})
        params.verify(VOCAB, 4096)
    except InvalidParameterError as exc:
        assert exc.param == field
        return
    for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
        assert -(2**31) < getattr(params, name) < 2**31
    assert params.seed is None or 0 <= params.seed < 2**64
