"""The TokenizerManager's front door, shared by every endpoint: validation with the parameter
named in each API's own words, tokenization, `n` fan-out and request ids; and the output side:
a stop token never shows up in the text."""

from __future__ import annotations

import asyncio
import threading

import pytest

from radixserve.api_errors import APIError, InvalidParameterError
from radixserve.boundary import ReqOutput, TokenizedGenerateReqInput
from radixserve.frontend.openai.protocol import OPENAI_PARAM_NAMES
from radixserve.frontend.tokenizer_manager import (
    INLINE_TOKENIZE_CHARS,
    GenerateRequest,
    PromptTooLongError,
    TokenizerManager,
)
from radixserve.metrics.collectors import ServerMetrics
from radixserve.sampling.sampling_params import SamplingParams

MAX_REQUEST_TOKENS = 256


@pytest.fixture
def tm(smollm2_tokenizer) -> TokenizerManager:
    """A TokenizerManager that is never started: build_inputs and output processing need no
    scheduler."""
    return TokenizerManager(
        tokenizer=smollm2_tokenizer,
        scheduler_input_ipc_name="ipc://unused",
        tokenizer_ipc_name="ipc://unused",
        scheduler_process=None,  # type: ignore[arg-type]
        metrics=ServerMetrics("m"),
        max_queued_requests=8,
        vocab_size=len(smollm2_tokenizer),
        max_request_tokens=MAX_REQUEST_TOKENS,
    )


def build(tm: TokenizerManager, request: GenerateRequest) -> list[TokenizedGenerateReqInput]:
    return asyncio.run(tm.build_inputs(request))


def request(ids: list[int], params: SamplingParams, **fields) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid=fields.pop("rid", "r"), input_ids=ids, sampling_params=params, **fields
    )


def test_n_fans_out_with_derived_ids_and_seeds(tm):
    request = GenerateRequest(
        prompts=["Hello", [5, 6, 7]],
        sampling_params=[{"n": 2, "seed": 10, "max_new_tokens": 3}] * 2,
        request_id="abc",
    )
    inputs = build(tm, request)
    assert [i.rid for i in inputs] == ["abc-0", "abc-1", "abc-2", "abc-3"]
    assert [i.sampling_params.seed for i in inputs] == [10, 11, 10, 11]
    assert all(i.sampling_params.n == 1 for i in inputs)
    assert inputs[0].input_ids == asyncio.run(tm.encode("Hello")) and inputs[2].input_ids == [
        5,
        6,
        7,
    ]
    (single,) = build(tm, GenerateRequest(prompts=["x"], sampling_params=[{}], request_id="r"))
    assert single.rid == "r"


def test_fill_context_makes_an_unset_max_tokens_fill_the_context(tm):
    ids = [5] * 10
    (openai_style,) = build(
        tm,
        GenerateRequest(
            prompts=[ids], sampling_params=[{"max_new_tokens": None}], fill_context=True
        ),
    )
    assert openai_style.sampling_params.max_new_tokens == MAX_REQUEST_TOKENS - 10
    (native,) = build(
        tm, GenerateRequest(prompts=[ids], sampling_params=[{"max_new_tokens": None}])
    )
    assert native.sampling_params.max_new_tokens == SamplingParams().max_new_tokens


@pytest.mark.parametrize(
    ("names", "param"),
    [({}, "max_new_tokens"), (OPENAI_PARAM_NAMES, "max_tokens")],
)
def test_sampling_errors_are_named_as_the_request_spells_them(tm, names, param):
    request = GenerateRequest(
        prompts=["x"], sampling_params=[{"max_new_tokens": -1}], sampling_param_names=names
    )
    with pytest.raises(InvalidParameterError) as info:
        build(tm, request)
    assert info.value.param == param


def test_the_native_shape_names_its_own_fields(tm):
    request, batched = GenerateRequest.native(None, [[1, 2], [3]], {"temperature": -1})
    assert batched
    with pytest.raises(InvalidParameterError) as info:
        build(tm, request)
    assert info.value.param == "sampling_params.temperature"
    bad_ids, _ = GenerateRequest.native(None, [1, 10**9], None)
    with pytest.raises(InvalidParameterError) as info:
        build(tm, bad_ids)
    assert info.value.param == "input_ids"
    with pytest.raises(InvalidParameterError) as info:
        GenerateRequest.native("a", [1], None)
    assert info.value.param == "text"


def test_a_prompt_longer_than_the_context_is_a_400_naming_the_prompt_field(tm):
    request = GenerateRequest(
        prompts=[[5] * MAX_REQUEST_TOKENS], sampling_params=[{}], prompt_param="messages"
    )
    with pytest.raises(PromptTooLongError) as info:
        build(tm, request)
    assert (info.value.param, info.value.code) == ("messages", "context_length_exceeded")


def test_a_request_id_in_flight_is_refused_and_nothing_leaks(tm):
    params = SamplingParams(max_new_tokens=1)
    tm._register(request([1], params, rid="busy"))  # in flight
    batch = [request([1], params, rid="fresh"), request([1], params, rid="busy")]

    async def start(requests):
        stream = tm.generate_many(requests)
        with pytest.raises(APIError) as info:
            await anext(stream)
        return info.value

    error = asyncio.run(start(batch))
    assert (error.status, error.code) == (409, "duplicate_request_id")
    assert set(tm._states) == {"busy"}  # "fresh" was not left registered
    twins = [request([1], params, rid="twin"), request([1], params, rid="twin")]
    assert asyncio.run(start(twins)).status == 409


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_stop_token_never_reaches_the_text(tm, smollm2_tokenizer, skip_special_tokens):
    eos = smollm2_tokenizer.eos_token_id
    hello = asyncio.run(tm.encode("Hello there", add_special_tokens=False))
    params = SamplingParams(skip_special_tokens=skip_special_tokens)
    for return_logprob in (False, True):
        state = tm._register(request([1, 2], params, return_logprob=return_logprob))
        output = ReqOutput(
            rid=state.input.rid,
            new_token_ids=[*hello, eos],
            finished_reason={"type": "stop", "matched": eos},
            prompt_tokens=2,
            completion_tokens=len(hello) + 1,
            cached_tokens=0,
        )
        chunk = tm._process_output(state, output)
        assert chunk.text == "Hello there"
        assert chunk.token_ids[-1] == eos  # the ids still report it
        tm._states.clear()


def test_a_prompt_that_can_never_fit_is_refused_without_tokenizing(tm, monkeypatch):
    """60 MB of text takes minutes of a core to tokenize; a prompt longer than the context can
    hold whatever it tokenizes to is refused before the tokenizer sees it."""
    monkeypatch.setattr(tm.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    huge = "a" * (tm.max_prompt_chars + 1)
    with pytest.raises(PromptTooLongError) as info:
        build(tm, GenerateRequest(prompts=[huge], sampling_params=[{}]))
    assert info.value.param == "prompt"


def test_a_long_prompt_is_tokenized_off_the_event_loop(tm, monkeypatch):
    threads = []
    encode = tm.tokenizer.encode

    def recording_encode(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return encode(*args, **kwargs)

    monkeypatch.setattr(tm.tokenizer, "encode", recording_encode)
    short = "Hello there"
    long = "Hello there. " * (INLINE_TOKENIZE_CHARS // 13 + 1)
    assert len(long) > INLINE_TOKENIZE_CHARS
    request = GenerateRequest(prompts=[short, [1, 2]], sampling_params=[{}] * 2)
    build(tm, request)
    assert threads == [threading.main_thread().name]  # short: inline, no thread hop
    threads.clear()
    with pytest.raises(PromptTooLongError):  # tokenized (off the loop), then too long
        build(tm, GenerateRequest(prompts=[long], sampling_params=[{}]))
    assert len(threads) == 1 and threads[0].startswith("radixserve-tokenize")


def test_a_lone_surrogate_from_an_in_process_caller_is_a_400(tm):
    """HTTP bodies are checked as they are decoded; the Engine's callers pass strings as is."""
    with pytest.raises(InvalidParameterError) as info:
        build(tm, GenerateRequest(prompts=["ok \ud800"], sampling_params=[{}]))
    assert info.value.param == "prompt" and "surrogate" in info.value.message
