"""Reading a stored trajectory: streamed answers folded into one, and the counts people ask about.

The bridge keeps a streamed answer as the SSE text it passed on (folding costs CPU on the hot path);
it is folded here, off it, into the object the same call would have answered without `stream`:
a Chat completion, a Responses response, or a Messages message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any


def sse_events(text: str) -> Iterator[Any]:
    """The JSON data of each SSE event (comments, pings without data and `[DONE]` left out)."""
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        try:
            yield json.loads(data)
        except ValueError:
            continue  # a keep-alive or a torn event: nothing to fold


def fold_stream(resource: str, text: str) -> dict[str, Any]:
    """One answer from the SSE text of a streamed call of `resource`."""
    events = [event for event in sse_events(text) if isinstance(event, dict)]
    if resource == "responses":
        return _fold_responses(events)
    if resource == "messages":
        return _fold_messages(events)
    return _fold_chat(events)


def _fold_responses(events: list[dict[str, Any]]) -> dict[str, Any]:
    ends = ("response.completed", "response.incomplete", "response.failed")
    for event in reversed(events):
        response = event.get("response")
        if event.get("type") in ends and isinstance(response, dict):
            return response
    items = [event["item"] for event in events if event.get("type") == "response.output_item.done"]
    return {"object": "response", "output": items}


def _fold_chat(events: list[dict[str, Any]]) -> dict[str, Any]:
    folded: dict[str, Any] = {"object": "chat.completion", "choices": []}
    choices: dict[int, dict[str, Any]] = {}
    for event in events:
        for key in ("id", "model", "created", "usage"):
            if event.get(key) is not None:
                folded[key] = event[key]
        for choice in event.get("choices") or ():
            index = choice.get("index", 0)
            into = choices.setdefault(index, {"index": index, "message": {"role": "assistant"}})
            delta = choice.get("delta") or {}
            message = into["message"]
            if isinstance(delta.get("content"), str):
                message["content"] = message.get("content", "") + delta["content"]
            for call in delta.get("tool_calls") or ():
                calls = message.setdefault("tool_calls", [])
                while len(calls) <= call.get("index", 0):
                    calls.append({"type": "function", "function": {"name": "", "arguments": ""}})
                into_call = calls[call.get("index", 0)]
                if call.get("id"):
                    into_call["id"] = call["id"]
                function = call.get("function") or {}
                into_call["function"]["name"] += function.get("name") or ""
                into_call["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]
    folded["choices"] = [choices[index] for index in sorted(choices)]
    return folded


def _fold_messages(events: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
    partial: dict[int, str] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = {**event["message"], "content": []}
        elif kind == "content_block_start":
            blocks: list[Any] = message["content"]
            while len(blocks) <= event.get("index", 0):
                blocks.append({})
            blocks[event.get("index", 0)] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            _add_delta(message["content"], partial, event.get("index", 0), event.get("delta") or {})
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
            if isinstance(event.get("usage"), dict):
                message["usage"] = {**(message.get("usage") or {}), **event["usage"]}
    for index, text in partial.items():
        try:
            message["content"][index]["input"] = json.loads(text) if text else {}
        except ValueError:
            message["content"][index]["input"] = text
    return message


def _add_delta(blocks: list[Any], partial: dict[int, str], index: int, delta: Mapping[str, Any]) -> None:
    if index >= len(blocks):
        return
    for field in ("text", "thinking"):
        if isinstance(delta.get(field), str):
            blocks[index][field] = blocks[index].get(field, "") + delta[field]
    if isinstance(delta.get("partial_json"), str):
        partial[index] = partial.get(index, "") + delta["partial_json"]


# ---- counts ---------------------------------------------------------------------------------------


def usage_of(answer: Any) -> dict[str, int]:
    """input_tokens / output_tokens of one model answer, whichever API's names it uses."""
    usage = answer.get("usage") if isinstance(answer, Mapping) else None
    if not isinstance(usage, Mapping):
        return {}
    found = {
        "input_tokens": usage.get("input_tokens", usage.get("prompt_tokens")),
        "output_tokens": usage.get("output_tokens", usage.get("completion_tokens")),
    }
    return {key: value for key, value in found.items() if isinstance(value, int)}


def _of_type(items: Any, kind: str) -> int:
    if not isinstance(items, list):
        return 0
    return sum(isinstance(item, Mapping) and item.get("type") == kind for item in items)


def _tool_calls_in(answer: Any) -> int:
    """Tool calls in one model answer (or the environment's output items), whichever API."""
    if not isinstance(answer, Mapping):
        return 0
    calls = _of_type(answer.get("output"), "function_call") + _of_type(answer.get("content"), "tool_use")
    choices = answer.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        message = choice.get("message") if isinstance(choice, Mapping) else None
        tool_calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        calls += len(tool_calls) if isinstance(tool_calls, list) else 0
    return calls


def _tool_outputs_in(request: Any) -> int:
    """Tool results a model request carries (the conversation so far, whichever API)."""
    if not isinstance(request, Mapping):
        return 0
    count = _of_type(request.get("input"), "function_call_output")
    messages = request.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, Mapping):
            count += (message.get("role") == "tool") + _of_type(message.get("content"), "tool_result")
    return count


def counts(document: Mapping[str, Any]) -> dict[str, Any]:
    """What a trajectory amounts to: model calls (answered or not), answered calls, tool calls and outputs,
    tokens summed over what the model reported, and the last answer's stop reason."""
    calls = [c for c in document.get("model_calls") or () if isinstance(c, Mapping)]
    answered = [c for c in calls if isinstance(c.get("status"), int) and c["status"] < 400]
    answers = [c.get("response") for c in answered]
    totals = {"input_tokens": 0, "output_tokens": 0}
    for answer in answers:
        for key, value in usage_of(answer).items():
            totals[key] += value
    tool_calls = sum(_tool_calls_in(answer) for answer in answers)
    tool_outputs = _tool_outputs_in(calls[-1].get("request")) if calls else 0
    run_answer = (document.get("run") or {}).get("answer")
    final = run_answer.get("response") if isinstance(run_answer, Mapping) else None
    if isinstance(final, Mapping) and isinstance(final.get("output"), list):
        # The environment's own record of the episode: it includes what came after the last model call.
        tool_calls = max(tool_calls, _tool_calls_in(final))
        tool_outputs = _of_type(final["output"], "function_call_output")
    return {
        "model_calls": len(calls),
        "answered_calls": len(answered),
        "tool_calls": tool_calls,
        "tool_outputs": tool_outputs,
        **totals,
        "model_stop_reason": _stop_reason(answers[-1]) if answers else None,
    }


def _stop_reason(answer: Any) -> str | None:
    if not isinstance(answer, Mapping):
        return None
    if isinstance(answer.get("stop_reason"), str):
        return str(answer["stop_reason"])
    for choice in answer.get("choices") or ():
        if isinstance(choice.get("finish_reason"), str):
            return str(choice["finish_reason"])
    details = answer.get("incomplete_details")
    if isinstance(details, Mapping) and isinstance(details.get("reason"), str):
        return str(details["reason"])
    return str(answer["status"]) if isinstance(answer.get("status"), str) else None
