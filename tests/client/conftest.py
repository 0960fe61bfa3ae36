"""Fixtures for the thin client: an in-memory fake gateway (httpx.MockTransport) and session helpers."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest

from relax_gym_core.client import ClientOptions, ClientSettings, GatewayClient, build_create_request
from relax_gym_core.protocol import EPOCH_HEADER, CreateTrialRequest

SESSION_ID = "agentic_session_shard_0.session-0123456789abcdef0123456789abcdef"

type Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def snapshot_body(request_id: str, status: str = "running", **fields: Any) -> dict[str, Any]:
    body = {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": request_id,
        "status": status,
        "reward": None,
        "metrics": {},
        "artifact_ref": None,
        "error": None,
    }
    body.update(fields)
    return body


def health_body(epoch: str) -> dict[str, Any]:
    return {
        "protocol_version": "relax-nemo-gym/v1",
        "service_epoch": epoch,
        "gym_commit": "unknown",
        "config_fingerprint": "0" * 64,
        "trials": 0,
        "active_trials": 0,
        "terminal_trials": 0,
        "janitor_healthy": True,
    }


class FakeGateway:
    """Speaks the trial API from memory. `script[op]` queues overrides (a Response, an exception to
    raise, or a handler) consumed one per call before the default behaviour applies. Like the reference
    gateway, its create answers name no service epoch unless `names_epoch` (relax-gym's EPOCH_HEADER)."""

    def __init__(
        self,
        *,
        epoch: str = "epoch-1",
        running_polls: int = 1,
        final: dict[str, Any] | None = None,
        names_epoch: bool = False,
    ):
        self.epoch = epoch
        self.names_epoch = names_epoch
        self.running_polls = running_polls  # GETs answered "running" before the final snapshot
        self.final = final or {"status": "completed", "reward": 1.0, "metrics": {"turns": 2}}
        self.script: dict[str, list[Any]] = defaultdict(list)
        self.calls: list[tuple[str, httpx.Request]] = []
        self.gets = 0
        self.renewals = 0  # successful renews
        self.complete_after_renewals = 0  # the final snapshot also waits for this many renews
        self.request_id: str | None = None
        self.create_status = "queued"

    @staticmethod
    def op_of(request: httpx.Request) -> str:
        path = request.url.path
        if path == "/healthz":
            return "health"
        if path == "/v1/trials":
            return "create"
        if path.endswith("/renew"):
            return "renew"
        if path.endswith("/abort"):
            return "abort"
        return "get"

    def ops(self) -> list[str]:
        return [op for op, _ in self.calls]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        # Yield like a real network round trip would, so cancellation can land before the gateway sees it.
        await anyio.lowlevel.checkpoint()
        op = self.op_of(request)
        self.calls.append((op, request))
        if self.script[op]:
            item = self.script[op].pop(0)
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, httpx.Response):
                return item
            result = item(request)
            return await result if not isinstance(result, httpx.Response) else result
        return self.default(op, request)

    def default(self, op: str, request: httpx.Request) -> httpx.Response:
        if op == "health":
            return httpx.Response(200, json=health_body(self.epoch))
        if op == "create":
            self.request_id = json.loads(request.content)["request_id"]
            headers = {EPOCH_HEADER: self.epoch} if self.names_epoch else None
            body = snapshot_body(self.request_id, self.create_status)
            return httpx.Response(202, json=body, headers=headers)
        request_id = request.url.path.split("/")[3]
        if op == "renew":
            self.renewals += 1
            return httpx.Response(204)
        if op == "abort":
            return httpx.Response(202, json=snapshot_body(request_id, "running"))
        self.gets += 1
        if self.gets <= self.running_polls or self.renewals < self.complete_after_renewals:
            return httpx.Response(200, json=snapshot_body(request_id, "running"))
        return httpx.Response(200, json=snapshot_body(request_id, **self.final))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


@pytest.fixture
def fake_gateway() -> Callable[..., FakeGateway]:
    return FakeGateway


class SleepRecorder:
    """Injected into GatewayClient: records requested sleeps and moves a fake clock instead of waiting."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def recorder() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def make_client(recorder: SleepRecorder) -> Callable[..., GatewayClient]:
    """A GatewayClient over a fake transport whose sleeps and clock are the recorder's."""

    def make(
        transport: httpx.AsyncBaseTransport, *, api_token: str | None = None, **options: Any
    ) -> GatewayClient:
        return GatewayClient(
            "http://gateway.test",
            options=ClientOptions(**options),
            transport=transport,
            sleep=recorder.sleep,
            clock=recorder.clock,
            api_token=api_token,
        )

    return make


def session_environ(gateway_url: str, io_dir: str, **extra: str) -> dict[str, str]:
    return {
        "NEMO_GYM_URL": gateway_url,
        "RELAX_SESSION_ID": SESSION_ID,
        "RELAX_SESSION_IO_DIR": io_dir,
        "RELAX_BASE_URL": "http://127.0.0.1:9/agentic_api/",
        "RELAX_GROUP_ID": "train:prepare_group_7",
        "NEMO_GYM_ENVIRONMENT": "echo",
        **extra,
    }


@pytest.fixture
def make_request(tmp_path: Any) -> Callable[..., CreateTrialRequest]:
    """A create request for an echo trial, built the way the client builds it."""

    def make(
        echo: dict[str, Any] | None = None, *, io_dir: str | None = None, **env: str
    ) -> CreateTrialRequest:
        settings = ClientSettings.from_env(
            session_environ("http://gateway.test", io_dir or str(tmp_path), **env)
        )
        session_input = {"messages": [{"role": "user", "content": "hi"}], "metadata": {"echo": echo or {}}}
        return build_create_request(session_input, settings)

    return make


@pytest.fixture
def environ_for() -> Callable[..., dict[str, str]]:
    """environ_for(gateway_url, io_dir, **extra): the variables Relax (and a recipe) would set."""
    return session_environ


@pytest.fixture
def snapshot_json() -> Callable[..., dict[str, Any]]:
    return snapshot_body


@pytest.fixture
def session_id() -> str:
    return SESSION_ID
