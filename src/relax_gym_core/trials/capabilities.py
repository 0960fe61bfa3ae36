"""The rollout capability index: rollout_id -> request_id, for active trials only.

A live rollout id is a credential (it lets a caller spend the session's token through the bridge), so
ids are 128 random bits and are revoked the moment a trial stops being active.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable


def random_rollout_id() -> str:
    return f"{secrets.token_hex(16)}-0"


class CapabilityIndex:
    def __init__(self, new_rollout_id: Callable[[], str] | None = None) -> None:
        self.mint: Callable[[], str] = new_rollout_id or random_rollout_id
        self._by_rollout: dict[str, str] = {}

    def grant(self, rollout_id: str, request_id: str) -> None:
        self._by_rollout[rollout_id] = request_id

    def revoke(self, rollout_id: str) -> None:
        self._by_rollout.pop(rollout_id, None)

    def lookup(self, rollout_id: str) -> str | None:
        return self._by_rollout.get(rollout_id)

    def __contains__(self, rollout_id: str) -> bool:
        return rollout_id in self._by_rollout
