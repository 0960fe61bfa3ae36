"""The OpenAPI document of the trial API, with JSON Schemas derived from the attrs wire types."""

from __future__ import annotations

import types
import typing
from enum import Enum
from typing import Any

import attrs

from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CreateTrialRequest,
    ErrorBody,
    ServiceHealth,
    TrialSnapshot,
)

_PRIMITIVES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}


def _schema(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    if tp in _PRIMITIVES:
        return dict(_PRIMITIVES[tp])
    if isinstance(tp, type) and issubclass(tp, Enum):
        return {"type": "string", "enum": [member.value for member in tp]}
    if isinstance(tp, type) and attrs.has(tp):
        name = tp.__name__
        if name not in components:
            components[name] = {}  # placeholder breaks recursion
            hints = typing.get_type_hints(tp)
            fields = attrs.fields(tp)
            components[name] = {
                "type": "object",
                "properties": {f.name: _schema(hints[f.name], components) for f in fields},
                "required": [f.name for f in fields if f.default is attrs.NOTHING],
            }
        return {"$ref": f"#/components/schemas/{name}"}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return {"anyOf": [_schema(arg, components) for arg in args]}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1], components)}
    if origin in (list, tuple):
        return {"type": "array", "items": _schema(args[0], components)}
    return {}


def _body(ref: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def build_openapi() -> dict[str, Any]:
    components: dict[str, Any] = {}
    create = _schema(CreateTrialRequest, components)
    snapshot = _schema(TrialSnapshot, components)
    error = _schema(ErrorBody, components)
    health = _schema(ServiceHealth, components)
    request_id = {"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}}
    errors = {
        "404": _body(error, "unknown or expired trial"),
        "422": _body(error, "invalid request"),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "relax-gym gateway", "version": PROTOCOL_VERSION},
        "paths": {
            "/v1/trials": {
                "post": {
                    "summary": "Create a trial (idempotent by request_id)",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": create}}},
                    "responses": {
                        "202": _body(snapshot, "trial snapshot"),
                        "400": _body(
                            error, "bad JSON, unregistered environment, policy or deadline mismatch"
                        ),
                        "409": _body(error, "request_id reused with a different payload"),
                        "422": _body(error, "invalid request"),
                        "429": _body(error, "environment queue is full; see Retry-After"),
                    },
                }
            },
            "/v1/trials/{request_id}": {
                "get": {
                    "summary": "Poll a trial",
                    "parameters": [request_id],
                    "responses": {"200": _body(snapshot, "trial snapshot"), **errors},
                }
            },
            "/v1/trials/{request_id}/renew": {
                "post": {
                    "summary": "Extend the trial's lease",
                    "parameters": [request_id],
                    "responses": {"204": {"description": "lease renewed"}, **errors},
                }
            },
            "/v1/trials/{request_id}/abort": {
                "post": {
                    "summary": "Abort a trial (idempotent); poll for the terminal state",
                    "parameters": [request_id],
                    "responses": {"202": _body(snapshot, "trial snapshot"), **errors},
                }
            },
            "/healthz": {
                "get": {"summary": "Liveness and counters", "responses": {"200": _body(health, "ok")}}
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness",
                    "responses": {"200": _body(health, "ready"), "503": _body(health, "not ready")},
                }
            },
        },
        "components": {"schemas": components},
    }
