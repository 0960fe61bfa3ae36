"""jsonutil.deep_copy: what copy.deepcopy gives for JSON-shaped data (equal, nothing mutable shared, shared
objects still shared), and copy.deepcopy itself for anything marshal refuses."""

from __future__ import annotations

import enum
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from relax_gym_core.protocol.jsonutil import deep_copy

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def containers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value, *(c for item in value.values() for c in containers(item))]
    if isinstance(value, list):
        return [value, *(c for item in value for c in containers(item))]
    return []


@given(JSON)
def test_a_copy_is_equal_and_shares_no_container_with_the_original(value: Any) -> None:
    copied = deep_copy(value)
    assert copied == value
    assert type(copied) is type(value)
    assert not {id(c) for c in containers(copied)} & {id(c) for c in containers(value)}


def test_an_object_twice_in_the_original_is_one_object_twice_in_the_copy() -> None:
    shared = {"role": "user", "content": "hi"}
    copied = deep_copy({"a": [shared], "b": [shared]})
    assert copied["a"][0] is copied["b"][0]
    assert copied["a"][0] is not shared


class Mode(enum.StrEnum):
    EVAL = "eval"


def test_what_marshal_refuses_is_deep_copied_all_the_same() -> None:
    inner = [Mode.EVAL]
    copied = deep_copy({"modes": inner})
    assert copied == {"modes": [Mode.EVAL]}
    assert copied["modes"] is not inner
    assert type(copied["modes"][0]) is Mode
