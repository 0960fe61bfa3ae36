"""Hypothesis strategies for relax-nemo-gym/v1 values, shared by the core's tests and every plugin's.

    from relax_gym_core.testing.strategies import create_requests

    @given(create_requests(environment="workplace", config="default"))
    def test_admission(request): ...

`corrupted_rows(rows)` is what check_conversion feeds convert_row: good rows broken in the ways real
datasets break (missing or mistyped responses_create_params, a string input, stray fields).
"""

from __future__ import annotations

import copy
import string
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CleanupState,
    CreateTrialRequest,
    EnvironmentRef,
    Generation,
    InterruptPolicy,
    ModelEndpoint,
    SessionInfo,
    TrialSnapshot,
    TrialStatus,
)
from relax_gym_core.protocol.types import FORBIDDEN_HEADERS, REQUEST_ID_MAX_LEN

_REQUEST_ID_CHARS = string.ascii_letters + string.digits + "._~-"
_TOKEN_CHARS = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"


def json_scalars() -> st.SearchStrategy[Any]:
    """null, booleans, 64-bit-range integers, finite floats and short strings."""
    return (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**63)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8)
    )


def json_values(*, max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON value the wire accepts: finite numbers only, string keys, shallow enough to be quick."""
    return st.recursive(
        json_scalars(),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def json_objects(*, max_size: int = 3) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects (dicts with string keys and json_values())."""
    return st.dictionaries(st.text(max_size=8), json_values(), max_size=max_size)


def request_ids() -> st.SearchStrategy[str]:
    return st.text(_REQUEST_ID_CHARS, min_size=1, max_size=REQUEST_ID_MAX_LEN)


def _non_blank() -> st.SearchStrategy[str]:
    return st.text(min_size=1, max_size=16).filter(str.strip)


def _flat_objects() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.text(max_size=6), json_scalars(), max_size=3)


@st.composite
def model_endpoints(draw: st.DrawFn) -> ModelEndpoint:
    """Valid model endpoints: http(s) URLs, token header names, extra headers that never clash."""
    header_names = st.text(_TOKEN_CHARS, min_size=1, max_size=12).filter(
        lambda name: name.lower() not in FORBIDDEN_HEADERS
    )
    # What an HTTP header value carries unchanged (the wire types refuse anything else, naming the field).
    header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=16)
    host = draw(
        st.builds(
            "{}{}{}".format,
            st.sampled_from(string.ascii_lowercase),
            st.text(string.ascii_lowercase + string.digits + "-", max_size=10),
            st.sampled_from(["", ".local", ".example.com"]),
        )
    )
    api_key_header = draw(header_names)
    headers = draw(
        st.dictionaries(
            header_names.filter(lambda name: name.lower() != api_key_header.lower()), header_text, max_size=3
        )
    )
    return ModelEndpoint(
        base_url=f"{draw(st.sampled_from(['http', 'https']))}://{host}{draw(st.sampled_from(['', ':8000']))}"
        + draw(st.sampled_from(["", "/v1", "/api/v1/"])),
        api_key=draw(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=16)),
        model=draw(_non_blank()),
        api_key_header=api_key_header,
        api_key_prefix=draw(st.sampled_from(["Bearer ", "Token ", "", "Key\t"])),
        headers=headers,
    )


def create_requests(
    *,
    environment: str | None = None,
    config: str | None = None,
    tasks: st.SearchStrategy[dict[str, Any]] | None = None,
) -> st.SearchStrategy[CreateTrialRequest]:
    """Valid CreateTrialRequest values; pin environment/config/tasks to aim them at one environment."""
    positive = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)
    return st.builds(
        CreateTrialRequest,
        protocol_version=st.just(PROTOCOL_VERSION),
        request_id=request_ids(),
        session=st.builds(
            SessionInfo,
            session_id=_non_blank(),
            group_id=_non_blank(),
            rollout_mode=_non_blank(),
            attempt=st.integers(min_value=1, max_value=2**40),
        ),
        environment=st.builds(
            EnvironmentRef,
            name=_non_blank() if environment is None else st.just(environment),
            config=_non_blank() if config is None else st.just(config),
            task=json_objects() if tasks is None else tasks,
        ),
        model_endpoint=model_endpoints(),
        interrupt_policy=st.sampled_from(InterruptPolicy),
        generation=st.builds(
            Generation, responses_create_params=_flat_objects(), sampling_params=_flat_objects()
        ),
        deadline_s=positive,
        lease_s=positive,
        metadata=_flat_objects(),
    )


def snapshots(*, statuses: Sequence[TrialStatus] = tuple(TrialStatus)) -> st.SearchStrategy[TrialSnapshot]:
    """Valid TrialSnapshot values (any status unless `statuses` narrows it)."""
    return st.builds(
        TrialSnapshot,
        protocol_version=st.just(PROTOCOL_VERSION),
        request_id=request_ids(),
        status=st.sampled_from(statuses),
        reward=st.none()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.integers(min_value=-(2**63), max_value=2**63)
        | json_objects(),
        metrics=_flat_objects(),
        artifact_ref=st.none() | st.text(min_size=1, max_size=20),
        error=st.none() | _flat_objects(),
        cleanup=st.none() | st.sampled_from(CleanupState),
    )


# ---- dataset rows ----------------------------------------------------------------------------------------

_NOT_A_LIST = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12), json_objects())
_NOT_AN_OBJECT = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=12), st.lists(json_values())
)


@st.composite
def _corrupt(draw: st.DrawFn, row: Mapping[str, Any]) -> dict[str, Any]:
    broken = copy.deepcopy(dict(row))
    params = broken.get("responses_create_params")
    kind = draw(
        st.sampled_from(
            [
                "drop_params",
                "params_not_object",
                "drop_input",
                "input_not_list",
                "input_items",
                "drop_field",
                "field_value",
                "param_value",
            ]
        )
    )
    if kind == "drop_params":
        broken.pop("responses_create_params", None)
    elif kind == "params_not_object":
        broken["responses_create_params"] = draw(_NOT_AN_OBJECT)
    elif kind == "drop_input" and isinstance(params, dict):
        params.pop("input", None)
    elif kind == "input_not_list" and isinstance(params, dict):
        params["input"] = draw(_NOT_A_LIST)
    elif kind == "input_items" and isinstance(params, dict):
        params["input"] = draw(st.lists(json_values(), max_size=3))
    elif kind == "drop_field" and broken:
        broken.pop(draw(st.sampled_from(sorted(broken))))
    elif kind == "param_value" and isinstance(params, dict):
        params[draw(st.sampled_from([*sorted(params), "tools", "instructions"]))] = draw(json_values())
    else:  # field_value, or a kind that does not apply to this row
        key = draw(st.sampled_from([*sorted(broken), "question", "expected_answer", "problem_statement"]))
        broken[key] = draw(json_values())
    return broken


def corrupted_rows(rows: Sequence[Mapping[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Raw NeMo Gym rows taken from `rows` and broken in one way each (a fresh deep copy every time)."""
    if not rows:
        raise ValueError("corrupted_rows needs at least one good row to corrupt")
    return st.sampled_from(list(rows)).flatmap(_corrupt)


__all__ = [
    "corrupted_rows",
    "create_requests",
    "json_objects",
    "json_scalars",
    "json_values",
    "model_endpoints",
    "request_ids",
    "snapshots",
]
