"""A create that waits (``POST /v1/trials?wait_s=``, relax-gym's own): run_trial asks the create itself to
wait for the trial's end, up to the first renew, so a short trial costs one request; a gateway that does
not wait (the reference) is polled as before, and once it is known not to, creates stop asking. A create
that found its trial already there says so (REPLAY_HEADER), which a final status alone no longer shows.
The real gateway's side: tests/gateway/test_long_poll.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from relax_gym_core.client import GatewayClient, run_trial
from relax_gym_core.protocol import EPOCH_HEADER, REPLAY_HEADER, WAITED_HEADER, CreateTrialRequest

from .conftest import FakeGateway, snapshot_body

pytestmark = pytest.mark.anyio


def ended_create(*, replay: bool = False) -> Callable[[httpx.Request], httpx.Response]:
    """A create answered as relax-gym's gateway answers one asked to wait for a trial that ends meanwhile."""

    def answer(request: httpx.Request) -> httpx.Response:
        request_id = json.loads(request.content)["request_id"]
        headers = {EPOCH_HEADER: "epoch-1", WAITED_HEADER: "1", **({REPLAY_HEADER: "1"} if replay else {})}
        return httpx.Response(202, json=snapshot_body(request_id, "completed", reward=1.0), headers=headers)

    return answer


async def test_a_trial_that_ends_while_its_create_waits_costs_one_request(
    fake_gateway: Callable[..., FakeGateway],
    make_request: Callable[..., CreateTrialRequest],
    make_client: Callable[..., GatewayClient],
) -> None:
    gateway = fake_gateway(names_epoch=True)
    gateway.script["create"] += [ended_create(), ended_create()]
    request = make_request()
    async with make_client(gateway.transport()) as client:
        assert (await run_trial(request, client=client)).reward == 1.0
        assert not client.create_replayed
        assert (await run_trial(make_request(), client=client)).reward == 1.0
    # The first create is preceded by the epoch probe (the client has not seen this gateway name one); no
    # poll, no renew after either.
    assert gateway.ops() == ["health", "create", "create"]
    waits = {str(req.url.params.get("wait_s")) for op, req in gateway.calls if op == "create"}
    assert waits == {f"{request.lease_s / 3:g}"}  # up to the first renew: nothing renews while it waits


async def test_a_gateway_that_does_not_wait_is_polled_and_then_not_asked_again(
    fake_gateway: Callable[..., FakeGateway],
    make_request: Callable[..., CreateTrialRequest],
    make_client: Callable[..., GatewayClient],
) -> None:
    gateway = fake_gateway()  # the reference: ignores ?wait_s= on creates and on polls
    async with make_client(gateway.transport()) as client:
        for _ in range(2):
            gateway.gets = 0
            assert (await run_trial(make_request(), client=client)).reward == 1.0
    creates = [req.url.params.get("wait_s") for op, req in gateway.calls if op == "create"]
    assert creates[0] is not None and creates[1] is None  # its first poll showed it never waits
    assert gateway.ops().count("get") == 4  # each trial polled to its end: "running", then "completed"


@pytest.mark.parametrize(
    ("headers", "status", "replayed"),
    [
        ({WAITED_HEADER: "1"}, "completed", False),  # a new trial that ended while its create waited
        ({WAITED_HEADER: "1", REPLAY_HEADER: "1"}, "completed", True),
        ({REPLAY_HEADER: "1"}, "running", True),  # a retried create of a trial still running
        ({}, "completed", True),  # a gateway that never waits: final at once means it was there
        ({}, "running", False),
    ],
)
async def test_a_create_says_whether_it_found_its_trial_already_there(
    headers: dict[str, str], status: str, replayed: bool, make_request: Callable[..., CreateTrialRequest]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = snapshot_body(json.loads(request.content)["request_id"], status)
        return httpx.Response(202, json=body, headers=headers)

    async with GatewayClient("http://gateway.test", transport=httpx.MockTransport(handler)) as client:
        await client.create(make_request(), wait_s=5)
        assert client.create_replayed is replayed
