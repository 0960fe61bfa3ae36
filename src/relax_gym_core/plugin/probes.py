"""Verifier probes: real rows, the outputs an agent could give for them, and the reward the real verifier
must give each; with builders for the Responses output items agents produce.

Probes are data: `relax-gym probe` scores them with the environment's real resources server, the conformance
kit checks them, and the oracle policy of `relax-gym rollout --policy oracle` plays them back.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

type OutputItem = Mapping[str, Any]


@frozen(kw_only=True)
class VerifierProbe:
    """A known output for a row and the reward the real verifier must give it.

    `row` is a raw NeMo Gym row; `output` is the list of Responses output items an agent would produce
    (function calls and messages). Probes are data, so they also drive oracle policies and reports.

    A `replay` probe is a recorded trajectory (NeMo Gym's example_rollouts.jsonl): its model turns (the
    output split at tool outputs and observations, which come live from the servers) are replayed
    through the environment's real agent loop, and the agent's /run must answer `expected_reward`.
    A probe with a `skip` reason (a row recorded on a task not shipped, an unseeded game...) is reported
    as skipped with it, never scored and never counted as passing.
    """

    name: str
    row: Mapping[str, Any]
    output: tuple[OutputItem, ...]
    expected_reward: float
    replay: bool = False
    skip: str | None = None


def message(text: str, tag: str = "0") -> dict[str, Any]:
    """The assistant's message item saying `text` (`tag` makes its id unique within an output)."""
    return {
        "type": "message",
        "id": f"msg_{tag}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def answer(text: str, tag: str = "0") -> tuple[OutputItem, ...]:
    """The output of an agent whose one final message is `text` (a one-generation environment's)."""
    return (message(text, tag),)


def function_call(name: str, arguments: Mapping[str, Any] | str, tag: str) -> dict[str, Any]:
    """A tool call item; `arguments` as the JSON string models send (a mapping is encoded)."""
    encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "type": "function_call",
        "id": f"fc_{tag}",
        "call_id": f"call_{tag}",
        "name": name,
        "arguments": encoded,
        "status": "completed",
    }


def verify_body(
    row: Mapping[str, Any], output: Sequence[OutputItem], *, model: str = "probe"
) -> dict[str, Any]:
    """A NeMo Gym ``POST /verify`` body: the raw row plus a response around ``output`` (with the fields
    NeMo Gym's response model requires). How probes, and tools built on them, ask the real verifier."""
    params = row.get("responses_create_params")
    params = params if isinstance(params, Mapping) else {}
    return {
        **copy.deepcopy(dict(row)),
        "response": {
            "id": f"resp_{model}",
            "object": "response",
            "created_at": 0,
            "model": model,
            "output": copy.deepcopy([dict(item) for item in output]),
            "parallel_tool_calls": bool(params.get("parallel_tool_calls", False)),
            "tool_choice": "auto",
            "tools": copy.deepcopy(params.get("tools", [])),
        },
    }
