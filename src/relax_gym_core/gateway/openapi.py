"""The OpenAPI document of this gateway: every route, every answer it can give, and the wire types' rules.

Schemas are derived from the attrs wire types (relax_gym_core.protocol.types): field types, required
fields, enums, and each field's rule from its `json_schema` metadata, the same pattern or bound its
validator checks. The document describes this gateway as configured: its registered environments, its
callback allowlist (the create example calls back to an allowed host), its body caps, whether the trial
API needs a token, and whether unknown keys are refused. A fuzzer driven by it can create trials.
"""

from __future__ import annotations

import ipaddress
import types
import typing
from enum import Enum
from typing import Any

import attrs

from relax_gym_core.bridge.routes import RESOURCES
from relax_gym_core.gateway.config import GatewaySettings
from relax_gym_core.gateway.trajectory_api import ANSWER_BUDGET
from relax_gym_core.protocol import (
    BRIDGE_PREFIX,
    EPOCH_HEADER,
    MAX_TRAJECTORY_IDS,
    MAX_WAIT_S,
    PROTOCOL_VERSION,
    REPLAY_HEADER,
    ROLLOUT_TAG,
    WAITED_HEADER,
    CreateTrialRequest,
    ErrorBody,
    ServiceHealth,
    TrialSnapshot,
)
from relax_gym_core.protocol.types import REQUEST_ID_RULE, SCHEMA

_PRIMITIVES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}
_JSON = "application/json"


class _Schemas:
    """JSON Schemas of wire types, collected as components; `extra` adds rules this gateway imposes."""

    def __init__(self, *, closed: bool, extra: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.components: dict[str, Any] = {}
        self._closed = closed  # unknown keys refused: objects admit no other properties
        self._extra = extra

    def of(self, tp: Any) -> dict[str, Any]:
        if tp in _PRIMITIVES:
            return dict(_PRIMITIVES[tp])
        if isinstance(tp, type) and issubclass(tp, Enum):
            return {"type": "string", "enum": [member.value for member in tp]}
        if isinstance(tp, type) and attrs.has(tp):
            return self._component(tp)
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin in (types.UnionType, typing.Union):
            return {"anyOf": [self.of(arg) for arg in args]}
        if origin is dict:
            return {"type": "object", "additionalProperties": self.of(args[1])}
        if origin in (list, tuple):
            return {"type": "array", "items": self.of(args[0])}
        return {}

    def _component(self, cls: type) -> dict[str, Any]:
        name = cls.__name__
        if name not in self.components:
            self.components[name] = {}  # placeholder breaks recursion
            hints = typing.get_type_hints(cls)
            properties = {}
            for f in attrs.fields(cls):
                schema = self.of(hints[f.name])
                schema.update(f.metadata.get(SCHEMA, {}))
                schema.update(self._extra.get((name, f.name), {}))
                properties[f.name] = schema
            component: dict[str, Any] = {
                "type": "object",
                "properties": properties,
                "required": [f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING],
            }
            if self._closed and cls is not ErrorBody:
                component["additionalProperties"] = False
            self.components[name] = component
        return {"$ref": f"#/components/schemas/{name}"}


def _body(schema: dict[str, Any], description: str, media: str = _JSON) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


def _callback_example_url(settings: GatewaySettings) -> str:
    """A base_url the callback allowlist accepts, for the create example."""
    policy = settings.callback_policy
    if policy is not None and policy.hosts:
        return f"http://{sorted(policy.hosts)[0]}:9/v1"
    if policy is not None and policy.networks:
        network = policy.networks[0]
        address = network.network_address if network.num_addresses == 1 else next(network.hosts())
        host = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
        return f"http://{host}:9/v1"
    return "http://127.0.0.1:9/v1"


def _create_example(settings: GatewaySettings) -> dict[str, Any]:
    spec = settings.environments[0]
    return {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": "openapi-example-1",
        "session": {"session_id": "example-session", "group_id": "example-group", "rollout_mode": "train"},
        "environment": {
            "name": spec.environment,
            "config": spec.config,
            "task": {"messages": [{"role": "user", "content": "hello"}]},
        },
        "model_endpoint": {
            "base_url": _callback_example_url(settings),
            "api_key": "example-key",
            "model": "m",
        },
        "interrupt_policy": spec.interrupt_policy.value,
        "deadline_s": min(60.0, spec.max_deadline_s),
        "lease_s": 60,
    }


def build_openapi(settings: GatewaySettings) -> dict[str, Any]:
    specs = settings.environments
    extra: dict[tuple[str, str], dict[str, Any]] = {
        ("EnvironmentRef", "name"): {"enum": sorted({spec.environment for spec in specs})},
        ("EnvironmentRef", "config"): {"enum": sorted({spec.config for spec in specs})},
        ("CreateTrialRequest", "deadline_s"): {"maximum": max(s.max_deadline_s for s in specs)},
    }
    schemas = _Schemas(closed=settings.unknown_keys == "refuse", extra=extra)
    create = schemas.of(CreateTrialRequest)
    snapshot = schemas.of(TrialSnapshot)
    error = schemas.of(ErrorBody)
    health = schemas.of(ServiceHealth)
    too_large = _body(error, "request body over its cap (RELAX_GYM_MAX_*_BYTES)")
    guarded = settings.api_token is not None

    def trial_op(summary: str, responses: dict[str, Any], **more: Any) -> dict[str, Any]:
        op: dict[str, Any] = {"summary": summary, "responses": dict(responses), **more}
        if guarded:
            op["security"] = [{"bearer": []}]
            op["responses"]["401"] = _body(error, "missing or wrong API token (RELAX_GYM_API_TOKEN)")
        return op

    request_id = {
        "name": "request_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", **REQUEST_ID_RULE[SCHEMA]},
    }
    wait_s = {
        "name": "wait_s",
        "in": "query",
        "required": False,
        "description": "relax-gym's long poll: answer once the trial's status or cleanup changes, or after "
        f"this many seconds (the answer then carries the `{WAITED_HEADER}` header); at once if nothing is "
        "left to change. Without it, at once (relax-nemo-gym/v1).",
        "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
    }
    create_wait_s = {
        **wait_s,
        "description": "relax-gym's own: answer once the trial's status is final, or after this many seconds "
        f"(the answer then carries the `{WAITED_HEADER}` header), so a short trial needs no poll. Keep it "
        "below the lease: nothing renews it meanwhile. Without it, at once (relax-nemo-gym/v1).",
    }
    not_found = _body(error, "unknown or expired trial")
    poll_link = {
        "GetTrial": {
            "operationId": "getTrial",
            "parameters": {"request_id": "$response.body#/request_id"},
        }
    }
    paths: dict[str, Any] = {
        "/v1/trials": {
            "post": trial_op(
                "Create a trial (idempotent by request_id)",
                {
                    "202": {
                        **_body(snapshot, "trial snapshot"),
                        "links": poll_link,
                        "headers": {
                            EPOCH_HEADER: {
                                "description": "the service_epoch (GET /healthz) of the trial's gateway",
                                "schema": {"type": "string"},
                            },
                            REPLAY_HEADER: {
                                "description": "present (1) when the trial was already there: a retry, or a "
                                "replay of an earlier run's request_id",
                                "schema": {"type": "string"},
                            },
                        },
                    },
                    "400": _body(error, "bad JSON, unregistered environment, policy or deadline mismatch"),
                    "409": _body(error, "request_id reused with a different payload"),
                    "413": too_large,
                    "422": _body(error, "invalid request, or wait_s out of range (names the field)"),
                    "429": _body(error, "environment queue is full; see Retry-After"),
                    "503": _body(error, "gateway is shutting down"),
                },
                operationId="createTrial",
                parameters=[create_wait_s],
                requestBody={
                    "required": True,
                    "content": {_JSON: {"schema": create, "example": _create_example(settings)}},
                },
            )
        },
        "/v1/trials/{request_id}": {
            "get": trial_op(
                "Poll a trial",
                {
                    "200": _body(snapshot, "trial snapshot"),
                    "404": not_found,
                    "422": _body(error, "wait_s out of range"),
                },
                operationId="getTrial",
                parameters=[request_id, wait_s],
            )
        },
        "/v1/trials/{request_id}/renew": {
            "post": trial_op(
                "Extend the trial's lease",
                {"204": {"description": "lease renewed"}, "404": not_found, "413": too_large},
                parameters=[request_id],
            )
        },
        "/v1/trials/{request_id}/abort": {
            "post": trial_op(
                "Abort a trial (idempotent); poll for the terminal state",
                {"202": _body(snapshot, "trial snapshot"), "404": not_found, "413": too_large},
                parameters=[request_id],
            )
        },
        "/healthz": {"get": {"summary": "Liveness and counters", "responses": {"200": _body(health, "ok")}}},
        "/readyz": {
            "get": {
                "summary": "Readiness",
                "responses": {"200": _body(health, "ready"), "503": _body(health, "not ready")},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": _body({"type": "string"}, "exposition text", "text/plain")},
            }
        },
        "/openapi.json": {
            "get": {"summary": "This document", "responses": {"200": _body({"type": "object"}, "OpenAPI")}}
        },
    }
    if settings.trajectories:
        paths["/v1/trials/{request_id}/trajectory"] = {
            "get": trial_op(
                "The trial's run and model calls, once it has ended (format relax-gym/trajectory-v1)",
                {
                    "200": _body({"type": "object"}, "trajectory document"),
                    "404": _body(error, "unknown trial, not ended yet, expired, or no trajectory kept"),
                },
                parameters=[request_id],
            )
        }
        documents = {"type": "object", "additionalProperties": {"type": "object"}}
        paths["/v1/trajectories"] = {
            "get": trial_op(
                "Several ended trials' trajectories in one answer (relax-gym's own)",
                {
                    "200": _body(
                        {
                            "type": "object",
                            "properties": {
                                "trajectories": documents,
                                "missing": {"type": "object", "additionalProperties": {"type": "string"}},
                                "deferred": {"type": "array", "items": {"type": "string"}},
                            },
                            "required": ["trajectories", "missing", "deferred"],
                        },
                        "documents by request id; why each missing one has none; the ids left for another "
                        f"request (an answer holds up to {ANSWER_BUDGET >> 20} MiB of documents, the first "
                        "always)",
                    ),
                    "422": _body(error, f"no request_id, or more than {MAX_TRAJECTORY_IDS}"),
                },
                parameters=[
                    {
                        "name": "request_id",
                        "in": "query",
                        "required": True,
                        "style": "form",
                        "explode": True,
                        "schema": {
                            "type": "array",
                            "items": {"type": "string"},
                            "maxItems": MAX_TRAJECTORY_IDS,
                        },
                    }
                ],
            )
        }
    if settings.callback_policy is not None:
        paths.update(_model_call_paths(error, too_large, settings.limits.max_model_call_bytes))
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "relax-gym gateway", "version": PROTOCOL_VERSION},
        "paths": paths,
        "components": {"schemas": schemas.components},
    }
    if guarded:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return document


def _model_call_paths(error: dict[str, Any], too_large: dict[str, Any], cap: int) -> dict[str, Any]:
    """The bridge's routes: authorised by the trial's live rollout id, never by the API token."""
    call = {
        "type": "object",
        "description": f"an OpenAI Chat / Responses or Anthropic Messages request body (at most {cap} bytes)",
        "properties": {
            "stream": {"type": "boolean"},
            "metadata": {"type": "object", "properties": {ROLLOUT_TAG: {"type": "string"}}},
        },
    }
    answers = {
        "200": {
            "description": "the upstream model API's answer (JSON, or buffered SSE for stream: true)",
            "content": {_JSON: {"schema": {}}, "text/event-stream": {"schema": {"type": "string"}}},
        },
        "400": _body(error, "the body is not JSON"),
        "404": _body(error, "an un-prefixed call carries no rollout id in metadata." + ROLLOUT_TAG),
        "410": _body(error, "the rollout id is unknown or its trial is no longer active"),
        "413": too_large,
        "422": _body(error, "the body is not a JSON object, or holds invalid Unicode"),
        "502": _body(error, "the upstream model API failed"),
        "default": {"description": "the upstream model API's own error answer, passed through"},
    }
    rollout_id = {"name": "rollout_id", "in": "path", "required": True, "schema": {"type": "string"}}
    prefixed = f"{BRIDGE_PREFIX}{{rollout_id}}"
    paths: dict[str, Any] = {
        f"{prefixed}/api/hello": {
            "get": {
                "summary": "Base URL probe (Claude Code)",
                "parameters": [rollout_id],
                "responses": {"200": {"description": "ok"}},
            }
        }
    }
    for resource in RESOURCES:
        body = {"required": True, "content": {_JSON: {"schema": call}}}
        paths[f"{prefixed}/v1/{resource}"] = {
            "post": {
                "summary": f"Model call ({resource}) of the trial whose rollout id is in the path",
                "parameters": [rollout_id],
                "requestBody": body,
                "responses": answers,
            }
        }
        paths[f"/v1/{resource}"] = {
            "post": {
                "summary": f"Model call ({resource}) with the rollout id in metadata.{ROLLOUT_TAG}",
                "requestBody": body,
                "responses": answers,
            }
        }
    return paths
