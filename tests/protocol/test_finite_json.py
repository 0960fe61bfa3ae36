"""jsonutil.is_finite_json against its definition, written the plain recursive way: JSON types only (str
keys), finite numbers only, containers nested at most max_depth levels; subclasses count as their base."""

from __future__ import annotations

import collections
import enum
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from relax_gym_core.protocol.jsonutil import MAX_DEPTH, is_finite_json


def definition(value: Any, max_depth: int, depth: int = 0) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if not isinstance(value, (dict, list)) or depth >= max_depth:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) for k in value) and all(
            definition(v, max_depth, depth + 1) for v in value.values()
        )
    return all(definition(v, max_depth, depth + 1) for v in value)


class Level(enum.IntEnum):
    LOW = 1


class Role(enum.StrEnum):
    USER = "user"


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities included
    | st.text(max_size=5)
    | st.just(Level.LOW)
    | st.just(Role.USER)
    | st.just(b"bytes")
    | st.just((1, 2))
)
KEYS = st.text(max_size=4) | st.integers(0, 3) | st.just(Role.USER)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(KEYS, inner, max_size=3)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3).map(collections.OrderedDict)
    ),
    max_leaves=25,
)


@given(VALUES, st.integers(0, 6))
def test_it_agrees_with_the_definition(value: Any, max_depth: int) -> None:
    assert is_finite_json(value, max_depth) == definition(value, max_depth)


def nested(depth: int) -> Any:
    value: Any = 1
    for index in range(depth):
        value = [value] if index % 2 else {"k": value}
    return value


def test_the_depth_bound_is_exact_and_deep_data_does_not_recurse() -> None:
    assert is_finite_json(nested(MAX_DEPTH))
    assert not is_finite_json(nested(MAX_DEPTH + 1))
    assert not is_finite_json(nested(100_000))  # far past the interpreter's recursion limit
