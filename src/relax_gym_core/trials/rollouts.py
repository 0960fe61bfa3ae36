"""Rollout ids, and the index of the live ones: rollout id -> request_id, for active trials only.

A trial's rollout id is the one opaque id its environment knows it by. The gateway sends it in the /run
body as ``_ng_task_index`` / ``_ng_rollout_index`` (the part before / after the last dash), and NeMo Gym
joins them back: agents of NeMo Gym >= 0.5 with observability on address the trial's model calls to
``/ng-rollout/<task>-<rollout>/v1/...``, stateful servers key their sessions by it, and cleanup is asked
for and proven by it, also after a restart (so the ledger records it).

While its trial is active the id is also the bearer of the trial's model calls (it lets a caller spend the
session's token through the bridge), so ids are 128 random bits, never reissued, and live only in this
index, which is in memory: a gateway that restarts starts with it empty, so every id issued before is
refused. The part after the last dash is free to name a shard when trials are spread over several
gateways (0 here: one gateway sees all).
"""

from __future__ import annotations

import secrets

SHARD = "0"


def random_rollout_id() -> str:
    return f"{secrets.token_hex(16)}-{SHARD}"


class LiveRollouts:
    """The rollout ids of active trials; the bridge accepts a model call only for one of these."""

    def __init__(self) -> None:
        self._request_ids: dict[str, str] = {}

    def grant(self, rollout_id: str, request_id: str) -> None:
        self._request_ids[rollout_id] = request_id

    def revoke(self, rollout_id: str) -> None:
        self._request_ids.pop(rollout_id, None)

    def lookup(self, rollout_id: str) -> str | None:
        return self._request_ids.get(rollout_id)

    def __contains__(self, rollout_id: str) -> bool:
        return rollout_id in self._request_ids
