"""The bridge's wire names: how a trial's rollout id reaches the environment, and how its model calls
come back to the gateway by it.

The /run body carries the rollout id as NeMo Gym main's explicit ``_ng_rollout_id`` and, for older NeMo
Gyms, split at its last dash, as ``_ng_task_index`` and ``_ng_rollout_index`` (run_indices). An agent then
calls models at ``<gateway>/ng-rollout/<id>/v1/...``, with ``<id>`` the explicit id or
``f"{_ng_task_index}-{_ng_rollout_index}"``, exactly as NeMo Gym >= 0.5 composes it with observability on
(and as agents given one base URL, such as Claude Code, are configured); a re-dispatched attempt's
``<id>-a<n>`` and the training-token-capture path ``/ng-rollout/<id>/training-token-capture/v1/...`` name
the same trial (model_call_route). Or at
``<gateway>/v1/...`` with the id in the body's ``metadata.relax_gym_rollout``: the gateway puts it in the
/run body's ``responses_create_params.metadata``, and NeMo Gym 0.4.0's simple_agent resends that metadata
unchanged on every model call. The tag never goes upstream.

The names are spelled once, in relax_gym_core.ingym (standard library only), because the servers that
run inside the NeMo Gym environment need them too.
"""

from __future__ import annotations

from relax_gym_core.ingym import (
    BRIDGE_PREFIX,
    ROLLOUT_ID,
    ROLLOUT_INDEX,
    ROLLOUT_TAG,
    TASK_INDEX,
    TOKEN_CAPTURE_SEGMENT,
    attempt_of,
    tag_of,
)

__all__ = [
    "BRIDGE_PREFIX",
    "MODEL_APIS",
    "ROLLOUT_ID",
    "ROLLOUT_INDEX",
    "ROLLOUT_TAG",
    "TASK_INDEX",
    "TOKEN_CAPTURE_SEGMENT",
    "attempt_of",
    "bridge_url",
    "model_call_route",
    "run_indices",
    "tag_of",
]

# The model APIs the bridge forwards, by their path under /v1/: an agent calls one of them (an environment
# says which: EnvironmentDefinition.model_api), and the trainer's per-session model API must serve it.
MODEL_APIS = ("chat/completions", "responses", "messages")


def run_indices(rollout_id: str) -> dict[str, str]:
    """The /run body fields that carry `rollout_id`: NeMo Gym main's explicit ``_ng_rollout_id`` and, for
    older NeMo Gyms, the id split at its last dash, so their ``f"{task}-{rollout}"`` gives it back."""
    task, _, rollout = rollout_id.rpartition("-")
    return {ROLLOUT_ID: rollout_id, TASK_INDEX: task, ROLLOUT_INDEX: rollout}


def model_call_route(path: str) -> tuple[str, str] | None:
    """(the rollout id, the rest of the path after it) of a prefixed model-call path, else None:
    ``/ng-rollout/<id>/v1/...``, or with training token capture
    ``/ng-rollout/<id>/training-token-capture/v1/...`` (the segment is NeMo Gym's capture switch for its
    own model servers; to the gateway the call is the trial's like any other)."""
    if not path.startswith(BRIDGE_PREFIX):
        return None
    rollout_id, _, rest = path[len(BRIDGE_PREFIX) :].partition("/")
    rest = rest.removeprefix(f"{TOKEN_CAPTURE_SEGMENT}/")
    return (rollout_id, rest) if rollout_id else None


def bridge_url(gateway_url: str, rollout_id: str) -> str:
    """A trial's model-call base URL on the gateway at `gateway_url` (no trailing slash expected):
    ``<gateway_url>/ng-rollout/<rollout_id>``; clients append ``/v1/...``."""
    return f"{gateway_url}{BRIDGE_PREFIX}{rollout_id}"
