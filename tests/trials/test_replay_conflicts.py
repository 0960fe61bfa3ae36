"""A replayed create (same request_id) is the same trial only if it repeats the whole body; the one field
it may change is model_endpoint.api_key (a refreshed token, used from then on). Pinned on the book, on
the replay fingerprint, and once through the real gateway HTTP API."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from starlette.testclient import TestClient

from relax_gym_core.errors import PolicyMismatchError, TrialConflictError
from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments
from relax_gym_core.plugin.runs import RunResult
from relax_gym_core.protocol import CreateTrialRequest, Generation, InterruptPolicy
from relax_gym_core.trials.idempotency import ReplayGuard
from relax_gym_core.trials.records import Phase

from .test_book import make_book, make_request


def _session(request: CreateTrialRequest, **changes: Any) -> CreateTrialRequest:
    return attrs.evolve(request, session=attrs.evolve(request.session, **changes))


def _endpoint(request: CreateTrialRequest, **changes: Any) -> CreateTrialRequest:
    return attrs.evolve(request, model_endpoint=attrs.evolve(request.model_endpoint, **changes))


# Each changes exactly one thing a replay must repeat.
CONFLICTS: dict[str, Callable[[CreateTrialRequest], CreateTrialRequest]] = {
    "session_id": lambda r: _session(r, session_id="other-session"),
    "group_id": lambda r: _session(r, group_id="other-group"),
    "rollout_mode": lambda r: _session(r, rollout_mode="eval"),
    "attempt": lambda r: _session(r, attempt=2),
    "sampling_params": lambda r: attrs.evolve(r, generation=Generation(sampling_params={"temperature": 0.5})),
    "responses_create_params": lambda r: attrs.evolve(
        r, generation=Generation(responses_create_params={"max_output_tokens": 64})
    ),
    "base_url": lambda r: _endpoint(r, base_url="http://other-trainer.local/v1"),
    "model": lambda r: _endpoint(r, model="other-model"),
    "headers": lambda r: _endpoint(r, headers={"X-Route": "b"}),
    "api_key_header": lambda r: _endpoint(r, api_key_header="X-Api-Key"),
    "api_key_prefix": lambda r: _endpoint(r, api_key_prefix="Token "),
    "metadata": lambda r: attrs.evolve(r, metadata={"changed": True}),
}


def _base(request_id: str) -> CreateTrialRequest:
    # Carries headers, so "headers" above is a change of value, not only an addition.
    return _endpoint(make_request(request_id), headers={"X-Route": "a"})


@pytest.mark.parametrize("field", sorted(CONFLICTS))
def test_replay_differing_in_one_field_conflicts_and_changes_nothing(field: str) -> None:
    book, _ = make_book()
    original = _base("r")
    trial, _ = book.create(original)
    book.start_ready()
    with pytest.raises(TrialConflictError, match="different payload"):
        book.create(CONFLICTS[field](original))
    assert trial.request is original  # the conflicting body was not taken in
    assert book.created_total == 1
    assert book.create(original) == (trial, False)  # the original still replays


def test_replay_with_another_interrupt_policy_is_refused() -> None:
    # The registry check comes first (reference order), so this answers 400, not 409; either way the
    # body is not taken in. The fingerprint test below pins that it would conflict on its own.
    book, _ = make_book()
    original = make_request("r")
    trial, _ = book.create(original)
    with pytest.raises(PolicyMismatchError):
        book.create(attrs.evolve(original, interrupt_policy=InterruptPolicy.INTERRUPTIBLE))
    assert trial.request is original


@pytest.mark.parametrize("field", [*sorted(CONFLICTS), "interrupt_policy"])
def test_fingerprint_covers_every_field_but_the_api_key(field: str) -> None:
    guard = ReplayGuard(b"k" * 32)
    original = _base("r")
    if field == "interrupt_policy":
        changed = attrs.evolve(original, interrupt_policy=InterruptPolicy.RESUMABLE)
    else:
        changed = CONFLICTS[field](original)
    with pytest.raises(TrialConflictError):
        guard.check_replay(guard.fingerprint(original), guard.fingerprint(changed))
    guard.check_replay(guard.fingerprint(original), guard.fingerprint(_endpoint(original, api_key="sk-new")))


def test_replay_with_a_new_api_key_is_the_same_trial_and_the_new_key_is_used() -> None:
    book, _ = make_book()
    trial, _ = book.create(_base("r"))
    assert book.start_ready() == [trial]
    book.drop_task("r")  # as the service does once the run has started
    again, created = book.create(_endpoint(_base("r"), api_key="sk-refreshed"))
    assert (again, created) == (trial, False)
    assert trial.request is not None
    assert trial.request.model_endpoint.api_key == "sk-refreshed"
    assert book.live(trial.rollout_id).request is trial.request  # what the bridge forwards with
    assert book.created_total == 1


def test_api_key_replay_of_a_finished_trial_answers_it_without_reviving_the_token() -> None:
    book, _ = make_book()
    trial, _ = book.create(make_request("r"))
    book.start_ready()
    assert book.complete("r", RunResult(reward=1.0))
    again, created = book.create(make_request("r", api_key="sk-refreshed"))
    assert (again, created) == (trial, False)
    assert trial.phase is Phase.TERMINAL
    assert trial.request is None


# ---- through the gateway -------------------------------------------------------------------------------

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 2, "queue_capacity": 2}}


@pytest.fixture
def client(clock: Callable[[], float]) -> Iterator[TestClient]:
    settings = GatewaySettings(
        environments=parse_environments(json.dumps(ECHO), source="test"), scan_interval_s=0.01
    )
    with TestClient(create_app(settings, clock=clock)) as test_client:
        yield test_client


def _changed(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(body))
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return copy


WIRE_CONFLICTS = [
    (("session", "session_id"), "other-session"),
    (("session", "group_id"), "other-group"),
    (("generation",), {"sampling_params": {"temperature": 0.5}}),
    (("model_endpoint", "base_url"), "http://127.0.0.1:10/v1"),
    (("model_endpoint", "headers"), {"X-Route": "b"}),
]


def test_gateway_answers_409_to_a_changed_replay_and_202_to_a_refreshed_token(
    client: TestClient, make_body: Any
) -> None:
    body = make_body(echo={"sleep_s": 600})
    body["model_endpoint"]["headers"] = {"X-Route": "a"}
    request_id = body["request_id"]
    assert client.post("/v1/trials", json=body).status_code == 202
    for path, value in WIRE_CONFLICTS:
        answer = client.post("/v1/trials", json=_changed(body, path, value))
        assert (answer.status_code, answer.json()) == (
            409,
            {"detail": "request_id already exists with a different payload"},
        ), path
    policy = client.post("/v1/trials", json=_changed(body, ("interrupt_policy",), "interruptible"))
    assert policy.status_code == 400
    assert "interrupt_policy" in policy.json()["detail"]

    refreshed = client.post("/v1/trials", json=_changed(body, ("model_endpoint", "api_key"), "sk-refreshed"))
    assert refreshed.status_code == 202
    assert refreshed.json()["request_id"] == request_id
    book = client.app.state.gateway.service.book  # type: ignore[attr-defined]
    request = book.get(request_id).request
    assert request.model_endpoint.api_key == "sk-refreshed"
    assert request.model_endpoint.headers == {"X-Route": "a"}  # the conflicting bodies left no trace
    assert client.get("/healthz").json()["trials"] == 1
