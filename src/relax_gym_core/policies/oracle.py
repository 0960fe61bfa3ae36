"""An oracle policy: answers each trial with the known-good output of its row's verifier probe.

Built from plugin data (probes), not from tests, so `make demo` can run real environments end to end on a
machine without any language model. Rows are recognised by their last user message; the step is the number
of tool results already in the conversation (the trajectory is replayed one tool call per model turn).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from relax_gym_core.plugin import VerifierProbe
from relax_gym_core.policies.replies import (
    RecordedRequest,
    ScriptedReply,
    ToolCall,
    reply_text,
    reply_tool_calls,
)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def last_user_text(items: Any) -> str | None:
    """The text of the last user message of a Responses input, Chat messages or Messages list."""
    if not isinstance(items, list):
        return None
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user":
            text = _text(item.get("content"))
            if text and not any(
                isinstance(p, dict) and p.get("type") == "tool_result" for p in item.get("content") or []
            ):
                return text
    return None


def tool_results(body: Mapping[str, Any]) -> int:
    """How many tool results the conversation holds (Responses, Chat or Messages)."""
    items = body.get("input") if "input" in body else body.get("messages")
    count = 0
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output" or item.get("role") == "tool":
            count += 1
        elif isinstance(item.get("content"), list):
            count += sum(1 for p in item["content"] if isinstance(p, dict) and p.get("type") == "tool_result")
    return count


class OracleScript:
    """A ScriptedPolicy script replaying, for each known row, the probe output that earns `reward`."""

    def __init__(self, probes: Iterable[VerifierProbe], *, reward: float = 1.0) -> None:
        self._plans: dict[str, tuple[list[ToolCall], str]] = {}
        for probe in probes:
            if probe.expected_reward != reward:
                continue
            params = probe.row.get("responses_create_params")
            key = last_user_text(params.get("input") if isinstance(params, Mapping) else None)
            if key is None or key in self._plans:
                continue
            calls = [
                ToolCall(str(item["name"]), str(item.get("arguments", "{}")))
                for item in probe.output
                if item.get("type") == "function_call"
            ]
            texts = [_text(item.get("content")) for item in probe.output if item.get("type") == "message"]
            self._plans[key] = (calls, texts[-1] if texts else "Done.")

    def __len__(self) -> int:
        return len(self._plans)

    def _plan(self, text: str) -> tuple[list[ToolCall], str] | None:
        plan = self._plans.get(text)
        if plan is None:
            # An agent harness may add its own blocks around the row's prompt (the Claude Code CLI sends
            # reminders beside it in the same user message): the prompt is still there, whole.
            plan = next((p for key, p in self._plans.items() if key and key in text), None)
        return plan

    def __call__(self, request: RecordedRequest) -> ScriptedReply:
        body = request.body if isinstance(request.body, dict) else {}
        key = last_user_text(body.get("input") if "input" in body else body.get("messages"))
        plan = self._plan(key or "")
        if plan is None:
            return reply_text("I do not know this task.")
        calls, final = plan
        step = tool_results(body)
        return reply_tool_calls(calls[step]) if step < len(calls) else reply_text(final)
