"""The three wire formats the scripted policy answers in (Chat Completions, Responses, Anthropic Messages),
as JSON and as Relax's buffered SSE. Builders read a ModelReply; they are public for other fakes too."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relax_gym_core.policies.replies import ModelReply

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _hex(n: int) -> str:
    return secrets.token_hex(n)


def _chat_message(reply: ModelReply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.call_id(i),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_text()},
            }
            for i, call in enumerate(reply.tool_calls)
        ]
    return message


def _chat_usage(reply: ModelReply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def chat_completion(reply: ModelReply, *, model: str) -> dict[str, Any]:
    """A `chat.completion` object as Relax returns it."""
    return {
        "id": f"chatcmpl_{_hex(16)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": _chat_message(reply), "logprobs": None, "finish_reason": reply.finish}
        ],
        "usage": _chat_usage(reply),
    }


def chat_completion_sse(reply: ModelReply, *, model: str) -> bytes:
    """Buffered SSE: one `chat.completion.chunk` (whole delta, finish reason, usage), then [DONE]."""
    delta = _chat_message(reply)
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    chunk = {
        "id": f"chatcmpl_{_hex(16)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reply.finish}],
        "usage": _chat_usage(reply),
    }
    return f"data: {_dumps(chunk)}\n\ndata: [DONE]\n\n".encode()


def _responses_items(reply: ModelReply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        # Relax puts the text in `content`; the summary is left for the bridge to rebuild.
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{_hex(12)}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reply.reasoning}],
                "status": "completed",
            }
        )
    if reply.text is not None:
        items.append(
            {
                "type": "message",
                "id": f"msg_{_hex(12)}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for i, call in enumerate(reply.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{_hex(12)}",
                "call_id": call.call_id(i),
                "name": call.name,
                "arguments": call.arguments_text(),
                "status": "completed",
            }
        )
    return items


def responses_object(reply: ModelReply, *, model: str) -> dict[str, Any]:
    """An `object: response` as Relax returns it: no tools/tool_choice/parallel_tool_calls, bare usage."""
    incomplete = reply.finish == "length"
    return {
        "id": f"resp_{_hex(16)}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "output": _responses_items(reply),
        "usage": {
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        },
    }


def _sse_event(name: str, data: Mapping[str, Any]) -> str:
    return f"event: {name}\ndata: {_dumps(data)}\n\n"


def responses_sse(reply: ModelReply, *, model: str) -> bytes:
    """Buffered SSE: response.created, per item added (+ text / argument events) and done, completed."""
    final = responses_object(reply, model=model)
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": {**final, "status": "in_progress", "output": [], "usage": None}})
    ]
    for index, item in enumerate(final["output"]):
        kind = item["type"]
        if kind == "message":
            added = {**item, "status": "in_progress", "content": []}
            events.append(("response.output_item.added", {"output_index": index, "item": added}))
            for part_index, part in enumerate(item["content"]):
                where = {"item_id": item["id"], "output_index": index, "content_index": part_index}
                empty = {**part, "text": ""}
                events.append(("response.content_part.added", {**where, "part": empty}))
                events.append(
                    ("response.output_text.delta", {**where, "delta": part["text"], "logprobs": []})
                )
                events.append(("response.output_text.done", {**where, "text": part["text"], "logprobs": []}))
                events.append(("response.content_part.done", {**where, "part": part}))
        elif kind == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
            events.append(("response.output_item.added", {"output_index": index, "item": added}))
            where = {"item_id": item["id"], "output_index": index}
            events.append(("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}))
            events.append(
                (
                    "response.function_call_arguments.done",
                    {**where, "name": item["name"], "arguments": item["arguments"]},
                )
            )
        else:
            events.append(("response.output_item.added", {"output_index": index, "item": item}))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append((end, {"response": final}))
    return "".join(
        _sse_event(name, {"type": name, "sequence_number": n, **data})
        for n, (name, data) in enumerate(events)
    ).encode()


def _anthropic_blocks(reply: ModelReply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": _hex(16)})
    if reply.text is not None:
        blocks.append({"type": "text", "text": reply.text})
    blocks.extend(
        {"type": "tool_use", "id": call.call_id(i), "name": call.name, "input": call.arguments_object()}
        for i, call in enumerate(reply.tool_calls)
    )
    return blocks


def anthropic_message(reply: ModelReply, *, model: str) -> dict[str, Any]:
    """A Messages API `type: message` as Relax returns it."""
    return {
        "id": f"msg_{_hex(16)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _anthropic_blocks(reply),
        "stop_reason": _STOP_REASONS[reply.finish],
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def anthropic_sse(reply: ModelReply, *, model: str) -> bytes:
    """Buffered SSE: message_start, per block start / one delta / stop, message_delta, message_stop."""
    final = anthropic_message(reply, model=model)
    start = {
        **final,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": 0},
    }
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start})]
    for index, block in enumerate(final["content"]):
        deltas: list[dict[str, Any]]
        if block["type"] == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        elif block["type"] == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        else:
            empty = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": _dumps(block["input"])}]
        events.append(("content_block_start", {"index": index, "content_block": empty}))
        events.extend(("content_block_delta", {"index": index, "delta": delta}) for delta in deltas)
        events.append(("content_block_stop", {"index": index}))
    events.append(
        (
            "message_delta",
            {
                "delta": {"stop_reason": final["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": reply.output_tokens},
            },
        )
    )
    events.append(("message_stop", {}))
    return "".join(_sse_event(name, {"type": name, **data}) for name, data in events).encode()
