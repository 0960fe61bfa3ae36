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


MAX_DEPTH = 100  # deeper JSON is refused: nothing real nests this far, and recursion must never 500


def loads(data: bytes | str) -> Any:
    """Parse JSON; NaN, Infinity and overflowing numbers raise ProtocolError, bad syntax InvalidJSONError."""
    try:
        return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError(f"request body must not nest deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise InvalidJSONError("request body must be valid JSON") from exc
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise ProtocolError(f"request body contains an unacceptable number ({exc})") from None
    except UnicodeDecodeError as exc:
        raise InvalidJSONError("request body must be valid JSON") from exc


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON; refuses NaN so nothing we emit is invalid JSON."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def canonical(value: Any) -> bytes:
    """Sorted-key compact JSON, the input of fingerprints."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def is_finite_json(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """True if value is JSON types only, finite numbers only, nested at most max_depth levels.

    Iterative, so checking deep data cannot itself recurse.
    """
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
            continue
        if depth >= max_depth:
            return False
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                return False
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
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
