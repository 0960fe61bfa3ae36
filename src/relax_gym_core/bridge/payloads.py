"""Model-call bodies on their way up (alias, sampling overrides, rollout tag removed) and back down
(Responses repairs that make Relax's answers validate against NeMo Gym's pydantic models)."""

from __future__ import annotations

from typing import Any

# Where an un-prefixed model call carries its trial's rollout id (relax_gym_core.protocol.bridge says
# why). The tag never goes upstream.
from relax_gym_core.protocol import ROLLOUT_TAG, tag_of

__all__ = ["ROLLOUT_TAG", "repair_responses", "rollout_id_from_body", "upstream_body"]


def rollout_id_from_body(body: dict[str, Any]) -> str | None:
    return tag_of(body)


def upstream_body(body: dict[str, Any], *, model: str, sampling_params: dict[str, Any]) -> dict[str, Any]:
    """A new dict: the agent's body minus our tag, sampling overrides laid on top, model alias forced."""
    forwarded = dict(body)
    metadata = forwarded.get("metadata")
    if isinstance(metadata, dict) and ROLLOUT_TAG in metadata:
        rest = {k: v for k, v in metadata.items() if k != ROLLOUT_TAG}
        if rest:
            forwarded["metadata"] = rest
        else:
            del forwarded["metadata"]
    forwarded.update(sampling_params)
    forwarded["model"] = model
    return forwarded


def repair_responses(payload: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Fill what NeMo Gym's Response model requires but Relax may omit (never overwrite what is there)."""
    output = payload.get("output")
    if isinstance(output, list):
        for item in output:
            if not isinstance(item, dict) or item.get("type") != "reasoning":
                continue
            content = item.get("content")
            if isinstance(content, list) and content and not item.get("summary"):
                item["summary"] = [
                    {"type": "summary_text", "text": part.get("text", "")}
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "reasoning_text"
                ]
    payload.setdefault("parallel_tool_calls", request.get("parallel_tool_calls", True))
    payload.setdefault("tool_choice", request.get("tool_choice", "auto"))
    payload.setdefault("tools", request.get("tools", []))
    usage = payload.get("usage")
    if isinstance(usage, dict):
        usage.setdefault("input_tokens_details", {"cached_tokens": 0})
        usage.setdefault("output_tokens_details", {"reasoning_tokens": 0})
    return payload
