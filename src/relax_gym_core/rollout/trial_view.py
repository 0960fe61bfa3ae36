"""The report's trial pages: one trial's conversation the way people read one — who said what, each tool
call with its arguments, each tool output, the final answer — with its reward, metrics, failure, timings
and model calls; with two runs, the same (row, repeat) of each side by side.

The conversation is the environment's own record when its answer has one (NeMo Gym's `response.output`,
after the prompt of its `/run` body), else the last model call's request and answer (the whole
conversation so far, in whichever API the agent spoke).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from attrs import frozen

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:80em;color:#222}
.runs{display:grid;grid-template-columns:repeat(auto-fit,minmax(28em,1fr));gap:1.5em}
.turn{border-left:4px solid #ccc;margin:0.6em 0;padding:0.3em 0.8em;background:#fafafa}
.turn .who{font-size:80%;font-weight:600;text-transform:uppercase;color:#555}
.system{border-color:#999}.user{border-color:#1f6feb}.assistant{border-color:#087a1f}
.tool_call{border-color:#b26b00;background:#fff8ec}.tool_output{border-color:#8250df;background:#f7f2ff}
.reasoning{border-color:#bbb;color:#666;font-style:italic}
pre{white-space:pre-wrap;word-break:break-word;margin:0.2em 0;font-size:90%}
table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}
.failed{color:#b00020;font-weight:600}
"""


@frozen
class Turn:
    kind: str  # system | user | assistant | tool_call | tool_output | reasoning
    label: str
    text: str


def _text(content: Any) -> str:
    """The readable text of a message's content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                text = part.get("text") or part.get("content") or part.get("output")
                parts.append(_text(text) if text is not None else "")
            else:
                parts.append(str(part))
        return "\n".join(p for p in parts if p)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _arguments(value: Any) -> str:
    """Tool-call arguments, indented (a JSON string is parsed first; one that is not JSON is shown as is)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    return json.dumps(value, ensure_ascii=False, indent=1)


def _role(role: Any) -> str:
    return role if role in ("system", "user", "assistant") else "user" if role == "developer" else "system"


def _items(items: Sequence[Any]) -> Iterator[Turn]:
    """Turns of a list in any of the three APIs' shapes (Responses items, Chat or Messages messages)."""
    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "function_call":
            yield Turn("tool_call", f"tool call: {item.get('name')}", _arguments(item.get("arguments")))
        elif kind == "function_call_output":
            yield Turn("tool_output", "tool output", _text(item.get("output")))
        elif kind == "reasoning":
            yield Turn("reasoning", "reasoning", _text(item.get("summary") or item.get("content")))
        elif item.get("role") == "tool":
            yield Turn("tool_output", "tool output", _text(item.get("content")))
        elif "role" in item:
            yield from _message(item)


def _message(item: Mapping[str, Any]) -> Iterator[Turn]:
    role = _role(item.get("role"))
    content = item.get("content")
    blocks = content if isinstance(content, list) else [content]
    text = []
    for block in blocks:
        if isinstance(block, Mapping) and block.get("type") == "tool_use":
            yield Turn("tool_call", f"tool call: {block.get('name')}", _arguments(block.get("input")))
        elif isinstance(block, Mapping) and block.get("type") == "tool_result":
            yield Turn("tool_output", "tool output", _text(block.get("content")))
        elif isinstance(block, Mapping) and block.get("type") == "thinking":
            yield Turn("reasoning", "reasoning", str(block.get("thinking", "")))
        else:
            text.append(_text([block]) if isinstance(block, Mapping) else _text(block))
    if any(text):
        yield Turn(role, role, "\n".join(t for t in text if t))
    for call in item.get("tool_calls") or ():
        function = call.get("function") or {} if isinstance(call, Mapping) else {}
        yield Turn("tool_call", f"tool call: {function.get('name')}", _arguments(function.get("arguments")))


def _answer_turns(answer: Any) -> Iterator[Turn]:
    """The turns of one model answer (Chat completion, Responses response, Messages message)."""
    if not isinstance(answer, Mapping):
        return
    if isinstance(answer.get("output"), list):
        yield from _items(answer["output"])
    for choice in answer.get("choices") or ():
        if isinstance(choice, Mapping) and isinstance(choice.get("message"), Mapping):
            yield from _message(choice["message"])
    if answer.get("type") == "message":
        yield from _message(answer)


def conversation(document: Mapping[str, Any]) -> list[Turn]:
    """The trial's conversation, in order (see the module docstring for where it comes from)."""
    run = document.get("run") or {}
    request, answer = run.get("request"), run.get("answer")
    final = answer.get("response") if isinstance(answer, Mapping) else None
    if isinstance(final, Mapping) and isinstance(final.get("output"), list):
        params = request.get("responses_create_params") if isinstance(request, Mapping) else None
        prompt = params.get("input") if isinstance(params, Mapping) else None
        opening = list(_items(prompt)) if isinstance(prompt, list) else []
        if isinstance(prompt, str):
            opening.append(Turn("user", "user", prompt))
        return opening + list(_items(final["output"]))
    calls = [call for call in document.get("model_calls") or () if isinstance(call, Mapping)]
    if not calls:
        return []
    last = calls[-1]
    request_body = last.get("request")
    sent: Mapping[str, Any] = request_body if isinstance(request_body, Mapping) else {}
    turns: list[Turn] = []
    if isinstance(sent.get("system"), str):
        turns.append(Turn("system", "system", sent["system"]))
    for key in ("messages", "input"):
        if isinstance(sent.get(key), list):
            turns += _items(sent[key])
    return turns + list(_answer_turns(last.get("response")))


def _pre(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def _facts(record: Mapping[str, Any]) -> str:
    timings = record.get("timings") or {}
    rows = [
        ("status", record.get("status")),
        ("reward", record.get("reward")),
        ("failure", " ".join(str(x) for x in (record.get("failure_kind"), record.get("error")) if x) or None),
        ("stop reason", record.get("stop_reason")),
        ("time (s)", timings.get("total_s")),
        ("model calls", record.get("model_calls")),
        ("tool calls / outputs", f"{record.get('tool_calls')} / {record.get('tool_outputs')}"),
        ("tokens in / out", f"{record.get('input_tokens')} / {record.get('output_tokens')}"),
        ("cleanup", record.get("cleanup")),
        ("metrics", json.dumps(record.get("metrics") or {}, ensure_ascii=False)),
    ]
    cells = "".join(
        f"<tr><th>{html.escape(name)}</th><td{' class=failed' if name == 'failure' and value else ''}>"
        f"{html.escape('' if value is None else str(value))}</td></tr>"
        for name, value in rows
    )
    return f"<table>{cells}</table>"


def _calls(document: Mapping[str, Any]) -> str:
    rows = []
    for index, call in enumerate(document.get("model_calls") or (), 1):
        usage = call.get("usage") or {}
        cells = [index, call.get("resource"), call.get("status"), call.get("seconds"), call.get("attempts")]
        cells += [usage.get("input_tokens"), usage.get("output_tokens"), call.get("error")]
        rows.append(
            "<tr>" + "".join(f"<td>{html.escape(str(c) if c is not None else '')}</td>" for c in cells)
        )
    head = "".join(
        f"<th>{h}</th>" for h in ("#", "resource", "status", "s", "attempts", "in", "out", "error")
    )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>" if rows else "<p>No model call.</p>"


def _side(label: str, record: Mapping[str, Any] | None, document: Mapping[str, Any] | None) -> str:
    parts = [f"<div><h2>{html.escape(label)}</h2>"]
    if record is None:
        return parts[0] + "<p>No such trial in this run.</p></div>"
    parts.append(_facts(record))
    if document is None:
        parts.append("<p>The gateway kept no trajectory of this trial.</p></div>")
        return "".join(parts)
    if document.get("truncated_bytes"):
        parts.append(f"<p>{document['truncated_bytes']:,} bytes past the trajectory cap were not kept.</p>")
    for turn in conversation(document):
        who = f"<div class=who>{html.escape(turn.label)}</div>"
        parts.append(f"<div class='turn {turn.kind}'>{who}{_pre(turn.text)}</div>")
    parts.append("<h3>Model calls</h3>" + _calls(document) + "</div>")
    return "".join(parts)


def trial_page(
    title: str, sides: Sequence[tuple[str, Mapping[str, Any] | None, Mapping[str, Any] | None]], *, back: str
) -> str:
    """One trial (or the same row and repeat of two runs), as a self-contained page; `back` links the
    report."""
    body = "".join(_side(label, record, document) for label, record, document in sides)
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><p><a href='{html.escape(back)}'>&larr; report</a></p>"
        f"<h1>{html.escape(title)}</h1><div class=runs>{body}</div></body></html>\n"
    )
