"""The trial API through the real Starlette app (lifespan, service, janitor), with a hand-moved clock."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments
from relax_gym_core.plugin import EnvironmentFailure
from relax_gym_core.protocol import EPOCH_HEADER
from relax_gym_core.runtimes import (
    CLEANUP_CONFIRMED,
    CLEANUP_FAILED,
    CLEANUP_UNVERIFIED,
    CleanupResult,
    RunContext,
    RunResult,
)
from relax_gym_core.trials import MemoryStore, Trial

ECHO = {"environment": "echo", "runtime": "echo", "max_concurrency": 2, "queue_capacity": 2}


def settings(specs: dict[str, Any], **extra: Any) -> GatewaySettings:
    envs = parse_environments(json.dumps(specs), source="test")
    return GatewaySettings(environments=envs, scan_interval_s=0.01, cleanup_grace_s=5, **extra)


@pytest.fixture
def app_client(clock: Callable[[], float]) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(specs: dict[str, Any] | None = None, **kwargs: Any) -> TestClient:
        extra = {k: kwargs.pop(k) for k in ("retention_s",) if k in kwargs}
        app = create_app(settings(specs or {"echo": ECHO}, **extra), clock=clock, **kwargs)
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def wait_for(
    client: TestClient, request_id: str, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Poll until the snapshot satisfies predicate (a safety timeout only; nothing is timed)."""
    stop = time.monotonic() + 30
    while True:
        snapshot: dict[str, Any] = client.get(f"/v1/trials/{request_id}").json()
        if predicate(snapshot) or time.monotonic() > stop:
            return snapshot
        time.sleep(0.005)


def terminal(snapshot: dict[str, Any]) -> bool:
    return (
        snapshot["status"] in ("completed", "truncated", "aborted", "failed")
        and snapshot["cleanup"] != "pending"
    )


def test_create_poll_complete(app_client: Any, make_body: Any) -> None:
    client = app_client()
    body = make_body(echo={"reward": 0.25})
    created = client.post("/v1/trials", json=body)
    assert created.status_code == 202
    assert created.json()["request_id"] == body["request_id"]
    done = wait_for(client, body["request_id"], terminal)
    assert done["status"] == "completed"
    assert done["reward"] == 0.25
    assert done["cleanup"] == "confirmed"
    assert set(done) == {
        "protocol_version",
        "request_id",
        "status",
        "reward",
        "metrics",
        "artifact_ref",
        "error",
        "cleanup",
    }
    health = client.get("/readyz")
    assert health.status_code == 200
    assert health.json()["active_trials"] == 0
    assert health.json()["trials"] == 1


def test_idempotent_replay_conflict_and_token_refresh(app_client: Any, make_body: Any) -> None:
    client = app_client()
    body = make_body(echo={"sleep_s": 60})
    first = client.post("/v1/trials", json=body)
    assert first.status_code == 202
    assert client.post("/v1/trials", json=body).status_code == 202
    refreshed = json.loads(json.dumps(body))
    refreshed["model_endpoint"]["api_key"] = "sk-refreshed-token"
    assert client.post("/v1/trials", json=refreshed).status_code == 202
    changed = json.loads(json.dumps(body))
    changed["deadline_s"] = 601
    conflict = client.post("/v1/trials", json=changed)
    assert conflict.status_code == 409
    assert conflict.json() == {"detail": "request_id already exists with a different payload"}
    assert client.get("/healthz").json()["trials"] == 1


def test_a_create_answer_names_the_service_epoch_of_its_gateway(app_client: Any, make_body: Any) -> None:
    """Every create answer, a replay's too: a client learns which gateway process holds the trial without
    a /healthz probe of its own (restart detection, client/trial.py)."""
    client = app_client()
    body = make_body(echo={"sleep_s": 60})
    epoch = client.get("/healthz").json()["service_epoch"]
    assert [client.post("/v1/trials", json=body).headers[EPOCH_HEADER] for _ in range(2)] == [epoch, epoch]
    restarted = app_client()  # another gateway process
    assert restarted.post("/v1/trials", json=make_body()).headers[EPOCH_HEADER] != epoch


def test_queue_full_is_429_with_retry_after(app_client: Any, make_body: Any) -> None:
    client = app_client({"echo": {**ECHO, "max_concurrency": 1, "queue_capacity": 1}})
    assert client.post("/v1/trials", json=make_body(echo={"sleep_s": 60})).status_code == 202
    assert client.post("/v1/trials", json=make_body(echo={"sleep_s": 60})).status_code == 202
    refused = client.post("/v1/trials", json=make_body())
    assert refused.status_code == 429
    assert refused.json() == {"detail": "environment queue is full"}
    assert int(refused.headers["Retry-After"]) >= 1


@pytest.mark.parametrize(
    ("raw", "status", "needle"),
    [
        ("{not json", 400, "valid JSON"),
        ('{"protocol_version": NaN}', 422, "finite"),
        ("[]", 422, "JSON object"),
    ],
)
def test_bad_bodies_are_client_errors(app_client: Any, raw: str, status: int, needle: str) -> None:
    response = app_client().post("/v1/trials", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert needle in response.json()["detail"]


def test_nan_hidden_anywhere_is_422_not_500(app_client: Any, make_body: Any) -> None:
    client = app_client()
    raw = json.dumps(make_body()).replace('"content": "hi"', '"content": NaN')
    response = client.post("/v1/trials", content=raw)
    assert response.status_code == 422
    unknown_key = json.dumps(make_body())[:-1] + ', "x_extra": {"deep": [Infinity]}}'
    assert client.post("/v1/trials", content=unknown_key).status_code == 422


def test_request_id_is_bounded(app_client: Any, make_body: Any) -> None:
    client = app_client()
    assert client.post("/v1/trials", json=make_body(request_id="r" * 257)).status_code == 422
    assert client.post("/v1/trials", json=make_body(request_id="a/b")).status_code == 422
    assert client.post("/v1/trials", json=make_body(request_id="r" * 256)).status_code == 202


def test_registry_errors(app_client: Any, make_body: Any) -> None:
    client = app_client({"echo": {**ECHO, "max_deadline_s": 100}})
    unknown = client.post("/v1/trials", json=make_body(env="nope"))
    assert (unknown.status_code, unknown.json()["detail"]) == (400, "environment/config is not registered")
    policy = client.post("/v1/trials", json=make_body(interrupt_policy="resumable"))
    assert policy.status_code == 400
    assert "interrupt_policy" in policy.json()["detail"]
    long = client.post("/v1/trials", json=make_body(deadline_s=101))
    assert (long.status_code, long.json()["detail"]) == (
        400,
        "deadline_s exceeds the registered environment maximum",
    )


def test_a_request_naming_no_config_finds_an_environments_only_config(
    app_client: Any, make_body: Any
) -> None:
    """The thin client sends config = environment when none is named (reference §5.2): an environment
    registered under one config of another name (mcqa's mcqa-v1, equivalence_rule's lc) is still found."""
    specs = {
        "mcqa-v1": {**ECHO, "environment": "mcqa"},
        "a": {**ECHO, "environment": "two"},
        "b": {**ECHO, "environment": "two"},
    }
    client = app_client(specs)
    found = client.post("/v1/trials", json=make_body(env="mcqa", config="mcqa"))
    assert found.status_code == 202, found.text
    assert client.post("/v1/trials", json=make_body(env="mcqa", config="mcqa-v1")).status_code == 202
    # Never a guess between two configs, nor a config named otherwise.
    for env, config in (("two", "two"), ("mcqa", "other")):
        refused = client.post("/v1/trials", json=make_body(env=env, config=config))
        assert (refused.status_code, refused.json()["detail"]) == (
            400,
            "environment/config is not registered",
        )


def test_errors_never_echo_secrets(app_client: Any, make_body: Any) -> None:
    client = app_client()
    body = make_body(deadline_s="soon")
    response = client.post("/v1/trials", json=body)
    assert response.status_code == 422
    assert "secret" not in response.text


def test_abort_is_idempotent_and_revokes(app_client: Any, make_body: Any) -> None:
    client = app_client()
    body = make_body(echo={"sleep_s": 60})
    client.post("/v1/trials", json=body)
    wait_for(client, body["request_id"], lambda s: s["status"] == "running")
    assert client.post(f"/v1/trials/{body['request_id']}/abort").status_code == 202
    assert client.post(f"/v1/trials/{body['request_id']}/abort").status_code == 202
    done = wait_for(client, body["request_id"], terminal)
    assert (done["status"], done["error"], done["reward"], done["cleanup"]) == (
        "aborted",
        {"code": "aborted"},
        None,
        "confirmed",
    )
    assert client.post("/v1/trials/unknown/abort").status_code == 404
    assert client.post("/v1/trials/unknown/renew").status_code == 404


def test_late_abort_cannot_overwrite_completion(app_client: Any, make_body: Any) -> None:
    client = app_client()
    body = make_body(echo={"reward": 1.0})
    client.post("/v1/trials", json=body)
    wait_for(client, body["request_id"], terminal)
    aborted = client.post(f"/v1/trials/{body['request_id']}/abort").json()
    assert (aborted["status"], aborted["reward"]) == ("completed", 1.0)


def test_deadline_and_lease_expiry(app_client: Any, make_body: Any, clock: Any) -> None:
    client = app_client()
    slow = make_body(echo={"sleep_s": 600}, deadline_s=30, lease_s=100)
    idle = make_body(echo={"sleep_s": 600}, deadline_s=300, lease_s=10)
    client.post("/v1/trials", json=slow)
    client.post("/v1/trials", json=idle)
    clock.advance(11)  # idle's lease ran out; slow's was 100 s
    expired = wait_for(client, idle["request_id"], terminal)
    assert (expired["status"], expired["error"]) == ("aborted", {"code": "lease_expired"})
    assert client.get(f"/v1/trials/{slow['request_id']}").json()["status"] == "running"
    client.post(f"/v1/trials/{slow['request_id']}/renew")
    clock.advance(20)
    truncated = wait_for(client, slow["request_id"], terminal)
    assert (truncated["status"], truncated["error"], truncated["reward"]) == (
        "truncated",
        {"code": "deadline_exceeded"},
        None,
    )


def test_agent_error_is_failed(app_client: Any, make_body: Any) -> None:
    client = app_client()
    body = make_body(echo={"fail": True})
    client.post("/v1/trials", json=body)
    done = wait_for(client, body["request_id"], terminal)
    assert (done["status"], done["error"], done["reward"]) == ("failed", {"code": "agent_error"}, None)


def test_evicted_trial_reads_as_expired(app_client: Any, make_body: Any, clock: Any) -> None:
    client = app_client(retention_s=5)
    body = make_body()
    client.post("/v1/trials", json=body)
    wait_for(client, body["request_id"], terminal)
    clock.advance(6)
    stop = time.monotonic() + 30
    while client.get(f"/v1/trials/{body['request_id']}").status_code == 200 and time.monotonic() < stop:
        time.sleep(0.005)
    gone = client.get(f"/v1/trials/{body['request_id']}")
    assert gone.status_code == 404
    assert "expired" in gone.json()["detail"]
    assert client.get("/v1/trials/never-seen").json() == {"detail": "trial not found"}
    assert client.post("/v1/trials", json=body).status_code == 409
    health = client.get("/healthz").json()
    assert (health["terminal_trials"], health["evicted_trials"]) == (0, 1)


def test_openapi_document(app_client: Any) -> None:
    document = app_client().get("/openapi.json").json()
    assert set(document["paths"]) >= {"/v1/trials", "/v1/trials/{request_id}", "/healthz", "/readyz"}
    create = document["components"]["schemas"]["CreateTrialRequest"]
    assert "request_id" in create["required"]
    assert document["components"]["schemas"]["TrialSnapshot"]["properties"]["cleanup"]


def test_unknown_route_is_json_404(app_client: Any) -> None:
    response = app_client().post("/v1/responses", json={})
    assert response.status_code == 404
    assert response.json() == {"detail": "Not Found"}


# ---- runtimes with controllable cleanup (test doubles for the run-adapter seam) ----------------------


class ScriptedHandle:
    placement: str | None = None  # no replicas

    def __init__(self, runtime: ScriptedRuntime) -> None:
        self.runtime = runtime

    async def wait(self) -> RunResult:
        await asyncio.Event().wait()  # runs until cancelled
        raise AssertionError

    async def abort(self) -> CleanupResult:
        self.runtime.calls.append("abort")
        await self.runtime.release.wait()
        return self.runtime.outcome

    async def force_cleanup(self) -> CleanupResult:
        self.runtime.calls.append("force_cleanup")
        return self.runtime.outcome

    async def probe_cleanup(self) -> CleanupResult:
        self.runtime.calls.append("probe_cleanup")
        return self.runtime.outcome


class ScriptedRuntime:
    def __init__(self, outcome: CleanupResult = CLEANUP_CONFIRMED, *, block_start: bool = False) -> None:
        self.outcome = outcome
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        self.start_gate: asyncio.Event | None = None
        self.block_start = block_start
        self.started: list[str] = []

    async def start(self, context: RunContext) -> ScriptedHandle:
        self.started.append(context.request.request_id)
        if self.block_start:
            self.start_gate = asyncio.Event()
            await self.start_gate.wait()
        return ScriptedHandle(self)

    def handle_for(self, rollout_id: str, placement: str | None = None) -> ScriptedHandle:
        del rollout_id, placement
        return ScriptedHandle(self)

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def scripted_app(app_client: Any, runtime: ScriptedRuntime, **spec: Any) -> TestClient:
    specs = {"s": {"environment": "scripted", "runtime": "scripted", **spec}}
    return app_client(specs, runtime_factories={"scripted": lambda _spec, _environment: runtime})


def test_unconfirmed_cleanup_is_failed_cleanup_error(app_client: Any, make_body: Any) -> None:
    runtime = ScriptedRuntime(CLEANUP_UNVERIFIED)
    client = scripted_app(app_client, runtime)
    body = make_body(env="scripted", config="s")
    client.post("/v1/trials", json=body)
    wait_for(client, body["request_id"], lambda s: s["status"] == "running")
    client.post(f"/v1/trials/{body['request_id']}/abort")
    done = wait_for(client, body["request_id"], terminal)
    assert done["status"] == "failed"
    assert done["error"] == {"code": "cleanup_unverified", "type": "CleanupError", "cause": "aborted"}
    assert done["cleanup"] == "unverified"
    assert runtime.calls == ["abort", "force_cleanup", "probe_cleanup"]


def test_slot_held_until_cleanup_but_queue_free(app_client: Any, make_body: Any) -> None:
    runtime = ScriptedRuntime()
    client = scripted_app(app_client, runtime, max_concurrency=1, queue_capacity=0)
    first = make_body(env="scripted", config="s")
    second = make_body(env="scripted", config="s")
    client.post("/v1/trials", json=first)
    wait_for(client, first["request_id"], lambda s: s["status"] == "running")
    runtime.release.clear()  # the first trial's remote cleanup now hangs
    client.post(f"/v1/trials/{first['request_id']}/abort")
    # Cleaning up does not count against the queue: the second trial is admitted...
    assert client.post("/v1/trials", json=second).status_code == 202
    # ...but it may not start while the first still holds the slot.
    assert client.get(f"/v1/trials/{second['request_id']}").json()["status"] == "queued"
    assert runtime.started == [first["request_id"]]
    client.portal.call(runtime.release.set)  # type: ignore[union-attr]
    wait_for(client, second["request_id"], lambda s: s["status"] == "running")
    assert runtime.started == [first["request_id"], second["request_id"]]


def test_abort_during_start_cleans_the_handle(app_client: Any, make_body: Any) -> None:
    runtime = ScriptedRuntime(block_start=True)
    client = scripted_app(app_client, runtime)
    body = make_body(env="scripted", config="s")
    client.post("/v1/trials", json=body)
    stop = time.monotonic() + 30
    while runtime.start_gate is None and time.monotonic() < stop:
        time.sleep(0.005)
    client.post(f"/v1/trials/{body['request_id']}/abort")
    assert runtime.calls == []  # cleanup waits for the start to hand over its handle
    client.portal.call(runtime.start_gate.set)  # type: ignore[union-attr]
    done = wait_for(client, body["request_id"], terminal)
    assert (done["status"], done["cleanup"]) == ("aborted", "confirmed")
    assert runtime.calls == ["abort"]


def test_shutdown_cancels_live_trials(clock: Any, make_body: Any) -> None:
    runtime = ScriptedRuntime()
    specs = {"s": {"environment": "scripted", "runtime": "scripted", "max_concurrency": 2}}
    app = create_app(
        settings(specs), clock=clock, runtime_factories={"scripted": lambda _spec, _environment: runtime}
    )
    with TestClient(app) as client:
        body = make_body(env="scripted", config="s")
        client.post("/v1/trials", json=body)
        wait_for(client, body["request_id"], lambda s: s["status"] == "running")
        trial = app.state.gateway.service.book.get(body["request_id"])
    assert runtime.calls == ["abort"]
    assert (trial.status.value, trial.error) == ("aborted", {"code": "service_shutdown"})


class FlakyStore(MemoryStore):
    """Raises on one record until told to stop: the janitor must report it and then recover."""

    def __init__(self) -> None:
        super().__init__()
        self.poisoned: str | None = None

    def get(self, request_id: str) -> Trial | None:
        if request_id == self.poisoned:
            raise RuntimeError("corrupt record")
        return super().get(request_id)


def test_one_bad_record_does_not_wedge_readiness(app_client: Any, make_body: Any, clock: Any) -> None:
    store = FlakyStore()
    client = app_client(store=store)
    bad = make_body(echo={"sleep_s": 600}, lease_s=5)
    good = make_body(echo={"sleep_s": 600}, lease_s=5)
    client.post("/v1/trials", json=bad)
    client.post("/v1/trials", json=good)
    store.poisoned = bad["request_id"]
    clock.advance(6)
    stop = time.monotonic() + 30
    ready = client.get("/readyz")
    while ready.status_code == 200 and time.monotonic() < stop:
        ready = client.get("/readyz")
    assert ready.status_code == 503
    assert any("janitor" in reason for reason in ready.json()["reasons"])
    assert wait_for(client, good["request_id"], terminal)["error"] == {"code": "lease_expired"}
    store.poisoned = None
    clock.advance(31)  # past the time an error stays reported
    while ready.status_code == 503 and time.monotonic() < stop:
        ready = client.get("/readyz")
    assert ready.status_code == 200  # recovered without a restart
    assert ready.json()["janitor_healthy"] is True


@pytest.mark.parametrize("reward", ["abc", True, [1, 2]])
def test_invalid_run_result_fails_the_trial_not_the_poll(
    app_client: Any, make_body: Any, reward: Any
) -> None:
    client = app_client()
    body = make_body(echo={"reward": reward})
    client.post("/v1/trials", json=body)
    done = wait_for(client, body["request_id"], terminal)
    assert (done["status"], done["error"], done["reward"]) == ("failed", {"code": "agent_error"}, None)


class FailingHandle(ScriptedHandle):
    async def wait(self) -> RunResult:
        raise EnvironmentFailure("the verifier crashed", kind="verifier_error")


class FailingRuntime(ScriptedRuntime):
    async def start(self, context: RunContext) -> ScriptedHandle:
        return FailingHandle(self)


def test_infrastructure_failure_keeps_its_kind_and_no_reward(app_client: Any, make_body: Any) -> None:
    client = app_client(
        {"s": {"environment": "scripted", "runtime": "scripted"}},
        runtime_factories={"scripted": lambda _spec, _environment: FailingRuntime()},
    )
    body = make_body(env="scripted", config="s")
    client.post("/v1/trials", json=body)
    done = wait_for(client, body["request_id"], terminal)
    assert (done["status"], done["reward"]) == ("failed", None)
    assert done["error"] == {"code": "agent_error", "kind": "verifier_error"}


class MixedCleanupHandle(ScriptedHandle):
    """The runtime reports a failed abort, then only 'unverified': the failure must not be forgotten."""

    async def abort(self) -> CleanupResult:
        return CLEANUP_FAILED

    async def force_cleanup(self) -> CleanupResult:
        return CLEANUP_UNVERIFIED

    async def probe_cleanup(self) -> CleanupResult:
        return CLEANUP_UNVERIFIED


class MixedCleanupRuntime(ScriptedRuntime):
    async def start(self, context: RunContext) -> ScriptedHandle:
        return MixedCleanupHandle(self)


def test_a_failed_cleanup_step_is_reported_as_failed(app_client: Any, make_body: Any) -> None:
    client = app_client(
        {"s": {"environment": "scripted", "runtime": "scripted"}},
        runtime_factories={"scripted": lambda _spec, _environment: MixedCleanupRuntime()},
    )
    body = make_body(env="scripted", config="s")
    client.post("/v1/trials", json=body)
    wait_for(client, body["request_id"], lambda s: s["status"] == "running")
    client.post(f"/v1/trials/{body['request_id']}/abort")
    done = wait_for(client, body["request_id"], terminal)
    assert (done["status"], done["cleanup"]) == ("failed", "failed")
    assert done["error"] == {"code": "cleanup_failed", "type": "CleanupError", "cause": "aborted"}
