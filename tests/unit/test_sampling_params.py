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
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("frequency_penalty", 2.5),
        ("frequency_penalty", -2.5),
        ("presence_penalty", 2.01),
        ("presence_penalty", -3.0),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", 2.5),
        ("max_new_tokens", -1),
        ("min_new_tokens", -1),
        ("min_new_tokens", 200),
        ("n", 0),
        ("n", 129),
        ("stop_token_ids", [VOCAB]),
        ("stop_token_ids", [-1]),
        ("stop", [""]),
        ("stop", [f"s{i}" for i in range(17)]),
        ("seed", -1),
        ("seed", 2**64),
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
        {"top_k": 5000},
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
    ],
)
def test_verify_accepts_boundaries(overrides):
    SamplingParams(**overrides).verify(VOCAB)


@given(
    temperature=st.floats(0.0, 100.0),
    top_p=st.floats(0.0, 1.0, exclude_min=True),
    top_k=st.one_of(st.just(-1), st.integers(0, 10**6)),
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
    params = SamplingParams(temperature=0.3, stop=["x"], stop_token_ids=[3], seed=42, n=2)
    assert pickle.loads(pickle.dumps(params)) == params
