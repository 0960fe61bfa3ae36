"""Strict JSON: finite numbers only, canonical encoding, keyed fingerprints."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import marshal
import math
from typing import Any

import orjson

from relax_gym_core.errors import InvalidJSONError, ProtocolError

type JSONValue = bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None


def _reject_constant(name: str) -> Any:
    raise ProtocolError(f"request body must contain only finite JSON values (found {name})")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError(f"request body must contain only finite JSON values (found {text[:32]})")
    return value


def deep_copy[T](value: T) -> T:
    """copy.deepcopy for JSON-shaped data (dicts, lists, strings, numbers, None), about six times faster
    (marshal's round trip: a 17 KB workplace task in 0.05 ms, against 0.35 ms); anything marshal refuses
    goes to copy.deepcopy. Shared objects stay shared, as with deepcopy."""
    data: Any = value  # marshal's own check, not the type's, decides what it takes
    try:
        copied: T = marshal.loads(marshal.dumps(data))  # noqa: S302 - bytes made just now, by us
    except ValueError:
        return copy.deepcopy(value)
    return copied


MAX_DEPTH = 100  # deeper JSON is refused: nothing real nests this far, and recursion must never 500


# loads() and dumps() run on the gateway's hot path (every bridged call parses and encodes a body, every
# create parses its task), where orjson is several times faster than the json module. orjson answers only
# where it gives json's answer (tests/protocol/test_jsonutil_orjson.py holds it to that); anywhere else
# the json module decides (_json_loads, _json_dumps: the code as it was before orjson), so every value and
# every error is the json module's.

# orjson reads an integer beyond 64 bits as a float, where json keeps the exact int. Such an integer is
# at least 19 digits, after whatever may stand before an integer in JSON: the start, whitespace, "[", ",",
# ":" or its "-". A text holding that goes to json. Found at C speed: those separators made " ", every
# digit "0", then one substring test. Fractions (after ".") never match; a false alarm (an exponent,
# digits inside a string) costs only speed.
_NUMBER_START = bytes.maketrans(b"0123456789[,:- \t\n\r", b"0" * 10 + b" " * 8)
_WIDE_INT = b"0" * 19
_WIDE_INT_AFTER_SEPARATOR = b" " + _WIDE_INT


def _may_hold_wide_int(data: bytes | bytearray | str) -> bool:
    if isinstance(data, str):  # surrogatepass: a str orjson cannot encode is refused by orjson itself
        data = data.encode("utf-8", "surrogatepass")
    marked = data.translate(_NUMBER_START)
    return marked.startswith(_WIDE_INT) or _WIDE_INT_AFTER_SEPARATOR in marked


def loads(data: bytes | str, *, check_unicode: bool = True) -> Any:
    """Parse JSON; NaN, Infinity and overflowing numbers raise ProtocolError, bad syntax InvalidJSONError.

    Bytes must be UTF-8 (anything else is not JSON: InvalidJSONError). json.loads turns "\\udc80" escapes
    (and UTF-8-encoded surrogates) into strings that cannot be encoded again; with `check_unicode` such a
    string is a ProtocolError naming where it is. Callers that write the value out anyway can skip the
    check: dumps() and canonical() refuse it the same way.
    """
    # memoryview: orjson reads it, json.loads refuses it (TypeError), so json must answer.
    if isinstance(data, (bytes, bytearray, str)) and not _may_hold_wide_int(data):
        try:
            # orjson refuses lone surrogates, escaped or encoded, and any invalid UTF-8: what it returns
            # is valid Unicode, so the check_unicode pass has nothing to find.
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            # NaN, Infinity, 1e400, lone surrogates, a BOM, UTF-16, nesting beyond orjson's 1024 levels,
            # bad syntax: json parses it the same way or raises the error it always raised.
            pass
    return _json_loads(data, check_unicode=check_unicode)


def loads_as_json(data: bytes | str) -> Any:
    """What json.loads reads, NaN and Infinity included (dumps refuses them on the way out): the reading of
    answers we pass on or keep as they came (a model's, an agent's /run). By orjson where the two agree;
    not valid JSON at all: InvalidJSONError (a ValueError, as json's own errors are)."""
    try:
        return loads(data, check_unicode=False)
    except InvalidJSONError:
        raise
    except ProtocolError:  # NaN, Infinity, 1e400: valid to json.loads
        return json.loads(data)


def _json_loads(data: bytes | str, *, check_unicode: bool) -> Any:
    """loads() by the json module alone: the reference orjson's answers must equal."""
    try:
        value = json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError(f"request body must not nest deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise InvalidJSONError("request body must be valid JSON") from exc
    except UnicodeDecodeError:  # before ValueError, its base: bytes that are not UTF-8 are not JSON
        raise InvalidJSONError("request body must be valid JSON (UTF-8)") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise ProtocolError(f"request body contains an unacceptable number ({exc})") from None
    if check_unicode:
        refuse_lone_surrogates(value, data)
    return value


def refuse_lone_surrogates(value: Any, parsed_from: bytes | str) -> None:
    """ProtocolError naming the field if `value`, parsed from `parsed_from`, holds a lone surrogate."""
    if _may_hold_surrogates(parsed_from):
        dumps(value)  # C speed; names the field only when something is wrong


def _may_hold_surrogates(data: bytes | str) -> bool:
    # Substring tests run at memory speed; only a body that passes one is encoded again to be sure.
    if isinstance(data, str):
        return "\\ud" in data or "\\uD" in data or not _encodable(data)
    return b"\\ud" in data or b"\\uD" in data or b"\xed" in data


def _unicode_error(value: Any) -> ProtocolError:
    where = unencodable_path(value) or "request body"
    if len(where) > 200:  # a path is made of the caller's keys: keep the message short
        where = where[:197] + "..."
    return ProtocolError(f"{where} must be valid Unicode (it contains a lone surrogate)")


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unencodable_path(value: Any) -> str | None:
    """Where the first string (or key) that UTF-8 cannot encode is, as `a.b[2].c`; None if there is none."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return path or "request body"
        elif isinstance(item, dict):
            for key, child in item.items():
                name = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and not _encodable(key):
                    return f"{path or 'request body'} key"
                stack.append((child, name))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(item))
    return None


# Subclasses of str, int, dict and list (a dict subclass may redefine items(), which json honours),
# dataclasses and datetimes go to json: orjson would encode them its own way, or where json refuses.
_ORJSON_DUMPS = (
    orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
)


def dumps(value: Any, *, parsed: bool = False) -> bytes:
    """Compact UTF-8 JSON; refuses NaN so nothing we emit is invalid JSON, and lone surrogates (a
    ProtocolError naming the field) so no caller meets a UnicodeEncodeError.

    `parsed`: the caller vouches that `value` is what loads() returned (no NaN, Enum or tuple can be in
    it), changed only by values of that kind, such as fields checked by is_finite_json; orjson's output then
    says what json's would without being read back (that costs ~45 us of ~55 for a 15 KB model call)."""
    try:
        encoded = orjson.dumps(value, option=_ORJSON_DUMPS)
        if parsed:
            return encoded
        # orjson writes NaN and the infinities as null and encodes Enum members and UUIDs, where json
        # refuses all of them; none of these reads back equal (None != nan, 1 != Color.RED), so reading
        # the bytes back (C speed, no walk in Python) shows they say what json would. A tuple reads back
        # as a list, unequal too: json writes it, the same array.
        if orjson.loads(encoded) == value:
            return encoded
    except (orjson.JSONEncodeError, orjson.JSONDecodeError):
        # Integers beyond 64 bits, keys that are not str, lone surrogates, nesting beyond orjson's 254
        # levels, a circular value, types orjson does not know: json encodes it or refuses it as always.
        pass
    return _json_dumps(value)


def _json_dumps(value: Any) -> bytes:
    """dumps() by the json module alone: the reference orjson's answers must equal."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError:
        raise _unicode_error(value) from None


def canonical(value: Any) -> bytes:
    """Sorted-key compact JSON, the input of fingerprints (lone surrogates refused as in dumps)."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except UnicodeEncodeError:
        raise _unicode_error(value) from None


def is_finite_json(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """True if value is JSON types only, finite numbers only, nested at most max_depth levels.

    Level by level (no recursion, so checking deep data cannot itself recurse), exact scalar types first:
    every create walks its task (a workplace task is ~17 KB), so the common case must be cheap.
    """
    level, depth = [value], 0
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None:
                continue
            if isinstance(item, (dict, list)):
                if depth >= max_depth:
                    return False
                if isinstance(item, list):
                    below.extend(item)
                elif all(type(key) is str or isinstance(key, str) for key in item):
                    below.extend(item.values())
                else:
                    return False
            elif isinstance(item, float):
                if not math.isfinite(item):
                    return False
            elif not isinstance(item, (int, str)):  # their subclasses (IntEnum, StrEnum) are JSON too
                return False
        level, depth = below, depth + 1
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
