"""jsonutil.loads and dumps answer from orjson only where it gives the json module's answer: each is compared
with its json-only reference (jsonutil._json_loads, _json_dumps) over texts and values made to hit every
place where the two libraries differ (NaN, huge integers, lone surrogates, bad UTF-8, deep nesting, types
that are not JSON), and ordinary bodies are shown never to reach the json module."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import json
import math
import struct
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relax_gym_core.errors import InvalidJSONError, ProtocolError
from relax_gym_core.protocol import jsonutil

# ---- exact comparison -----------------------------------------------------------------------------------


def exact(value: Any) -> tuple[Any, ...]:
    """A flat form whose equality means the same value: types (int vs float vs bool), float bits (-0.0),
    key order. Iterative: the values compared nest deeper than Python's recursion limit."""
    tokens: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            tokens.append(("float", struct.pack(">d", item)))
        elif isinstance(item, dict):
            tokens.append(("dict", len(item)))
            for key, child in reversed(item.items()):
                stack.append(child)
                stack.append(("key", type(key), key))  # a marker: parsed JSON holds no tuples
        elif isinstance(item, list):
            tokens.append(("list", len(item)))
            stack.extend(reversed(item))
        elif isinstance(item, tuple) and item[:1] == ("key",):
            tokens.append(item)
        else:
            tokens.append((type(item), item))
    return tuple(tokens)


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a call gives: its exact value, or its error's class and message (and what it was raised from)."""
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the error is the outcome compared
        cause, context = exc.__cause__, exc.__context__
        return (
            "raised",
            type(exc),
            str(exc),
            type(cause),
            str(cause),
            type(context),
            exc.__suppress_context__,
        )
    return ("returned", exact(value))


def nested(depth: int, inner: str = "1") -> str:
    return (
        "".join('[{"a":' if level % 2 else "[" for level in range(depth))
        + inner
        + "".join("}]" if level % 2 else "]" for level in reversed(range(depth)))
    )


# ---- loads: JSON texts meant to find every difference ----------------------------------------------------

BOUNDARY_INTS = [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**18, 10**19 - 1, 10**19]
SPECIAL_NUMBERS = [
    "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-1e-400", "-0.0", "-0", "0", "-0e0",
    "1E5", "1.0", "2.5e-324", "1.7976931348623157e308", "1.7976931348623159e308", "9007199254740993.0",
    "0.0012345678901234567", "1." + "1" * 40, "0." + "0" * 30 + "1", "1e0000000000000000001",
    "123456789012345678901234567890", "-123456789012345678901234567890", "9" * 4301, "01", "1.", ".5", "+1",
]  # fmt: skip
SPECIAL_STRINGS = [
    r'"\ud800"', r'"\uDC80x"', r'"\ud83d\ude00"', r'"\ud83d"', r'"a\udfff"', '"\ud800"', '"\udc80"',
    '"é😀"', r'"\u0000\n"', '"\x01"', '"\x7f"', r'"\x"', '"12345678901234567890"', '"a 12345678901234567890"',
]  # fmt: skip

whitespace = st.sampled_from(["", "", " ", "\n", "\t", "\r\n "])
int_literals = (st.integers(-(2**70), 2**70) | st.sampled_from(BOUNDARY_INTS)).map(str)
fractions = st.just("") | st.text("0123456789", min_size=1, max_size=25).map(".{}".format)
exponents = st.just("") | st.builds("{}{}".format, st.sampled_from(["e", "E-", "e+"]), st.integers(0, 400))
float_literals = st.floats(allow_nan=False, allow_infinity=False).map(repr) | st.builds(
    "{}{}{}{}".format, st.sampled_from(["", "-"]), st.integers(0, 10**25), fractions, exponents
)  # 1e400, 1e-400, long mantissas, halfway cases
string_literals = st.text(max_size=6).flatmap(
    lambda s: st.sampled_from([json.dumps(s), json.dumps(s, ensure_ascii=False)])
) | st.sampled_from(SPECIAL_STRINGS)
scalar_literals = (
    st.sampled_from(["null", "true", "false", *SPECIAL_NUMBERS])
    | int_literals
    | float_literals
    | string_literals
)
keys = st.sampled_from(['"a"', '"b"', '"a"', r'"\ud800"', '"é"', '""']) | string_literals  # duplicates too


def array(items: list[str], space: str) -> str:
    return "[" + space + ("," + space).join(items) + space + "]"


def obj(pairs: list[tuple[str, str]], space: str) -> str:
    return "{" + space + ",".join(f"{k}{space}:{space}{v}" for k, v in pairs) + space + "}"


json_texts = st.recursive(
    scalar_literals,
    lambda inner: (
        st.builds(array, st.lists(inner, max_size=4), whitespace)
        | st.builds(obj, st.lists(st.tuples(keys, inner), max_size=4), whitespace)
    ),
    max_leaves=12,
)


def mutate(text: str, how: str, at: int) -> str:
    """A JSON text made wrong (or not) in a way a body can be wrong."""
    at = min(at, len(text))
    return {
        "as is": text,
        "spaced": f" \t{text}\r\n",
        "truncated": text[:at],
        "extra data": text + " 1",
        "trailing comma": text[:-1] + ",]" if text.endswith("]") else text,
        "form feed": "\x0c" + text,
        "BOM": "\ufeff" + text,
        "control character": text[:at] + "\x1f" + text[at:],
    }[how]


def encodings(text: str) -> list[bytes | str]:
    """The text as a str and as the bytes a body could carry: UTF-8 (surrogates encoded as they stand, as a
    careless sender writes them: b"\\xed\\xa0\\x80"), a bytearray, UTF-16, and invalid UTF-8."""
    utf8 = text.encode("utf-8", "surrogatepass")
    return [
        text,
        utf8,
        bytearray(utf8),
        text.encode("utf-16", "surrogatepass"),
        utf8 + b"\xff",
        b"\x80" + utf8,
    ]


def assert_loads_agrees(data: Any) -> None:
    for check in (True, False):
        expected = outcome(lambda c=check: jsonutil._json_loads(data, check_unicode=c))
        assert outcome(lambda c=check: jsonutil.loads(data, check_unicode=c)) == expected, data


MUTATIONS = ["as is", "as is", "spaced", "truncated", "extra data", "trailing comma", "form feed", "BOM"]


@settings(max_examples=300)
@given(json_texts, st.sampled_from([*MUTATIONS, "control character"]), st.integers(0, 200))
def test_loads_gives_what_the_json_module_gives(text: str, how: str, at: int) -> None:
    for data in encodings(mutate(text, how, at)):
        assert_loads_agrees(data)


@pytest.mark.parametrize("literal", SPECIAL_NUMBERS + SPECIAL_STRINGS)
def test_loads_agrees_on_each_known_difference(literal: str) -> None:
    for text in (literal, f"[{literal}]", f'{{"k": {{"x": [1, {literal}]}}}}'):
        for data in encodings(text):
            assert_loads_agrees(data)


def test_integers_beyond_64_bits_stay_exact_ints_though_orjson_reads_them_as_floats() -> None:
    for number in [*BOUNDARY_INTS, 10**30, -(10**30)]:
        body = f'{{"n": {number}, "m": [{-number}]}}'.encode()
        assert exact(jsonutil.loads(body)) == exact({"n": number, "m": [-number]})
    assert isinstance(orjson.loads(str(2**64)), float)  # why loads looks for long digit runs first


def test_digit_runs_that_are_no_integer_still_parse_exactly() -> None:
    body = '{"x": 0.0012345678901234567, "y": -1.0000000000000000000001e5, "id": "12345678901234567890"}'
    assert exact(jsonutil.loads(body)) == exact(
        {"x": 0.0012345678901234567, "y": -1.0000000000000000000001e5, "id": "12345678901234567890"}
    )


def test_non_finite_numbers_are_refused_as_before() -> None:
    for literal in ("NaN", "-Infinity", "1e400", "-1e999"):
        with pytest.raises(ProtocolError, match="only finite JSON values"):
            jsonutil.loads(f'{{"temperature": {literal}}}'.encode())
    assert jsonutil.loads(b"[1e-400, -1e-400]") == [0.0, -0.0]
    assert math.copysign(1.0, jsonutil.loads(b"-1e-400")) == -1.0


def test_duplicate_keys_keep_the_last_value_in_the_first_place() -> None:
    value = jsonutil.loads(b'{"a": 1, "b": 2, "a": 3}')
    assert list(value.items()) == [("a", 3), ("b", 2)]


@pytest.mark.parametrize("check_unicode", [True, False])
def test_lone_surrogates_follow_the_check_unicode_contract(check_unicode: bool) -> None:
    for body in (rb'{"messages": [{"content": "\ud800"}]}', b'{"messages": [{"content": "\xed\xa0\x80"}]}'):
        if check_unicode:
            with pytest.raises(ProtocolError, match=r"^messages\[0\]\.content must be valid Unicode"):
                jsonutil.loads(body)
        else:
            assert jsonutil.loads(body, check_unicode=False) == {"messages": [{"content": "\ud800"}]}
    assert jsonutil.loads(rb'"\ud83d\ude00"') == "😀"  # a pair is one character, not a lone surrogate


@pytest.mark.parametrize("depth", [150, 1024, 1025, 1200, 5000])
def test_deep_nesting_parses_or_fails_exactly_as_before(depth: int) -> None:
    # orjson stops at 1024 levels, json at its C recursion limit (~1500 here): past orjson's, json decides.
    for text in ("[" * depth + "]" * depth, nested(depth)):
        assert_loads_agrees(text)
        assert_loads_agrees(text.encode())
    with pytest.raises(ProtocolError, match=f"must not nest deeper than {jsonutil.MAX_DEPTH} levels"):
        jsonutil.loads("[" * 5000 + "]" * 5000)


def test_bytes_that_are_not_utf_8_are_refused_as_before() -> None:
    with pytest.raises(InvalidJSONError, match=r"^request body must be valid JSON \(UTF-8\)$"):
        jsonutil.loads(b'{"a": "caf\xe9"}')
    assert jsonutil.loads('{"a": "é"}'.encode("utf-16")) == {"a": "é"}  # json detects UTF-16; so do we
    assert jsonutil.loads(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # and a UTF-8 BOM on bytes


def test_what_json_loads_refuses_to_read_stays_refused() -> None:
    for data in (memoryview(b"[1]"), None, 1):
        assert outcome(lambda d=data: jsonutil.loads(d)) == outcome(
            lambda d=data: jsonutil._json_loads(d, check_unicode=True)
        )
    with pytest.raises(TypeError, match="not memoryview"):
        jsonutil.loads(memoryview(b"[1]"))  # type: ignore[arg-type]


CHAT = {
    "model": "agent",
    "messages": [{"role": "system", "content": "Be brief."}]
    + [{"role": "user", "content": f"What is {n} + {n}?"} for n in range(4)],
    "temperature": 1.0,
    "top_p": 0.95,
    "max_tokens": 512,
}


def test_ordinary_bodies_never_reach_the_json_module(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError("the json module was asked")

    monkeypatch.setattr(jsonutil, "_json_loads", refuse)
    monkeypatch.setattr(jsonutil, "_json_dumps", refuse)
    body = json.dumps(CHAT, ensure_ascii=False)
    assert jsonutil.loads(body) == CHAT
    assert jsonutil.loads(body.encode(), check_unicode=False) == CHAT
    assert jsonutil.loads(rb'{"emoji": "\ud83d\ude00", "x": -0.5e-3, "n": -922337203685477580}')
    assert json.loads(jsonutil.dumps(CHAT)) == CHAT


# ---- dumps: values meant to find every difference --------------------------------------------------------


class Level(enum.IntEnum):
    LOW = 1


class Role(enum.StrEnum):
    USER = "user"


class Color(enum.Enum):  # no JSON type underneath: json refuses it, orjson writes its value
    RED = 1


class Weight(float, enum.Enum):
    HALF = 0.5


class Text(str):
    pass


class Number(int):
    pass


class Ratio(float):
    pass


class Renamed(dict[str, Any]):
    """json.dumps encodes what items() gives; orjson reads the dict itself."""

    def items(self) -> Any:
        return [(f"renamed_{k}", v) for k, v in super().items()]


@dataclasses.dataclass
class Point:
    x: int = 1


NON_JSON = [
    Color.RED, uuid.UUID(int=7), Point(), datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 3, 4),
    b"bytes", {1, 2}, orjson.Fragment(b"[1]"), Ratio(0.25), Text("t"), Number(5), Weight.HALF,
]  # fmt: skip
dumps_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()  # NaN and the infinities included
    | st.text(max_size=6)  # lone surrogates included
    | st.sampled_from([Level.LOW, Role.USER, -0.0, 1e-7, 1e16, 2**64, -(2**63) - 1, *NON_JSON])
)
dumps_keys = st.text(max_size=4) | st.sampled_from([1, 2.5, True, None, Role.USER, Text("k"), "\udc80"])
dumps_values = st.recursive(
    dumps_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        | st.dictionaries(dumps_keys, inner, max_size=3)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3).map(collections.OrderedDict)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3).map(Renamed)
    ),
    max_leaves=12,
)


def has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(has_float(k) or has_float(v) for k, v in value.items())
    return isinstance(value, (list, tuple)) and any(has_float(v) for v in value)


@settings(max_examples=300)
@given(dumps_values)
def test_dumps_gives_what_the_json_module_gives(value: Any) -> None:
    try:
        expected = jsonutil._json_dumps(value)
    except Exception:  # noqa: BLE001 - compared below
        # The same refusal: class, message (a lone surrogate's names the field), nothing chained.
        assert outcome(lambda: jsonutil.dumps(value)) == outcome(lambda: jsonutil._json_dumps(value))
        return
    encoded = jsonutil.dumps(value)
    # Read back by json itself: the same value, down to the types and -0.0; compact UTF-8 as json writes
    # it, the same bytes but for how a float is spelled (orjson: 1e-7, json: 1e-07).
    assert exact(json.loads(encoded)) == exact(json.loads(expected))
    encoded.decode("utf-8")
    if not has_float(value):
        assert encoded == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_json_values_round_trip_through_dumps_and_loads(value: Any) -> None:
    try:
        encoded = jsonutil.dumps(value)
    except ProtocolError:  # a lone surrogate, refused as before
        assert jsonutil.unencodable_path(value) is not None
        return
    assert exact(jsonutil.loads(encoded)) == exact(value)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused_though_orjson_writes_null(bad: float) -> None:
    value = {"reward": 1.0, "metrics": {"loss": [0.5, bad]}, "note": None}
    assert orjson.dumps(value).endswith(b'null]},"note":null}')  # why dumps reads its bytes back
    with pytest.raises(ValueError, match=r"^Out of range float values are not JSON compliant") as info:
        jsonutil.dumps(value)
    assert type(info.value) is ValueError
    assert outcome(lambda: jsonutil.dumps(value)) == outcome(lambda: jsonutil._json_dumps(value))


def test_lone_surrogates_are_refused_naming_the_field() -> None:
    for value, where in (({"a": [1, "x\ud800"]}, "a[1]"), ({"a": {"\udc80": 1}}, "a key")):
        with pytest.raises(ProtocolError, match=rf"^{re_escape(where)} must be valid Unicode"):
            jsonutil.dumps(value)


def re_escape(text: str) -> str:
    return text.replace("[", r"\[").replace("]", r"\]")


def test_what_orjson_refuses_is_encoded_as_json_encodes_it() -> None:
    assert (
        jsonutil.dumps({"n": 2**64, "m": -(2**63) - 1})
        == b'{"n":18446744073709551616,"m":-9223372036854775809}'
    )
    assert jsonutil.dumps({1: "a", 2.5: "b", False: "c", None: "d", Role.USER: "e"}) == (
        b'{"1":"a","2.5":"b","false":"c","null":"d","user":"e"}'
    )
    assert jsonutil.dumps([Level.LOW, Role.USER, Text("t"), Number(5), Ratio(0.25), Weight.HALF]) == (
        b'[1,"user","t",5,0.25,0.5]'
    )
    assert jsonutil.dumps(Renamed(a=1)) == b'{"renamed_a":1}'
    assert jsonutil.dumps({"t": (1, [2, (3,)])}) == b'{"t":[1,[2,[3]]]}'
    deep: Any = 1
    for _ in range(300):  # past orjson's 254 levels
        deep = [deep]
    assert jsonutil.dumps(deep) == b"[" * 300 + b"1" + b"]" * 300


@pytest.mark.parametrize("value", NON_JSON[:8], ids=lambda v: type(v).__name__)
def test_what_json_refuses_stays_refused_though_orjson_encodes_some(value: Any) -> None:
    with pytest.raises(TypeError, match="is not JSON serializable"):
        jsonutil.dumps({"x": [value]})
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(ValueError, match=r"^Circular reference detected$"):
        jsonutil.dumps(circular)


def test_canonical_stays_the_json_modules_bytes() -> None:
    # Fingerprints compare canonical() across processes and restarts: its bytes must not change.
    assert jsonutil.canonical({"b": 1e-7, "a": [1e16, -0.0]}) == b'{"a":[1e+16,-0.0],"b":1e-07}'


@settings(max_examples=300)
@given(json_texts, st.sampled_from(MUTATIONS))
def test_what_loads_read_is_encoded_alike_without_the_read_back(text: str, how: str) -> None:
    """dumps(parsed=True), for values loads() returned: what json would write, or the same refusal."""
    try:
        value = jsonutil.loads(mutate(text, how, 0), check_unicode=False)
    except ProtocolError:
        return
    try:
        quick = jsonutil.dumps(value, parsed=True)
    except Exception:  # noqa: BLE001 - compared below
        assert outcome(lambda: jsonutil.dumps(value, parsed=True)) == outcome(lambda: jsonutil.dumps(value))
        return
    assert exact(json.loads(quick)) == exact(value) == exact(json.loads(jsonutil.dumps(value)))


def test_parsed_is_a_promise_the_caller_keeps() -> None:
    """What the read-back catches is not looked for: a NaN that could never come out of loads() is written
    as orjson writes it. The bridge passes parsed=True only for a body loads() read."""
    assert jsonutil.dumps({"x": math.nan}, parsed=True) == b'{"x":null}'
    with pytest.raises(ValueError, match="Out of range float"):
        jsonutil.dumps({"x": math.nan})


@settings(max_examples=300)
@given(json_texts, st.sampled_from(MUTATIONS), st.sampled_from(["", *SPECIAL_NUMBERS]))
def test_loads_as_json_reads_what_json_loads_reads(text: str, how: str, special: str) -> None:
    """NaN, Infinity and 1e400 included (json.loads reads them); not JSON at all: a ValueError either way."""
    data = mutate(f"[{special}, {text}]" if special else text, how, 0).encode("utf-8", "surrogatepass")
    try:
        expected = json.loads(data)
    except ValueError:
        with pytest.raises(ValueError):
            jsonutil.loads_as_json(data)
        return
    got = jsonutil.loads_as_json(data)
    assert repr(exact(got)) == repr(exact(expected))  # repr: nan != nan
