"""Shutdown is bounded by one budget, whatever the environment's cleanup endpoints do.

The case: with cleanup endpoints that hang, shutting down took about three cleanup graces (abort, force
cleanup, probe: 92 s at the default NEMO_GYM_CLEANUP_GRACE_S of 30), past a typical 30 s kill window.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relax_gym_core.testing.web import ThreadedServer, serve_in_thread

from .conftest import SAFETY_S, gateway_with, logged


class HangingEnvironment:
    """A NeMo Gym agent whose /run and cleanup endpoints never answer (until the test ends)."""

    def __init__(self) -> None:
        self.runs = 0
        self.cleanup_calls: list[str] = []

    def app(self) -> Starlette:
        async def run(_request: Request) -> Response:
            self.runs += 1
            await asyncio.Event().wait()
            raise AssertionError

        async def cleanup(request: Request) -> Response:
            self.cleanup_calls.append(request.url.path.split("/")[1])
            await asyncio.Event().wait()
            raise AssertionError

        return Starlette(
            routes=[
                Route("/run", run, methods=["POST"]),
                Route("/abort/{rollout_id}", cleanup, methods=["POST"]),
                Route("/force/{rollout_id}", cleanup, methods=["POST"]),
                Route("/probe/{rollout_id}", cleanup, methods=["GET"]),
            ]
        )


@pytest.fixture
def hanging() -> Iterator[tuple[HangingEnvironment, ThreadedServer]]:
    environment = HangingEnvironment()
    with serve_in_thread(environment.app()) as server:
        yield environment, server


def test_hanging_cleanups_cannot_hold_shutdown_past_its_budget(
    hanging: tuple[HangingEnvironment, ThreadedServer], make_body: object
) -> None:
    environment, server = hanging
    specs = {
        "hang": {
            "environment": "hang",
            "agent_name": "simple_agent",
            "agent_url": server.url,
            "abort_url": f"{server.url}/abort/{{rollout_id}}",
            "force_cleanup_url": f"{server.url}/force/{{rollout_id}}",
            "cleanup_probe_url": f"{server.url}/probe/{{rollout_id}}",
        }
    }
    env = {"NEMO_GYM_CLEANUP_GRACE_S": "30", "RELAX_GYM_SHUTDOWN_BUDGET_S": "3"}
    with gateway_with(env, specs=specs) as gateway:
        body = make_body(env="hang", config="hang")  # type: ignore[operator]
        created = httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False, timeout=SAFETY_S)
        assert created.status_code == 202, created.text
        deadline = time.monotonic() + SAFETY_S
        while environment.runs == 0:  # the run is in flight: shutdown must abort and clean it up
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gateway.process.send_signal(signal.SIGTERM)
        # Three cleanup graces would be 90 s; the budget is 3 s. This wait fails only if it is not kept.
        gateway.process.wait(timeout=45)
        assert environment.cleanup_calls[:1] == ["abort"]
        line = logged(gateway, "shutdown: ")
        assert line is not None, gateway.output
        assert line.endswith(
            "shutdown: 1 trial(s) aborted, 0 cleanup(s) confirmed, 1 left unconfirmed "
            "(shutdown budget spent: gave up after 2 s)"
        )


def test_a_clean_shutdown_reports_confirmed_cleanups(make_body: object) -> None:
    with gateway_with({"RELAX_GYM_SHUTDOWN_BUDGET_S": "20"}) as gateway:
        body = make_body(echo={"sleep_s": 600})  # type: ignore[operator]
        created = httpx.post(f"{gateway.url}/v1/trials", json=body, trust_env=False, timeout=SAFETY_S)
        assert created.status_code == 202
        gateway.process.send_signal(signal.SIGTERM)
        gateway.process.wait(timeout=SAFETY_S)
        line = logged(gateway, "shutdown: ")
        assert line is not None, gateway.output
        assert line.endswith("shutdown: 1 trial(s) aborted, 1 cleanup(s) confirmed, 0 left unconfirmed")
