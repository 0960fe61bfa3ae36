"""The bridge's wire names: how a trial's rollout id reaches the environment, and how its model calls
come back to the gateway by it.

The /run body carries the rollout id split at its last dash, as NeMo Gym's ``_ng_task_index`` and
``_ng_rollout_index`` (run_indices). An agent then calls models at ``<gateway>/ng-rollout/<id>/v1/...``,
with ``<id> = f"{_ng_task_index}-{_ng_rollout_index}"``, exactly as NeMo Gym >= 0.5 composes it with
observability on (and as agents given one base URL, such as Claude Code, are configured), or at
``<gateway>/v1/...`` with the id in the body's ``metadata.relax_gym_rollout``: the gateway puts it in the
/run body's ``responses_create_params.metadata``, and NeMo Gym 0.4.0's simple_agent resends that metadata
unchanged on every model call. The tag never goes upstream.

The names are spelled once, in relax_gym_core.ingym (standard library only), because the servers that
run inside the NeMo Gym environment need them too.
"""

from __future__ import annotations

from relax_gym_core.ingym import BRIDGE_PREFIX, ROLLOUT_INDEX, ROLLOUT_TAG, TASK_INDEX, tag_of

__all__ = [
    "BRIDGE_PREFIX",
    "ROLLOUT_INDEX",
    "ROLLOUT_TAG",
    "TASK_INDEX",
    "bridge_url",
    "run_indices",
    "tag_of",
]


def run_indices(rollout_id: str) -> dict[str, str]:
    """The /run body fields that carry `rollout_id`: split at its last dash, so NeMo Gym's
    ``f"{task}-{rollout}"`` gives the id back."""
    task, _, rollout = rollout_id.rpartition("-")
    return {TASK_INDEX: task, ROLLOUT_INDEX: rollout}


def bridge_url(gateway_url: str, rollout_id: str) -> str:
    """A trial's model-call base URL on the gateway at `gateway_url` (no trailing slash expected):
    ``<gateway_url>/ng-rollout/<rollout_id>``; clients append ``/v1/...``."""
    return f"{gateway_url}{BRIDGE_PREFIX}{rollout_id}"
