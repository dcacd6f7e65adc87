"""The routing key: a prompt as one string, prefix-preserving for text, chats and token ids."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from radixserve.router.routing import ids_key, routing_key


def key(path: str, payload: object) -> str:
    return routing_key(path, json.dumps(payload).encode())


def test_completion_prompts_text_batches_and_ids() -> None:
    assert key("/v1/completions", {"prompt": "Once upon"}) == "Once upon"
    assert key("/v1/completions", {"prompt": ["first", "second"]}) == "first"
    assert key("/v1/completions", {"prompt": [1, 2, 3]}) == ids_key([1, 2, 3])
    assert key("/v1/completions", {"prompt": [[5, 6], [7]]}) == ids_key([5, 6])
    assert key("/generate", {"text": "hi"}) == "hi"
    assert key("/generate", {"input_ids": [9, 8]}) == ids_key([9, 8])


def test_chat_messages_render_so_that_a_longer_conversation_extends_the_shorter() -> None:
    system = {"role": "system", "content": "Be brief."}
    turn = {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
    reply = {"role": "assistant", "content": "Hello."}
    short = key("/v1/chat/completions", {"messages": [system, turn]})
    long = key("/v1/chat/completions", {"messages": [system, turn, reply, turn]})
    assert long.startswith(short) and "Be brief." in short and "Hi" in short
    other = key("/v1/chat/completions", {"messages": [{"role": "user", "content": "Be brief."}]})
    assert not long.startswith(other)  # roles are part of the key


def test_what_the_router_cannot_read_gets_the_empty_key() -> None:
    assert routing_key("/v1/completions", b"{not json") == ""
    assert routing_key("/v1/completions", b"\xff\xfe") == ""
    assert key("/v1/completions", ["a list"]) == ""
    assert key("/v1/completions", {"prompt": 42}) == ""
    assert key("/v1/chat/completions", {"messages": "hello"}) == ""
    assert key("/v1/completions", {"prompt": [1, -2]}) == ""
    assert key("/v1/completions", {"prompt": [True, 2]}) == ""
    assert key("/v1/models", {}) == ""


@given(st.lists(st.integers(0, 300_000), max_size=20), st.lists(st.integers(0, 300_000)))
def test_ids_keys_are_one_char_per_id_prefix_preserving_and_injective(a, b) -> None:
    assert len(ids_key(a)) == len(a) + 1
    assert ids_key(a + b).startswith(ids_key(a))
    assert (ids_key(a) == ids_key(b)) == (a == b)
    assert all(not 0xD800 <= ord(c) < 0xE000 for c in ids_key(a))  # valid str, encodable
    ids_key(a).encode()


def test_anthropic_messages_render_system_then_turns_as_the_equivalent_chat() -> None:
    system = [{"type": "text", "text": "Be brief."}]
    turn = {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"q": 1}}],
    }
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "42"}],
    }
    short = key("/v1/messages", {"system": system, "messages": [turn]})
    long = key("/v1/messages", {"system": "Be brief.", "messages": [turn, call, result]})
    assert long.startswith(short) and "lookup#tu_1" in long and "42" in long
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert short == key("/v1/chat/completions", {"messages": chat})
    assert key("/v1/messages", {"messages": [turn]}) == "<user>Hi\n"  # no system: no turn
    assert key("/v1/messages", {"system": "x", "messages": "hi"}) == ""
    # counting tokens fills no cache: it must not claim a worker's tree
    assert key("/v1/messages/count_tokens", {"messages": [turn]}) == ""


def test_responses_render_instructions_then_input_as_the_equivalent_chat() -> None:
    one = key("/v1/responses", {"instructions": "Be brief.", "input": "Hi"})
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert one == key("/v1/chat/completions", {"messages": chat})
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Yo"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    many = key("/v1/responses", {"instructions": "Be brief.", "input": items})
    assert many.startswith(one) and '<assistant>f({"a":1})' in many and "<tool>done" in many
    assert key("/v1/responses", {"input": "Hi"}) == "<user>Hi\n"
    assert key("/v1/responses", {"input": 3}) == ""
    assert key("/v1/responses", {"input": [1]}) == ""
    assert key("/v1/responses/resp_1", {}) == ""


def test_pooling_requests_route_by_their_input_or_query() -> None:
    assert key("/v1/embeddings", {"input": ["a b", "c"]}) == "a b"
    assert key("/v1/embeddings", {"input": [[5, 6]]}) == key("/v1/completions", {"prompt": [5, 6]})
    # every rerank of one query goes where the query's prefix is cached
    assert key("/v1/rerank", {"query": "q?", "documents": ["x", "y"]}) == "q?"
    assert key("/v1/score", {"text_1": "q?", "text_2": ["x"]}) == "q?"
    assert key("/v1/rerank", {"query": 3}) == ""
