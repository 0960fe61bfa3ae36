"""Property tests of the relax-nemo-gym/v1 wire types: round trips through the converter and through JSON
text, and rejection of mutated create bodies (always a ProtocolError naming the field, never a 500)."""

from __future__ import annotations

import copy
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relax_gym_core.errors import InvalidJSONError, ProtocolError
from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CleanupState,
    CreateTrialRequest,
    EnvironmentRef,
    ErrorBody,
    Generation,
    InterruptPolicy,
    ModelEndpoint,
    ServiceHealth,
    SessionInfo,
    TrialSnapshot,
    TrialStatus,
    jsonutil,
    parse_create_request,
    parse_snapshot,
    request_to_wire,
    structure,
    unstructure,
)
from relax_gym_core.protocol.types import FORBIDDEN_HEADERS, REQUEST_ID_MAX_LEN

# ---- strategies ---------------------------------------------------------------------------------------

REQUEST_ID_CHARS = string.ascii_letters + string.digits + "._~-"
TOKEN_CHARS = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"

request_ids = st.text(REQUEST_ID_CHARS, min_size=1, max_size=REQUEST_ID_MAX_LEN)
non_blank = st.text(min_size=1, max_size=16).filter(str.strip)
# What an HTTP header value carries unchanged: the wire types refuse anything else (naming the field).
header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=16)
api_keys = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=16)
key_prefixes = st.sampled_from(["Bearer ", "Token ", "", "Key\t"])
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
positive_floats = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)
json_ints = st.integers(min_value=-(2**64), max_value=2**64)
json_scalars = st.none() | st.booleans() | json_ints | finite_floats | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=3)
flat_objects = st.dictionaries(st.text(max_size=6), json_scalars, max_size=3)  # cheaper to generate
header_names = st.text(TOKEN_CHARS, min_size=1, max_size=12).filter(
    lambda n: n.lower() not in FORBIDDEN_HEADERS
)
hosts = st.builds(
    "{}{}{}".format,
    st.sampled_from(string.ascii_lowercase),
    st.text(string.ascii_lowercase + string.digits + "-", max_size=10),
    st.sampled_from(["", ".local", ".example.com", "-1.internal"]),
)
base_urls = st.builds(
    "{}://{}{}{}".format,
    st.sampled_from(["http", "https"]),
    hosts,
    st.sampled_from(["", ":8000", ":443"]),
    st.sampled_from(["", "/", "/v1", "/api/v1/"]),
)

sessions = st.builds(
    SessionInfo,
    session_id=non_blank,
    group_id=non_blank,
    rollout_mode=non_blank,
    attempt=st.integers(min_value=1, max_value=2**40),
)
environments = st.builds(EnvironmentRef, name=non_blank, config=non_blank, task=json_objects)
generations = st.builds(Generation, responses_create_params=flat_objects, sampling_params=flat_objects)


@st.composite
def model_endpoints(draw: st.DrawFn) -> ModelEndpoint:
    api_key_header = draw(header_names)
    headers = draw(
        st.dictionaries(
            header_names.filter(lambda name: name.lower() != api_key_header.lower()), header_text, max_size=3
        )
    )
    return ModelEndpoint(
        base_url=draw(base_urls),
        api_key=draw(api_keys),
        model=draw(non_blank),
        api_key_header=api_key_header,
        api_key_prefix=draw(key_prefixes),
        headers=headers,
    )


create_requests = st.builds(
    CreateTrialRequest,
    protocol_version=st.just(PROTOCOL_VERSION),
    request_id=request_ids,
    session=sessions,
    environment=environments,
    model_endpoint=model_endpoints(),
    interrupt_policy=st.sampled_from(InterruptPolicy),
    generation=generations,
    deadline_s=positive_floats,
    lease_s=positive_floats,
    metadata=flat_objects,
)
snapshots = st.builds(
    TrialSnapshot,
    protocol_version=st.just(PROTOCOL_VERSION),
    request_id=request_ids,
    status=st.sampled_from(TrialStatus),
    reward=st.none() | finite_floats | json_ints | json_objects,
    metrics=flat_objects,
    artifact_ref=st.none() | st.text(min_size=1, max_size=20),
    error=st.none() | flat_objects,
    cleanup=st.none() | st.sampled_from(CleanupState),
)
error_bodies = st.builds(ErrorBody, detail=st.text(max_size=40))
healths = st.builds(
    ServiceHealth,
    protocol_version=st.text(max_size=20),
    service_epoch=st.text(max_size=20),
    gym_commit=st.text(max_size=20),
    config_fingerprint=st.text(max_size=20),
    trials=json_ints,
    active_trials=json_ints,
    terminal_trials=json_ints,
    janitor_healthy=st.booleans(),
    ready=st.none() | st.booleans(),
    reasons=st.lists(st.text(max_size=20), max_size=3),
    evicted_trials=json_ints,
)
wire_values = st.one_of(
    create_requests,
    sessions,
    environments,
    model_endpoints(),
    generations,
    snapshots,
    error_bodies,
    healths,
)

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- round trips --------------------------------------------------------------------------------------


@FAST
@given(wire_values)
def test_structure_inverts_unstructure(value: Any) -> None:
    data = unstructure(value)
    assert structure(data, type(value)) == value
    assert unstructure(structure(data, type(value))) == data


@FAST
@given(create_requests)
def test_create_request_round_trips_through_json_text(request: CreateTrialRequest) -> None:
    text = jsonutil.dumps(unstructure(request))
    assert parse_create_request(text) == request
    assert parse_create_request(text.decode()) == request
    # The reference serialisation omits endpoint auth defaults; parsing restores them.
    assert parse_create_request(jsonutil.dumps(request_to_wire(request))) == request


@FAST
@given(snapshots)
def test_snapshot_round_trips_through_json_text(snapshot: TrialSnapshot) -> None:
    data = jsonutil.loads(jsonutil.dumps(unstructure(snapshot)))
    assert parse_snapshot(data, request_id=snapshot.request_id) == snapshot


@FAST
@given(st.one_of(error_bodies, healths))
def test_responses_round_trip_through_json_text(value: ErrorBody | ServiceHealth) -> None:
    assert structure(jsonutil.loads(jsonutil.dumps(unstructure(value))), type(value)) == value


# ---- rejection of mutated bodies ----------------------------------------------------------------------

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]
_RAW = "\u0000raw\u0000"  # placeholder replaced in the JSON text by a non-finite token


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _nested_lists(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


bad_values = st.one_of(
    json_values,
    st.sampled_from(
        [
            10**400,
            -(10**400),
            0,
            -1,
            True,
            False,
            None,
            "",
            " ",
            "5",
            "1e999",
            "NaN",
            [],
            {},
            [1, "a", None],
            {"protocol_version": PROTOCOL_VERSION},
            "relax-nemo-gym/v2",
            "a/b",
            "x" * 300,
            "http://",
            "ftp://host/",
            "Content-Length",
            "line\nbreak",
        ]
    ),
    st.integers(min_value=1, max_value=40).map(_nested_lists),
).map(copy.deepcopy)  # fresh: mutated_bodies edits what it inserts, and the [] and {} above are shared


@st.composite
def mutated_bodies(draw: st.DrawFn) -> tuple[str, Any]:
    """(json text, data) of a valid create body with 1-3 random mutations; data is None if raw-only."""
    body: Any = unstructure(draw(create_requests))
    raw_token: str | None = None
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths[1:]))
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add_key", "non_finite"]))
        if op == "replace":
            parent[path[-1]] = draw(bad_values)
        elif op == "delete":
            del parent[path[-1]]
        elif op == "add_key":
            target = body if isinstance(parent, list) else parent
            target[draw(st.text(max_size=6))] = draw(bad_values)
        else:
            parent[path[-1]] = _RAW
            raw_token = draw(st.sampled_from(NON_FINITE))
    text = jsonutil.dumps(body).decode()
    placeholder = jsonutil.dumps(_RAW).decode()
    if raw_token is not None and placeholder in text:
        return text.replace(placeholder, raw_token), None
    return text, body


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_bodies())
def test_mutated_create_body_raises_only_protocol_error(case: tuple[str, Any]) -> None:
    text, data = case
    inputs: list[Any] = [text, text.encode()]
    if data is not None:
        inputs.append(copy.deepcopy(data))
    for body in inputs:
        try:
            request = parse_create_request(body)
        except ProtocolError as exc:
            assert str(exc)
            continue
        assert data is not None, "a non-finite number was accepted"
        # Whatever is accepted is valid wire data again.
        assert parse_create_request(jsonutil.dumps(unstructure(request))) == request


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_arbitrary_bytes_raise_only_protocol_error(body: bytes | str) -> None:
    with pytest.raises(ProtocolError):
        parse_create_request(body)


# ---- explicit examples --------------------------------------------------------------------------------


def valid_body() -> dict[str, Any]:
    return {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": "req-1",
        "session": {"session_id": "sess-secret", "group_id": "grp", "rollout_mode": "train", "attempt": 1},
        "environment": {"name": "echo", "config": "default", "task": {"prompt": "hi", "deep": {"x": [1, 2]}}},
        "model_endpoint": {"base_url": "http://trainer.local/v1", "api_key": "sk-secret", "model": "m"},
        "interrupt_policy": "protected",
        "deadline_s": 60,
        "lease_s": 30.5,
    }


def parse_error(body: Any) -> str:
    with pytest.raises(ProtocolError) as info:
        parse_create_request(body)
    return str(info.value)


def test_valid_body_parses_with_defaults() -> None:
    request = parse_create_request(jsonutil.dumps(valid_body()))
    assert request.deadline_s == 60.0
    assert isinstance(request.deadline_s, float)
    assert request.model_endpoint.api_key_header == "Authorization"
    assert request.generation == Generation()
    assert request.metadata == {}


def test_request_id_length_limit() -> None:
    body = valid_body()
    body["request_id"] = "a" * REQUEST_ID_MAX_LEN
    assert parse_create_request(body).request_id == body["request_id"]
    body["request_id"] = "a" * (REQUEST_ID_MAX_LEN + 1)
    assert "request_id" in parse_error(body)


@pytest.mark.parametrize("request_id", ["a/b", "a b", "../x", "a\nb", "a?b", "é", "", "a%2Fb"])
def test_request_id_charset(request_id: str) -> None:
    body = valid_body()
    body["request_id"] = request_id
    assert "request_id" in parse_error(body)


@pytest.mark.parametrize("token", NON_FINITE)
def test_non_finite_number_deep_in_task_is_rejected(token: str) -> None:
    body = valid_body()
    body["environment"]["task"]["deep"]["x"] = [1, _RAW]
    text = jsonutil.dumps(body).decode().replace(jsonutil.dumps(_RAW).decode(), token)
    parse_error(text)
    parse_error(text.encode())


@pytest.mark.parametrize("token", NON_FINITE)
def test_non_finite_number_in_unknown_top_level_key_is_rejected(token: str) -> None:
    text = jsonutil.dumps(valid_body()).decode()
    parse_error(text[:-1] + f',"extension":{token}}}')


def test_non_finite_float_in_structured_data_is_rejected() -> None:
    body = valid_body()
    body["environment"]["task"]["deep"]["x"] = [float("nan")]
    assert "environment.task" in parse_error(body)
    body = valid_body()
    body["deadline_s"] = float("inf")
    assert "deadline_s" in parse_error(body)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("deadline_s",), "60", "deadline_s"),
        (("lease_s",), "30", "lease_s"),
        (("deadline_s",), True, "deadline_s"),
        (("deadline_s",), 10**400, "deadline_s"),
        (("deadline_s",), 0, "deadline_s"),
        (("lease_s",), -1.0, "lease_s"),
        (("session", "attempt"), True, "session.attempt"),
        (("session", "attempt"), False, "session.attempt"),
        (("session", "attempt"), "2", "session.attempt"),
        (("session", "attempt"), 2.0, "session.attempt"),
        (("session", "attempt"), 0, "session.attempt"),
        (("session", "session_id"), 5, "session.session_id"),
        (("session", "group_id"), "   ", "session.group_id"),
        (("environment", "task"), [], "environment.task"),
        (("environment", "task"), "x", "environment.task"),
        (("environment", "name"), None, "environment.name"),
        (("model_endpoint", "base_url"), "ftp://x/", "model_endpoint.base_url"),
        (("model_endpoint", "headers"), {"X-A": 1}, "model_endpoint.headers"),
        (("model_endpoint", "headers"), {"Host": "x"}, "model_endpoint.headers"),
        (("model_endpoint", "api_key_header"), "Bad Header", "model_endpoint.api_key_header"),
        (("model_endpoint", "api_key_prefix"), "a\nb", "model_endpoint.api_key_prefix"),
        (("interrupt_policy",), "sometimes", "interrupt_policy"),
        (("interrupt_policy",), 1, "interrupt_policy"),
        (("protocol_version",), "relax-nemo-gym/v2", "protocol_version"),
        (("generation",), [], "generation"),
        (("generation",), {"sampling_params": 3}, "generation.sampling_params"),
        (("metadata",), "x", "metadata"),
        (("session",), "s", "session"),
    ],
)
def test_wrong_values_name_the_field(path: tuple[str, ...], value: Any, field: str) -> None:
    body = valid_body()
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    message = parse_error(body)
    assert field in message
    assert "sk-secret" not in message
    if not isinstance(value, float):  # same answer for the JSON text
        assert parse_error(jsonutil.dumps(body)) == message


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("session",), "session"),
        (("environment", "task"), "environment.task"),
        (("model_endpoint", "api_key"), "model_endpoint.api_key"),
        (("request_id",), "request_id"),
        (("interrupt_policy",), "interrupt_policy"),
    ],
)
def test_missing_keys_name_the_field(path: tuple[str, ...], field: str) -> None:
    body = valid_body()
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]
    message = parse_error(body)
    assert message.startswith(field)
    assert "required" in message


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe", "[1,", "{'a': 1}"])
def test_invalid_json_is_invalid_json_error(body: bytes | str) -> None:
    with pytest.raises(InvalidJSONError):
        parse_create_request(body)


@pytest.mark.parametrize("body", [b"[]", b"1", b"null", b'"x"'])
def test_non_object_body_is_rejected(body: bytes) -> None:
    assert "request" in parse_error(body)


# A deeply nested body must be a 4xx, never a RecursionError (500).
def test_deeply_nested_body_is_a_protocol_error() -> None:
    depth = 100_000
    text = jsonutil.dumps(valid_body()).decode()
    parse_error(text[:-1] + ',"extension":' + "[" * depth + "]" * depth + "}")


# The task object is level 0 and {"deep": _nested_lists(n)} adds n + 1 lists below it, so n = MAX_DEPTH - 2
# is the deepest task accepted and n = MAX_DEPTH - 1 the shallowest refused.
DEEPEST_ACCEPTED = jsonutil.MAX_DEPTH - 2


# Whatever parse_create_request accepts must serialise again (fingerprints, request_to_wire).
def test_deepest_accepted_task_can_be_serialised_again() -> None:
    body = valid_body()
    body["environment"]["task"] = {"deep": _nested_lists(DEEPEST_ACCEPTED)}
    request = parse_create_request(jsonutil.dumps(body))
    assert request.environment.task == body["environment"]["task"]
    assert parse_create_request(jsonutil.dumps(unstructure(request))) == request
    assert parse_create_request(jsonutil.dumps(request_to_wire(request))) == request
    assert jsonutil.Fingerprinter(b"k")(unstructure(request))


@pytest.mark.parametrize("lists", [DEEPEST_ACCEPTED + 1, 800])
def test_task_deeper_than_the_limit_is_refused(lists: int) -> None:
    body = valid_body()
    body["environment"]["task"] = {"deep": _nested_lists(lists)}
    message = parse_error(jsonutil.dumps(body))
    assert message.startswith("environment.task")
    assert f"nested at most {jsonutil.MAX_DEPTH} levels" in message
    assert parse_error(body) == message  # the same answer for already-parsed data


def test_snapshot_request_id_mismatch_is_rejected() -> None:
    snapshot = TrialSnapshot(protocol_version=PROTOCOL_VERSION, request_id="a", status=TrialStatus.QUEUED)
    data = unstructure(snapshot)
    assert parse_snapshot(data, request_id="a") == snapshot
    with pytest.raises(ProtocolError, match="request_id"):
        parse_snapshot(data, request_id="b")


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("reward", float("nan"), "reward"),
        ("reward", True, "reward"),
        ("reward", "1.0", "reward"),
        ("status", "done", "status"),
        ("cleanup", "maybe", "cleanup"),
        ("metrics", [], "metrics"),
        ("artifact_ref", "", "artifact_ref"),
        ("error", "boom", "error"),
    ],
)
def test_bad_snapshot_fields_are_named(key: str, value: Any, field: str) -> None:
    data = unstructure(
        TrialSnapshot(protocol_version=PROTOCOL_VERSION, request_id="a", status=TrialStatus.QUEUED)
    )
    data[key] = value
    with pytest.raises(ProtocolError) as info:
        parse_snapshot(data)
    assert field in str(info.value)


def test_secrets_stay_out_of_repr() -> None:
    body = valid_body()
    body["model_endpoint"]["headers"] = {"X-Extra": "hdr-secret"}
    request = parse_create_request(body)
    text = repr(request)
    assert "sk-secret" not in text
    assert "sess-secret" not in text
    assert "hdr-secret" not in text
