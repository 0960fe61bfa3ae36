"""Idempotent create: a replay of a request_id must carry the same body, told apart by a keyed fingerprint.

Every field counts (task, session, generation, endpoint, headers, policy, deadline, lease, metadata)
except model_endpoint.api_key: a replay with a refreshed token is the same trial, not a conflict.
"""

from __future__ import annotations

import secrets
from typing import Any

from relax_gym_core.errors import TrialConflictError
from relax_gym_core.protocol import CreateTrialRequest, unstructure
from relax_gym_core.protocol.jsonutil import Fingerprinter


def fingerprint_body(request: CreateTrialRequest) -> dict[str, Any]:
    """What a replay must repeat exactly: the wire body without the api_key."""
    body: dict[str, Any] = unstructure(request)
    body["model_endpoint"].pop("api_key", None)
    return body


class ReplayGuard:
    def __init__(self, key: bytes | None = None) -> None:
        # Keyed, so a stored digest says nothing about the body it came from. Process-random unless the
        # store's records outlive the process (the ledger keeps its key in the state directory).
        self._fingerprint = Fingerprinter(key or secrets.token_bytes(32))

    def fingerprint(self, request: CreateTrialRequest) -> bytes:
        return self._fingerprint(fingerprint_body(request))

    @staticmethod
    def check_replay(recorded: bytes, fingerprint: bytes) -> None:
        if not Fingerprinter.same(recorded, fingerprint):
            raise TrialConflictError("request_id already exists with a different payload")
