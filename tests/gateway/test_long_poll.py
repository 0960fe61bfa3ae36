"""GET /v1/trials/{id}?wait_s=S, relax-gym's long poll, on a real `relax-gym serve`: it answers when the
trial changes, at once when nothing is left to change, and when shutdown begins; and POST /v1/trials?wait_s=S,
a create that answers at the trial's end (the client's side: tests/client/test_client_long_poll.py and
test_client_create_wait.py)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from relax_gym_core.client import GatewayClient
from relax_gym_core.protocol import EPOCH_HEADER, REPLAY_HEADER, WAITED_HEADER
from relax_gym_core.testing.web import GatewayProcess, start_gateway

pytestmark = pytest.mark.anyio

ECHO = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 8, "queue_capacity": 8}}
HANG_GUARD_S = 20  # well under the 30 s waits asked for: an answer that waited them all fails


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with start_gateway(ECHO) as running:
        yield running


async def create(http: httpx.AsyncClient, body: dict[str, Any]) -> None:
    assert (await http.post("/v1/trials", json=body)).status_code == 202


async def test_a_long_poll_answers_when_the_trial_changes(gateway: GatewayProcess, make_body: Any) -> None:
    body = make_body(echo={"sleep_s": 600})  # it cannot end by itself while the test runs
    trial = f"/v1/trials/{body['request_id']}"
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=60) as http:
        await create(http, body)
        while (await http.get(trial)).json()["status"] == "queued":  # noqa: ASYNC110 - a plain poll
            await asyncio.sleep(0.01)
        poll = asyncio.ensure_future(http.get(trial, params={"wait_s": 30}))
        await asyncio.sleep(0.3)
        assert not poll.done()  # a running trial that does not change is not answered
        assert (await http.post(f"{trial}/abort")).status_code == 202
        async with asyncio.timeout(HANG_GUARD_S):
            answer = await poll
    assert answer.status_code == 200 and answer.headers[WAITED_HEADER] == "1"
    assert answer.json()["status"] == "aborted"  # its next visible change (a cancel's start is none)


async def test_a_long_poll_of_a_settled_trial_answers_at_once(
    gateway: GatewayProcess, make_body: Any
) -> None:
    body = make_body()
    trial = f"/v1/trials/{body['request_id']}"
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=60) as http:
        await create(http, body)
        async with GatewayClient(gateway.url) as client:
            await client.settled(body["request_id"], timeout_s=HANG_GUARD_S)
        async with asyncio.timeout(HANG_GUARD_S):
            answer = await http.get(trial, params={"wait_s": 30})
    assert answer.json()["status"] == "completed" and answer.json()["cleanup"] == "confirmed"


async def test_a_create_asked_to_wait_answers_at_the_trials_end(
    gateway: GatewayProcess, make_body: Any
) -> None:
    body = make_body()  # an echo trial: it ends at once
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=60) as http:
        async with asyncio.timeout(HANG_GUARD_S):
            answer = await http.post("/v1/trials", json=body, params={"wait_s": 30})
        assert answer.status_code == 202 and answer.json()["status"] == "completed"
        assert answer.headers[WAITED_HEADER] == "1" and EPOCH_HEADER in answer.headers
        assert REPLAY_HEADER not in answer.headers  # it made the trial
        again = await http.post("/v1/trials", json=body)  # a retry: the same trial, found
        assert again.headers[REPLAY_HEADER] == "1" and again.json()["status"] == "completed"
        assert WAITED_HEADER not in again.headers


async def test_a_waiting_create_answers_when_the_trial_ends_before_its_wait(
    gateway: GatewayProcess, make_body: Any
) -> None:
    body = make_body(echo={"sleep_s": 600})
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=60) as http:
        create = asyncio.ensure_future(http.post("/v1/trials", json=body, params={"wait_s": 30}))
        trial = f"/v1/trials/{body['request_id']}"
        while (await http.get(trial)).status_code == 404:  # noqa: ASYNC110 - a plain poll
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert not create.done()  # a trial still running: the create waits
        assert (await http.post(f"{trial}/abort")).status_code == 202
        async with asyncio.timeout(HANG_GUARD_S):
            answer = await create
    assert answer.status_code == 202 and answer.json()["status"] == "aborted"


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("wait_s", ["-1", "30.5", "nan", "soon"])
async def test_a_wait_out_of_range_is_refused_naming_it(
    gateway: GatewayProcess, wait_s: str, method: str, make_body: Any
) -> None:
    path, body = ("/v1/trials/any-id", None) if method == "GET" else ("/v1/trials", make_body())
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False) as http:
        answer = await http.request(method, path, params={"wait_s": wait_s}, json=body)
        if body is not None:  # refused before anything was made
            assert (await http.get(f"/v1/trials/{body['request_id']}")).status_code == 404
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith("wait_s: must be a number of seconds from 0 to 30")


async def test_a_long_poll_open_when_shutdown_begins_is_answered(make_body: Any) -> None:
    body = make_body(echo={"sleep_s": 600})
    trial = f"/v1/trials/{body['request_id']}"
    with start_gateway(ECHO) as own:
        async with httpx.AsyncClient(base_url=own.url, trust_env=False, timeout=60) as http:
            await create(http, body)
            poll = asyncio.ensure_future(http.get(trial, params={"wait_s": 30}))
            await asyncio.sleep(0.3)
            assert not poll.done()
            own.process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(HANG_GUARD_S):
                answer = await poll  # without the release, uvicorn's drain would cut it off unanswered
        own.process.wait(timeout=60)
    assert answer.status_code == 200 and answer.headers[WAITED_HEADER] == "1"
    assert any("1 trial(s) aborted, 1 cleanup(s) confirmed" in line for line in own.output)
