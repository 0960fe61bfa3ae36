"""Folding a streamed answer gives what the same call answers without `stream` (every API), and the counts
of a trajectory are what its calls and the environment's output say."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from relax_gym_core.policies import formats
from relax_gym_core.policies.replies import ModelReply, ToolCall
from relax_gym_core.trajectories import counts, fold_stream

names = st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8)
tool_calls = st.builds(
    ToolCall,
    name=names,
    arguments=st.dictionaries(names, st.integers() | names, max_size=3),
    id=names.map(lambda n: f"call_{n}"),
)
replies = st.builds(
    ModelReply,
    text=st.none() | st.text(max_size=40),
    tool_calls=st.lists(tool_calls, max_size=3).map(tuple),
    input_tokens=st.integers(0, 10_000),
    output_tokens=st.integers(0, 10_000),
)


@given(replies)
def test_a_folded_chat_stream_is_the_plain_completion(reply: ModelReply) -> None:
    plain = formats.chat_completion(reply, model="m")
    folded = fold_stream("chat/completions", formats.chat_completion_sse(reply, model="m").decode())
    want, got = plain["choices"][0], folded["choices"][0]
    assert got["finish_reason"] == want["finish_reason"]
    assert (got["message"].get("content") or None) == (want["message"].get("content") or None)
    assert [c["function"] for c in got["message"].get("tool_calls", [])] == [
        c["function"] for c in want["message"].get("tool_calls") or []
    ]
    assert folded["usage"] == plain["usage"]


@given(replies)
def test_a_folded_responses_stream_is_the_plain_response(reply: ModelReply) -> None:
    plain = formats.responses_object(reply, model="m")
    folded = fold_stream("responses", formats.responses_sse(reply, model="m").decode())
    assert without_ids(folded["output"]) == without_ids(plain["output"])  # ids are minted per rendering
    assert folded["usage"] == plain["usage"]


def without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: without_ids(item) for key, item in value.items() if key != "id"}
    if isinstance(value, list):
        return [without_ids(item) for item in value]
    return value


@given(replies)
def test_a_folded_messages_stream_is_the_plain_message(reply: ModelReply) -> None:
    plain = formats.anthropic_message(reply, model="m")
    folded = fold_stream("messages", formats.anthropic_sse(reply, model="m").decode())
    assert folded["content"] == plain["content"]
    assert folded["stop_reason"] == plain["stop_reason"]
    assert folded["usage"]["output_tokens"] == plain["usage"]["output_tokens"]


def sse(*events: dict[str, Any], named: bool = False) -> str:
    blocks = [(f"event: {e['type']}\n" if named else "") + f"data: {json.dumps(e)}\n\n" for e in events]
    return ": keep-alive\n\n" + "".join(blocks) + ("" if named else "data: [DONE]\n\n")


def test_chat_deltas_split_across_chunks_are_joined() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get", "arguments": '{"a"'}}
    text = sse(
        chunk({"role": "assistant", "content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({"tool_calls": [call]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({}, "tool_calls"),
        {"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}},
    )
    folded = fold_stream("chat/completions", text)
    message = folded["choices"][0]["message"]
    assert message["content"] == "Hello"
    assert message["tool_calls"] == [
        {"type": "function", "id": "call_1", "function": {"name": "get", "arguments": '{"a": 1}'}}
    ]
    assert folded["choices"][0]["finish_reason"] == "tool_calls"
    assert folded["usage"] == {"prompt_tokens": 5, "completion_tokens": 3}


def test_messages_tool_input_in_pieces_is_parsed_once_whole() -> None:
    def delta(index: int, **fields: str) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": fields}

    def start(index: int, **block: str) -> dict[str, Any]:
        return {"type": "content_block_start", "index": index, "content_block": block}

    text = sse(
        {"type": "message_start", "message": {"id": "m1", "role": "assistant", "usage": {"input_tokens": 9}}},
        start(0, type="text", text=""),
        delta(0, type="text_delta", text="Let me "),
        delta(0, type="text_delta", text="look."),
        start(1, type="tool_use", id="t", name="ls"),
        delta(1, type="input_json_delta", partial_json='{"pa'),
        delta(1, type="input_json_delta", partial_json='th": "/"}'),
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 4}},
        {"type": "message_stop"},
        named=True,
    )
    folded = fold_stream("messages", text)
    assert folded["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "t", "name": "ls", "input": {"path": "/"}},
    ]
    assert (folded["stop_reason"], folded["usage"]) == ("tool_use", {"input_tokens": 9, "output_tokens": 4})


def test_counts_take_turns_and_tokens_from_the_calls_and_tools_from_the_environment() -> None:
    reply = ModelReply(text=None, tool_calls=(ToolCall(name="get"),), input_tokens=10, output_tokens=2)
    last = ModelReply(text="done", input_tokens=20, output_tokens=3)
    document = {
        "model_calls": [
            {"status": 200, "request": {"input": []}, "response": formats.responses_object(reply, model="m")},
            {"status": 502, "request": {"input": []}},  # failed: no turn, no tokens
            {
                "status": 200,
                "request": {"input": [{"type": "function_call_output", "output": "x"}]},
                "response": formats.responses_object(last, model="m"),
            },
        ],
        "run": {
            "answer": {
                "response": {
                    "output": [
                        {"type": "function_call", "name": "get"},
                        {"type": "function_call_output", "output": "x"},
                        {"type": "function_call", "name": "get"},
                        {"type": "function_call_output", "output": "y"},
                    ]
                }
            }
        },
    }
    assert counts(document) == {
        "model_calls": 3,
        "answered_calls": 2,
        "tool_calls": 2,
        "tool_outputs": 2,  # the environment's record includes the tool run after the last model call
        "input_tokens": 30,
        "output_tokens": 5,
        "model_stop_reason": "completed",
    }
