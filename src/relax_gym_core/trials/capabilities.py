"""The rollout capability index: capability -> request_id, for active trials only.

A live capability is a credential (it lets a caller spend the session's token through the bridge), so
capabilities are 128 random bits, held in memory only (never in the ledger, never logged) and revoked the
moment a trial stops being active. A gateway that restarts starts with an empty index: every capability
issued before it is refused.

Rollout ids are what environments see (run bodies, cleanup URLs). They are not credentials and are
recorded in the ledger. Both have the reference's shape `<task>-<index>`; the part after the last dash
is free to name a shard when trials are spread over several gateways (0 here: one gateway sees all).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

SHARD = "0"


def random_rollout_id() -> str:
    return f"{secrets.token_hex(16)}-{SHARD}"


def random_capability() -> str:
    return f"{secrets.token_hex(16)}-{SHARD}"


class CapabilityIndex:
    def __init__(self, new_capability: Callable[[], str] | None = None) -> None:
        self.mint: Callable[[], str] = new_capability or random_capability
        self._by_capability: dict[str, str] = {}

    def grant(self, capability: str, request_id: str) -> None:
        self._by_capability[capability] = request_id

    def revoke(self, capability: str | None) -> None:
        if capability is not None:
            self._by_capability.pop(capability, None)

    def lookup(self, capability: str) -> str | None:
        return self._by_capability.get(capability)

    def __contains__(self, capability: str) -> bool:
        return capability in self._by_capability
