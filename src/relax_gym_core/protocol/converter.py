"""The one cattrs converter for relax-nemo-gym/v1, and the parse/dump functions built on it.

Structuring is strict about JSON types (no "5" for 5, no true for 1) and turns every failure into a
ProtocolError whose message names the field, never a 500.
"""

from __future__ import annotations

import functools
import typing
from enum import Enum
from typing import Any

import attrs
from cattrs import transform_error
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.gen import make_dict_structure_fn
from cattrs.preconf.json import make_converter

from relax_gym_core.errors import FieldError, ProtocolError
from relax_gym_core.protocol import jsonutil
from relax_gym_core.protocol.types import (
    CleanupState,
    CreateTrialRequest,
    InterruptPolicy,
    TrialSnapshot,
    TrialStatus,
)


class _WrongType(TypeError):
    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


def _strict(kind: type | tuple[type, ...], expected: str) -> Any:
    def hook(value: Any, _type: Any) -> Any:
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise _WrongType(expected)
        if not isinstance(value, kind):
            raise _WrongType(expected)
        return value

    return hook


converter = make_converter(omit_if_default=False)
converter.register_structure_hook(str, _strict(str, "a string"))
converter.register_structure_hook(int, _strict(int, "an integer"))
converter.register_structure_hook(bool, _strict(bool, "a boolean"))
converter.register_structure_hook(float, _strict((int, float), "a number"))


def _is(alias: Any) -> Any:
    def predicate(candidate: Any) -> bool:
        return bool(candidate == alias)

    return predicate


# Generic aliases are not classes, so they are matched by equality; validators check the contents.
for _alias, _hook in (
    (dict[str, Any], _strict(dict, "a JSON object")),
    (dict[str, str], _strict(dict, "a JSON object of strings")),
    (list[str], _strict(list, "a list of strings")),
    (
        float | dict[str, Any] | None,
        _strict((int, float, dict, type(None)), "null, a number or a JSON object"),
    ),
    (dict[str, Any] | None, _strict((dict, type(None)), "null or a JSON object")),
    (str | None, _strict((str, type(None)), "null or a string")),
    (bool | None, _strict((bool, type(None)), "null or a boolean")),
):
    converter.register_structure_hook_func(_is(_alias), _hook)


def _enum_hook(value: Any, enum_type: type[Enum]) -> Any:
    try:
        return enum_type(value)
    except (ValueError, TypeError):
        allowed = ", ".join(repr(member.value) for member in enum_type)
        raise _WrongType(f"one of {allowed}") from None


def _enum_value(member: Enum) -> Any:
    return member.value


# StrEnums are str subclasses: register them by class so the strict str hook does not take them.
for _enum in (TrialStatus, InterruptPolicy, CleanupState):
    converter.register_structure_hook(_enum, _enum_hook)
    converter.register_unstructure_hook(_enum, _enum_value)


def _attrs_hook_factory(cls: type) -> Any:
    inner: Any = make_dict_structure_fn(cls, converter)

    def hook(value: Any, type_: Any) -> Any:
        if not isinstance(value, dict):
            raise _WrongType("a JSON object")
        return inner(value, type_)

    return hook


converter.register_structure_hook_factory(attrs.has, _attrs_hook_factory)

# Free-form JSON fields (tasks, metadata, params, metrics) were checked to be finite JSON when they were
# made, so they unstructure as they are: walking them value by value cost seconds for large tasks, on the
# event loop, for every create (the replay fingerprint unstructures the request).
for _blob in (dict[str, Any], dict[str, Any] | None, float | dict[str, Any] | None):
    converter.register_unstructure_hook_func(_is(_blob), lambda value: value)


def _format(exc: BaseException, _type: Any) -> str:
    if isinstance(exc, FieldError):
        return f"{_SELF_NAMED}{exc}"
    if isinstance(exc, _WrongType):
        return f"must be {exc.expected}"
    if isinstance(exc, KeyError):
        return "is required"
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"has unknown keys: {', '.join(sorted(exc.extra_fields))}"
    return "is invalid"


_SELF_NAMED = "\x00"  # marks messages that already start with their field name


def _message(exc: BaseException, root: str) -> str:
    """First validation problem as '<field> <problem>'."""
    lines = (
        transform_error(exc, path="$", format_exception=_format)
        if isinstance(exc, (ClassValidationError, IterableValidationError))
        else [f"{_format(exc, None)} @ $"]
    )
    problem, _, path = lines[0].rpartition(" @ ")
    if problem.startswith(_SELF_NAMED):
        return problem.removeprefix(_SELF_NAMED)
    field_name = path.removeprefix("$").removeprefix(".") or root
    return f"{field_name} {problem}"


def structure[T](data: Any, cls: type[T], *, name: str = "request") -> T:
    """Structure JSON-shaped data into a wire type, or raise ProtocolError naming the field."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{name} must be a JSON object")
    try:
        return converter.structure(data, cls)
    except Exception as exc:  # noqa: BLE001 - every shape of bad input must become a 422, never a 500
        raise ProtocolError(_message(exc, name)) from None


@functools.cache
def _nested_types(cls: type) -> tuple[frozenset[str], dict[str, type]]:
    """A wire type's field names, and the fields that are wire types themselves."""
    hints = typing.get_type_hints(cls)
    names = frozenset(f.name for f in attrs.fields(cls))
    return names, {name: hints[name] for name in names if attrs.has(hints[name])}


def unknown_keys(data: Any, cls: type) -> list[str]:
    """Dotted paths of the keys in `data` that no field of `cls` (or of its nested wire types) names.

    relax-nemo-gym/v1 lets a newer client send additive fields, so structure() ignores them; callers use
    this to make a typo such as "deadline" visible. Free-form objects (task, metadata, ...) are not looked
    into.
    """
    found: list[str] = []
    stack: list[tuple[Any, type, str]] = [(data, cls, "")]
    while stack:
        value, kind, prefix = stack.pop()
        if not isinstance(value, dict):
            continue
        names, nested = _nested_types(kind)
        for key, item in value.items():
            if key not in names:
                found.append(f"{prefix}{key}")
            elif key in nested:
                stack.append((item, nested[key], f"{prefix}{key}."))
    return sorted(found)


def unstructure(value: Any) -> Any:
    return converter.unstructure(value)


def parse_create_request(body: bytes | str | Any) -> CreateTrialRequest:
    data = jsonutil.loads(body) if isinstance(body, (bytes, str)) else body
    return structure(data, CreateTrialRequest)


def parse_snapshot(body: Any, *, request_id: str | None = None) -> TrialSnapshot:
    snapshot = structure(body, TrialSnapshot, name="snapshot")
    if request_id is not None and snapshot.request_id != request_id:
        raise ProtocolError("Gateway response request_id does not match the submitted request")
    return snapshot


def request_to_wire(request: CreateTrialRequest) -> dict[str, Any]:
    """Reference serialisation: endpoint auth defaults are omitted, as the reference client does."""
    data: dict[str, Any] = converter.unstructure(request)
    endpoint = data["model_endpoint"]
    defaults = {"api_key_header": "Authorization", "api_key_prefix": "Bearer ", "headers": {}}
    for key, default in defaults.items():
        if endpoint.get(key) == default:
            del endpoint[key]
    return data
