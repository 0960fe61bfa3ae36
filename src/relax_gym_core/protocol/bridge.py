"""The bridge's wire names: how a trial's rollout id reaches the environment, and how its model calls
come back to the gateway by it.

The /run body carries the rollout id split at its last dash, as NeMo Gym's ``_ng_task_index`` and
``_ng_rollout_index`` (run_indices). An agent then calls models at ``<gateway>/ng-rollout/<id>/v1/...``,
with ``<id> = f"{_ng_task_index}-{_ng_rollout_index}"``, exactly as NeMo Gym >= 0.5 composes it with
observability on (and as agents given one base URL, such as Claude Code, are configured), or at
``<gateway>/v1/...`` with the id in the body's ``metadata.relax_gym_rollout``: the gateway puts it in the
/run body's ``responses_create_params.metadata``, and NeMo Gym 0.4.0's simple_agent resends that metadata
unchanged on every model call. The tag never goes upstream.

Servers that run inside the NeMo Gym environment cannot import this (relax_gym_core.protocol needs cattrs,
which that environment lacks) and keep their own copies; tests/protocol/test_bridge_names.py pins them.
"""

from __future__ import annotations

from typing import Any, Final

BRIDGE_PREFIX: Final = "/ng-rollout/"  # the per-trial model-call prefix (NeMo Gym's), then the rollout id
ROLLOUT_TAG: Final = "relax_gym_rollout"  # the metadata key holding a trial's rollout id
TASK_INDEX: Final = "_ng_task_index"  # NeMo Gym's /run body keys; the rollout id is "<task>-<rollout>"
ROLLOUT_INDEX: Final = "_ng_rollout_index"


def run_indices(rollout_id: str) -> dict[str, str]:
    """The /run body fields that carry `rollout_id`: split at its last dash, so NeMo Gym's
    ``f"{task}-{rollout}"`` gives the id back."""
    task, _, rollout = rollout_id.rpartition("-")
    return {TASK_INDEX: task, ROLLOUT_INDEX: rollout}


def rollout_id_of(metadata: Any) -> str | None:
    """The rollout id in a metadata object: a non-empty string under ROLLOUT_TAG, else None
    (metadata that is not a dict, a missing tag, or a tag that is not a non-empty string)."""
    if not isinstance(metadata, dict):
        return None
    value = metadata.get(ROLLOUT_TAG)
    return value if isinstance(value, str) and value else None


def bridge_url(gateway_url: str, rollout_id: str) -> str:
    """A trial's model-call base URL on the gateway at `gateway_url` (no trailing slash expected):
    ``<gateway_url>/ng-rollout/<rollout_id>``; clients append ``/v1/...``."""
    return f"{gateway_url}{BRIDGE_PREFIX}{rollout_id}"
