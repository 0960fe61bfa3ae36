"""Strict JSON: finite numbers only, canonical encoding, keyed fingerprints."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from typing import Any

from relax_gym_core.errors import InvalidJSONError, ProtocolError

type JSONValue = bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None


def _reject_constant(name: str) -> Any:
    raise ProtocolError(f"request body must contain only finite JSON values (found {name})")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError(f"request body must contain only finite JSON values (found {text[:32]})")
    return value


def loads(data: bytes | str) -> Any:
    """Parse JSON; NaN, Infinity and overflowing numbers raise ProtocolError, bad syntax InvalidJSONError."""
    try:
        return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except ProtocolError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise InvalidJSONError("request body must be valid JSON") from exc


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON; refuses NaN so nothing we emit is invalid JSON."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def canonical(value: Any) -> bytes:
    """Sorted-key compact JSON, the input of fingerprints."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def is_finite_json(value: Any) -> bool:
    """True if value is made of JSON types with finite numbers only (iterative: deep data cannot recurse)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                return False
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            return False
    return True


class Fingerprinter:
    """HMAC-SHA256 of canonical JSON under a process-random key, so stored digests reveal nothing."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def __call__(self, value: Any) -> bytes:
        return hmac.new(self._key, canonical(value), hashlib.sha256).digest()

    @staticmethod
    def same(left: bytes, right: bytes) -> bool:
        return hmac.compare_digest(left, right)
