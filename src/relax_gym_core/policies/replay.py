"""Replay of recorded trajectories: each model turn of a known task, answered in order, verbatim.

A recorded trajectory (a replay VerifierProbe's output, NeMo Gym's `response.output`) is a flat list of
items. Its model turns are the maximal runs of what the model produced (reasoning, assistant messages,
function calls); what separates them came live from the environment (function_call_output items, and the
observations a gymnasium agent appends as user messages), so a replay answers only the model's part and
the environment produces the rest again. A request's turn is how many model turns its input holds after
the task's own prompt. Which task a request belongs to is known exactly, never guessed from its text: the
rollout id (a probe's replay talks to the agent itself) or the trial's row (the oracle policy).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import frozen

from relax_gym_core.ingym import BRIDGE_PREFIX, tag_of
from relax_gym_core.plugin import VerifierProbe

_MODEL_ITEMS = frozenset({"reasoning", "function_call", "message"})
_USAGE = {
    "input_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 0,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 0,
}


def _is_model_item(item: Any) -> bool:
    kind = item.get("type", "message") if isinstance(item, Mapping) else None  # a message may omit its type
    if kind not in _MODEL_ITEMS:
        return False
    return kind != "message" or bool(item.get("role", "assistant") == "assistant")


def turns_of(items: Sequence[Any]) -> list[list[dict[str, Any]]]:
    """The model turns of a trajectory (or of what a request's input holds after its prompt), in order."""
    turns: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] | None = None
    for item in items:
        if _is_model_item(item):
            if current is None:
                current = []
                turns.append(current)
            current.append(dict(item))
        else:
            current = None
    return turns


def prompt_length(row: Mapping[str, Any]) -> int:
    """How many input items a raw NeMo Gym row's prompt is (a string prompt is one message)."""
    params = row.get("responses_create_params")
    prompt = params.get("input") if isinstance(params, Mapping) else None
    return len(prompt) if isinstance(prompt, list) else 1


@frozen(kw_only=True)
class ReplayPlan:
    """One recorded trajectory: its model turns, and how long the task's prompt is."""

    turns: tuple[tuple[dict[str, Any], ...], ...]
    prompt_length: int

    @classmethod
    def of(cls, probe: VerifierProbe) -> ReplayPlan:
        turns = tuple(tuple(turn) for turn in turns_of(list(probe.output)))
        return cls(turns=turns, prompt_length=prompt_length(probe.row))

    def step(self, body: Mapping[str, Any]) -> int:
        """Which turn a request asks for: the model turns its input already holds after the prompt."""
        items = body.get("input")
        return len(turns_of(items[self.prompt_length :])) if isinstance(items, list) else 0

    def reply(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Responses object answering this request (its next recorded turn), or None past the last
        turn (the environment diverged from the recording, or its agent asks again where it stopped when it
        was recorded). A turn that neither answers nor calls a tool (reasoning only) is answered as a
        completed response, as a model may end one: NeMo Gym's recordings do not keep whether it was cut
        off, and marking it so would hide an agent that loops on such a reply (its max_steps must end it)."""
        step = self.step(body)
        if step >= len(self.turns):
            return None
        output = copy.deepcopy(list(self.turns[step]))
        return {
            "id": f"resp_replay_{step}",
            "object": "response",
            "created_at": 0,
            "model": str(body.get("model") or "replay"),
            "output": output,
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": copy.deepcopy(body.get("tools") or []),
            "status": "completed",
            "incomplete_details": None,
            "usage": dict(_USAGE),
        }


def diverged(plan: ReplayPlan, body: Mapping[str, Any]) -> str:
    """What a request past the recording's end means, for the error the replay answers."""
    return (
        f"the recording has {len(plan.turns)} model turn(s) and the agent asked for turn "
        f"{plan.step(body) + 1}: the environment did not answer as it did when it was recorded"
    )


def rollout_of(path: str, body: Mapping[str, Any]) -> str | None:
    """The rollout id a model call carries: in its /ng-rollout/<id>/ path, else its metadata tag."""
    if path.startswith(BRIDGE_PREFIX):
        return path[len(BRIDGE_PREFIX) :].split("/", 1)[0] or None
    return tag_of(body)


type Lookup = Callable[[str, Mapping[str, Any]], ReplayPlan | None]


def replay_app(lookup: Lookup, divergences: dict[str, str] | None = None) -> Any:
    """A model server answering POST /v1/responses (also under NeMo Gym's /ng-rollout/<id> prefix) from the
    plan `lookup(path, body)` finds: a NeMo Gym agent's policy_model for a replay. A request past its
    recording's end is answered 409 and recorded in `divergences` by rollout id (the reason a probe gives).
    Needs the gateway extra (Starlette)."""
    from starlette.applications import Starlette  # noqa: PLC0415 - the web stack only where served
    from starlette.requests import Request  # noqa: PLC0415
    from starlette.responses import JSONResponse  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    async def responses(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        body = body if isinstance(body, dict) else {}
        plan = lookup(request.url.path, body)
        if plan is None:
            return JSONResponse({"detail": "no recorded trajectory for this request"}, 404)
        answer = plan.reply(body)
        if answer is None:
            reason = diverged(plan, body)
            if divergences is not None:
                divergences[rollout_of(request.url.path, body) or ""] = reason
            return JSONResponse({"detail": reason}, 409)
        return JSONResponse(answer)

    paths = ("/v1/responses", BRIDGE_PREFIX + "{rollout_id}/v1/responses")
    return Starlette(routes=[Route(path, responses, methods=["POST"]) for path in paths])
