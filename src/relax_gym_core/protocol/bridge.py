"""The bridge's wire names: where a trial's model calls reach the gateway, and where its capability rides.

An agent calls models at ``<gateway>/ng-rollout/<capability>/v1/...`` (the capability in the path), or at
``<gateway>/v1/...`` with the capability in the body's ``metadata.relax_gym_rollout``: the gateway puts it
in the /run body's ``responses_create_params.metadata``, and NeMo Gym 0.4.0's simple_agent resends that
metadata unchanged on every model call. The tag never goes upstream.

Servers that run inside the NeMo Gym environment cannot import this (relax_gym_core.protocol needs cattrs,
which that environment lacks) and keep their own copies; tests/protocol/test_bridge_names.py pins them.
"""

from __future__ import annotations

from typing import Any, Final

BRIDGE_PREFIX: Final = "/ng-rollout/"  # the gateway's per-trial model-call prefix, then the capability
CAPABILITY_TAG: Final = "relax_gym_rollout"  # the metadata key holding a trial's capability


def capability_of(metadata: Any) -> str | None:
    """The trial capability in a metadata object: a non-empty string under CAPABILITY_TAG, else None
    (metadata that is not a dict, a missing tag, or a tag that is not a non-empty string)."""
    if not isinstance(metadata, dict):
        return None
    value = metadata.get(CAPABILITY_TAG)
    return value if isinstance(value, str) and value else None


def bridge_url(gateway_url: str, capability: str) -> str:
    """A trial's model-call base URL on the gateway at `gateway_url` (no trailing slash expected):
    ``<gateway_url>/ng-rollout/<capability>``; clients append ``/v1/...``."""
    return f"{gateway_url}{BRIDGE_PREFIX}{capability}"
