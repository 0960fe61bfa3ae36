"""run_trial against an in-memory gateway: create, heartbeat, poll, stop, cancellation, 404 diagnosis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

from relax_gym_core.client import (
    ClientOptions,
    GatewayClient,
    RemoteTrialError,
    TrialCancelledError,
    TrialGoneError,
    run_trial,
)
from relax_gym_core.errors import GatewayRequestError

pytestmark = pytest.mark.anyio

SAFETY_S = 20  # only a guard against hangs; nothing is timed


@pytest.fixture
def client_for() -> Callable[..., GatewayClient]:
    def make(gateway: Any, **options: Any) -> GatewayClient:
        opts = {"poll_interval_s": 0.01, "retry_backoff_s": 0.01, **options}
        return GatewayClient(
            "http://gateway.test", options=ClientOptions(**opts), transport=gateway.transport()
        )

    return make


def blocking_handler(entered: anyio.Event, cancelled: list[bool]) -> Callable[[httpx.Request], Any]:
    async def handler(_request: httpx.Request) -> httpx.Response:
        entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(True)
        raise AssertionError("unreachable")

    return handler


async def test_terminal_on_create_needs_no_polling(
    fake_gateway: Any, client_for: Any, make_request: Any, snapshot_json: Any
) -> None:
    gateway = fake_gateway()
    request = make_request()
    done = snapshot_json(request.request_id, "completed", reward=0.5)
    gateway.script["create"] = [httpx.Response(202, json=done)]
    async with client_for(gateway) as client:
        snapshot = await run_trial(request, client=client)
    assert snapshot.reward == 0.5
    assert gateway.ops() == ["health", "create"]


async def test_polls_until_terminal_and_a_trial_shorter_than_a_renew_interval_sends_none(
    fake_gateway: Any, make_client: Any, make_request: Any
) -> None:
    gateway = fake_gateway(running_polls=3)
    request = make_request(NEMO_GYM_LEASE_S="600")  # renews every 200 s of the client's clock
    with anyio.fail_after(SAFETY_S):
        async with make_client(gateway.transport()) as client:
            snapshot = await run_trial(request, client=client)
    assert (snapshot.status.value, snapshot.reward) == ("completed", 1.0)
    ops = gateway.ops()
    assert ops[:2] == ["health", "create"]
    assert ops.count("get") == 4
    assert "renew" not in ops  # the create itself started the lease
    assert "abort" not in ops


async def test_a_create_slower_than_a_renew_interval_is_renewed_at_once(
    fake_gateway: Any, make_client: Any, make_request: Any, recorder: Any
) -> None:
    """The lease started when the create reached the gateway, no sooner than it was sent: a renew is due
    one interval after that, so at once after a slow create (the trial here ends only once renewed)."""
    gateway = fake_gateway(running_polls=0)
    gateway.complete_after_renewals = 1

    def slow_create(request: httpx.Request) -> httpx.Response:
        recorder.now += 300  # the client's clock: longer than the 200 s interval
        return gateway.default("create", request)

    gateway.script["create"] = [slow_create]
    with anyio.fail_after(SAFETY_S):  # a renew timed from after the create would come 200 s later
        async with make_client(gateway.transport()) as client:
            snapshot = await run_trial(make_request(NEMO_GYM_LEASE_S="600"), client=client)
    assert snapshot.status.value == "completed"
    assert gateway.renewals >= 1


async def test_stop_cancels_the_inflight_get_then_aborts(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway()
    entered, cancelled = anyio.Event(), []
    gateway.script["get"] = [blocking_handler(entered, cancelled)]
    stop = anyio.Event()
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client, anyio.create_task_group() as tg:

            async def press_stop() -> None:
                await entered.wait()
                stop.set()

            tg.start_soon(press_stop)
            with pytest.raises(
                TrialCancelledError, match=r"^Managed session cancelled; remote trial abort requested$"
            ):
                await run_trial(make_request(), client=client, stop=stop)
    assert cancelled == [True]
    ops = gateway.ops()
    assert ops[-1] == "abort"
    assert ops.index("get") < ops.index("abort")


async def test_stop_during_create_aborts(fake_gateway: Any, client_for: Any, make_request: Any) -> None:
    gateway = fake_gateway()
    entered, cancelled = anyio.Event(), []
    gateway.script["create"] = [blocking_handler(entered, cancelled)]
    stop = anyio.Event()
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client, anyio.create_task_group() as tg:

            async def press_stop() -> None:
                await entered.wait()
                stop.set()

            tg.start_soon(press_stop)
            with pytest.raises(TrialCancelledError):
                await run_trial(make_request(), client=client, stop=stop)
    assert cancelled == [True]
    assert gateway.ops() == ["health", "create", "abort"]


async def test_already_stopped_sends_nothing(fake_gateway: Any, client_for: Any, make_request: Any) -> None:
    gateway = fake_gateway()
    stop = anyio.Event()
    stop.set()
    async with client_for(gateway) as client:
        with pytest.raises(TrialCancelledError):
            await run_trial(make_request(), client=client, stop=stop)
    assert gateway.ops() == []


async def test_caller_cancellation_still_aborts(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway(running_polls=10**9)
    polled = anyio.Event()

    def first_poll(request: httpx.Request) -> httpx.Response:
        polled.set()
        response: httpx.Response = gateway.default("get", request)
        return response

    gateway.script["get"] = [first_poll]
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: run_trial(make_request(), client=client))
                await polled.wait()
                tg.cancel_scope.cancel()
            assert gateway.ops()[-1] == "abort"


async def test_renew_failures_are_retried_within_the_lease(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway(running_polls=0)
    gateway.complete_after_renewals = 1  # the trial only ends once a renew got through
    gateway.script["renew"] = [httpx.Response(503)] * 3 + [httpx.ConnectError("refused")] * 3
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client:
            snapshot = await run_trial(make_request(NEMO_GYM_LEASE_S="5"), client=client)
    assert snapshot.status.value == "completed"
    assert gateway.ops().count("renew") >= 7  # 6 failures, more than max_retries + 1 = 3
    assert "abort" not in gateway.ops()


async def test_a_lease_that_cannot_be_kept_gives_the_trial_up(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway(running_polls=10**9)
    gateway.script["renew"] = [httpx.ConnectError("refused")] * 10**4
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client:
            with pytest.raises(GatewayRequestError) as caught:
                await run_trial(make_request(NEMO_GYM_LEASE_S="0.5"), client=client)
    assert "Gateway renew request failed after" in str(caught.value)
    assert "the trial lease (lease_s=0.5) could not be kept" in str(caught.value)
    assert gateway.ops()[-1] == "abort"


async def test_poll_failures_are_tolerated_within_the_lease(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway(running_polls=0)
    gateway.script["get"] = [httpx.Response(502)] * 6
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client:
            snapshot = await run_trial(make_request(NEMO_GYM_LEASE_S="5"), client=client)
    assert snapshot.status.value == "completed"
    assert gateway.ops().count("get") == 7


async def test_a_poll_that_keeps_failing_ends_the_trial_despite_renewals(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway(running_polls=10**9)
    gateway.script["get"] = [httpx.Response(500)] * 10**4  # e.g. a snapshot the gateway cannot encode
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client:
            with pytest.raises(GatewayRequestError, match=r"^Gateway get request failed with HTTP 500 after"):
                await run_trial(make_request(NEMO_GYM_LEASE_S="0.5"), client=client)
    assert gateway.renewals >= 1
    assert gateway.ops()[-1] == "abort"


def not_found(gateway: Any, *, new_epoch: str | None = None, detail: str = "trial not found") -> Any:
    def handler(_request: httpx.Request) -> httpx.Response:
        if new_epoch is not None:
            gateway.epoch = new_epoch
        return httpx.Response(404, json={"detail": detail})

    return handler


@pytest.mark.parametrize("op", ["get", "renew"])
async def test_404_after_a_restart_names_the_restart(
    fake_gateway: Any, client_for: Any, make_request: Any, op: str
) -> None:
    gateway = fake_gateway(running_polls=10**9)
    gateway.script[op] = [not_found(gateway, new_epoch="epoch-2")]
    request = make_request(NEMO_GYM_LEASE_S="0.5")  # a renew within the test
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client:
            with pytest.raises(TrialGoneError) as caught:
                await run_trial(request, client=client)
    assert str(caught.value) == (
        "NeMo Gym gateway restarted (service_epoch changed); the trial was lost: "
        f"request_id={request.request_id} (HTTP 404: trial not found)"
    )
    assert caught.value.restarted
    assert "abort" not in gateway.ops()  # nothing left to abort
    assert gateway.ops().count("health") == 2


async def test_a_gateway_naming_its_epoch_is_not_probed_before_each_create_and_restarts_are_still_named(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway(names_epoch=True)
    with anyio.fail_after(SAFETY_S):
        async with client_for(gateway) as client:
            await run_trial(make_request(), client=client)
            assert gateway.ops()[:2] == ["health", "create"]  # not yet known to name it: probed
            del gateway.calls[:]
            await run_trial(make_request(), client=client)
            assert gateway.ops()[0] == "create"
            assert "health" not in gateway.ops()
            # The create's answer named epoch-1; the gateway now answering is another process.
            gateway.running_polls, gateway.gets = 10**9, 0
            gateway.script["get"] = [not_found(gateway, new_epoch="epoch-2")]
            with pytest.raises(TrialGoneError) as caught:
                await run_trial(make_request(), client=client)
    assert caught.value.restarted


async def test_404_without_restart_or_after_expiry(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway(running_polls=10**9)
    gateway.script["get"] = [not_found(gateway)]
    async with client_for(gateway) as client:
        with pytest.raises(TrialGoneError, match=r"^Remote trial not found on the gateway") as missing:
            await run_trial(make_request(), client=client)
        gateway.script["get"] = [not_found(gateway, detail="trial expired: its terminal record was evicted")]
        with pytest.raises(TrialGoneError, match=r"^Remote trial expired on the gateway") as expired:
            await run_trial(make_request(), client=client)
    assert not missing.value.restarted
    assert expired.value.expired


async def test_restart_detection_is_skipped_without_health(
    fake_gateway: Any, client_for: Any, make_request: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["health"] = [httpx.Response(404, json={"detail": "Not Found"})]
    async with client_for(gateway) as client:
        snapshot = await run_trial(make_request(), client=client)  # a gateway without /healthz still works
        gateway.script["get"] = [not_found(gateway, new_epoch="epoch-2")]
        gateway.script["health"] = [httpx.Response(404, json={"detail": "Not Found"})]
        with pytest.raises(TrialGoneError, match="not found") as caught:
            await run_trial(make_request(), client=client)
    assert snapshot.status.value == "completed"
    assert not caught.value.restarted


@pytest.mark.parametrize(
    ("final", "message"),
    [
        (
            {"status": "failed", "error": {"code": "agent_error"}},
            "Remote trial failed with error code 'agent_error'",
        ),
        (
            {"status": "aborted", "error": {"code": "aborted"}},
            "Remote trial was aborted (error code 'aborted')",
        ),
    ],
)
async def test_unsuccessful_terminal_states_raise(
    fake_gateway: Any, client_for: Any, make_request: Any, final: dict[str, Any], message: str
) -> None:
    gateway = fake_gateway(final=final)
    async with client_for(gateway) as client:
        with pytest.raises(RemoteTrialError) as caught:
            await run_trial(make_request(), client=client)
    assert str(caught.value) == message
    assert caught.value.snapshot.status.value == final["status"]
    assert "abort" not in gateway.ops()


async def test_refused_create_is_not_aborted(fake_gateway: Any, client_for: Any, make_request: Any) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [httpx.Response(409, json={"detail": "request_id already exists"})]
    async with client_for(gateway) as client:
        with pytest.raises(
            GatewayRequestError, match=r"^Gateway create request failed with HTTP 409: request_id"
        ):
            await run_trial(make_request(), client=client)
    assert gateway.ops() == ["health", "create"]  # aborting would hit someone else's trial


async def test_needs_a_gateway(make_request: Any) -> None:
    with pytest.raises(TypeError, match="gateway_url or client"):
        await run_trial(make_request())
