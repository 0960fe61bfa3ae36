"""The create body on its way in: parsed off the event loop when large, unknown keys made visible.

A create carries a whole task; parsing and validating one value by value is Python work proportional to
its size (seconds for a few MB of tiny lists), so large bodies are parsed in a worker thread and the event
loop keeps answering everyone else. The body's size is capped before this (gateway/limits.py).

relax-nemo-gym/v1 clients may add fields, so keys the protocol does not define are ignored by default,
but never silently: each is counted in /metrics (relax_gym_unknown_request_keys_total, by the object it
was found in) and logged once by name, so a typo such as "deadline" shows. RELAX_GYM_UNKNOWN_KEYS=refuse
answers 422 naming them instead.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import anyio.to_thread

from relax_gym_core.errors import ProtocolError
from relax_gym_core.gateway.metrics import GatewayMetrics
from relax_gym_core.protocol import CreateTrialRequest, jsonutil, structure, unknown_keys

logger = logging.getLogger("relax_gym.gateway")

INLINE_PARSE_BYTES: Final = 64 * 1024  # smaller bodies parse faster than a thread hand-off
_LOGGED_MAX: Final = 1024  # distinct unknown keys logged by name; later ones are only counted
_SHOWN_KEYS: Final = 5
_SHOWN_CHARS: Final = 64
_NESTED: Final = frozenset({"session", "environment", "model_endpoint", "generation"})


def _parse(raw: bytes) -> tuple[CreateTrialRequest, dict[str, Any]]:
    data = jsonutil.loads(raw)
    return structure(data, CreateTrialRequest), data


def _shown(key: str) -> str:
    return key if len(key) <= _SHOWN_CHARS else key[: _SHOWN_CHARS - 3] + "..."


class CreateIntake:
    def __init__(self, metrics: GatewayMetrics, *, refuse_unknown: bool = False) -> None:
        self._metrics = metrics
        self._refuse_unknown = refuse_unknown
        self._logged: set[str] = set()

    async def parse(self, raw: bytes) -> CreateTrialRequest:
        """The create request in `raw`, or a ProtocolError naming the field."""
        if len(raw) <= INLINE_PARSE_BYTES:
            request, data = _parse(raw)
        else:
            request, data = await anyio.to_thread.run_sync(_parse, raw)
        unknown = unknown_keys(data, CreateTrialRequest)
        if unknown:
            self._report(unknown)
        return request

    def _report(self, keys: list[str]) -> None:
        for key in keys:
            # The label is one of a fixed few (keys are the caller's text: never a label themselves).
            head, dot, _rest = key.partition(".")
            self._metrics.unknown_key(head if dot and head in _NESTED else "request")
        if self._refuse_unknown:
            shown = ", ".join(_shown(key) for key in keys[:_SHOWN_KEYS])
            more = f" and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else ""
            raise ProtocolError(f"request has unknown keys: {shown}{more} (RELAX_GYM_UNKNOWN_KEYS=refuse)")
        for key in keys:
            if key not in self._logged and len(self._logged) < _LOGGED_MAX:
                self._logged.add(key)
                logger.warning(
                    "create request key %r is not part of relax-nemo-gym/v1 and was ignored "
                    "(logged once; RELAX_GYM_UNKNOWN_KEYS=refuse refuses such requests)",
                    _shown(key),
                )
