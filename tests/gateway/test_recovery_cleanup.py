"""Restart recovery against an environment that is down: real `relax-gym serve` processes and a real HTTP
environment speaking the NeMo Gym runtime's side (POST /run, the cleanup contract by rollout id). Trials
a restart ended read terminal with `cleanup: pending` while their environment cannot be reached, turn
`confirmed` once it answers (retried with back-off, by rollout id), and `unverified` when recovery
gives up; never dropped."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relax_gym_core.gym.processes import free_ports
from relax_gym_core.testing.web import ThreadedServer, start_gateway

SAFETY_S = 60.0  # guards against hangs only; nothing here is timed


class Environment:
    """A stateful environment: /run holds its rollout until released by POST /cleanup/{rollout_id}."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.runs: list[str] = []  # rollout ids, in the order their /run arrived
        self.released: list[str] = []  # rollout ids whose cleanup was posted
        self._server: ThreadedServer | None = None

    def app(self) -> Starlette:
        async def run(request: Request) -> Response:
            body: dict[str, Any] = await request.json()
            self.runs.append(f"{body['_ng_task_index']}-{body['_ng_rollout_index']}")
            await asyncio.Event().wait()  # a long agent run; its gateway goes away meanwhile
            return JSONResponse({})

        async def release(request: Request) -> Response:
            self.released.append(request.path_params["rollout_id"])
            return JSONResponse({"accepted": True})

        async def probe(request: Request) -> Response:
            rollout_id = request.path_params["rollout_id"]
            return JSONResponse({"rollout_id": rollout_id, "clean": rollout_id in self.released})

        async def ready(_request: Request) -> Response:
            return JSONResponse({})

        return Starlette(
            routes=[
                Route("/", ready),
                Route("/run", run, methods=["POST"]),
                Route("/cleanup/{rollout_id}", release, methods=["POST"]),
                Route("/cleanup/{rollout_id}", probe, methods=["GET"]),
            ]
        )

    def up(self) -> None:
        self._server = ThreadedServer(self.app(), port=self.port)
        self._server.start()

    def down(self) -> None:
        if self._server is not None:
            self._server.stop(timeout_s=10)
            self._server = None

    def specs(self) -> dict[str, Any]:
        cleanup = f"{self.url}/cleanup/{{rollout_id}}"
        return {
            "stateful": {
                "environment": "stateful",
                "agent_name": "stateful_agent",
                "agent_url": self.url,
                "abort_url": cleanup,
                "force_cleanup_url": cleanup,
                "cleanup_probe_url": cleanup,
                "max_concurrency": 4,
            }
        }


@pytest.fixture
def environment() -> Iterator[Environment]:
    (port,) = free_ports(1)
    env = Environment(port)
    env.up()
    try:
        yield env
    finally:
        env.down()


def create_body(request_id: str) -> dict[str, Any]:
    return {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": request_id,
        "session": {"session_id": "s", "group_id": "g", "rollout_mode": "train"},
        "environment": {"name": "stateful", "config": "stateful", "task": {"messages": []}},
        "model_endpoint": {"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "model": "m"},
        "interrupt_policy": "protected",
        "deadline_s": 600,
        "lease_s": 120,
    }


def wait_for(predicate: Any) -> None:
    stop = time.monotonic() + SAFETY_S
    while not predicate():
        assert time.monotonic() < stop, "condition not reached"
        time.sleep(0.02)


def run_and_kill(env: Environment, state_dir: Path, ids: list[str]) -> None:
    """Start trials on a gateway, then SIGKILL it with their runs in flight, and take the environment
    down with them."""
    with start_gateway(env.specs(), state_dir=state_dir) as gateway:
        with httpx.Client(base_url=gateway.url, trust_env=False, timeout=SAFETY_S) as http:
            for request_id in ids:
                assert http.post("/v1/trials", json=create_body(request_id)).status_code == 202
        wait_for(lambda: len(env.runs) == len(ids))
        os.kill(gateway.pid, signal.SIGKILL)  # our own gateway, by PID
        gateway.process.wait(timeout=SAFETY_S)
    env.down()


def test_cleanup_stays_pending_while_the_environment_is_down_then_is_proven_by_rollout_id(
    environment: Environment, tmp_path: Path
) -> None:
    ids = ["lost-0", "lost-1"]
    run_and_kill(environment, tmp_path / "state", ids)
    with (
        start_gateway(environment.specs(), state_dir=tmp_path / "state") as gateway,
        httpx.Client(base_url=gateway.url, trust_env=False, timeout=SAFETY_S) as http,
    ):
        for request_id in ids:
            snapshot = http.get(f"/v1/trials/{request_id}").json()
            assert (snapshot["status"], snapshot["error"]) == ("aborted", {"code": "service_restart"})
            assert snapshot["cleanup"] == "pending"  # unreachable: not proven, not dropped
        environment.up()
        wait_for(lambda: all(http.get(f"/v1/trials/{rid}").json()["cleanup"] != "pending" for rid in ids))
        assert [http.get(f"/v1/trials/{rid}").json()["cleanup"] for rid in ids] == ["confirmed"] * 2
    assert sorted(environment.released) == sorted(environment.runs)  # by the rollout ids the runs had


def test_recovery_that_gives_up_records_unverified(environment: Environment, tmp_path: Path) -> None:
    run_and_kill(environment, tmp_path / "state", ["gone-0"])
    with (
        start_gateway(
            environment.specs(), state_dir=tmp_path / "state", env={"RELAX_GYM_RECOVERY_GIVE_UP_S": "1.5"}
        ) as gateway,
        httpx.Client(base_url=gateway.url, trust_env=False, timeout=SAFETY_S) as http,
    ):
        wait_for(lambda: http.get("/v1/trials/gone-0").json()["cleanup"] != "pending")
        snapshot = http.get("/v1/trials/gone-0").json()
    assert (snapshot["status"], snapshot["error"], snapshot["cleanup"]) == (
        "aborted",
        {"code": "service_restart"},
        "unverified",
    )
    assert environment.released == []
