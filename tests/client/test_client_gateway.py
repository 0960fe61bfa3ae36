"""run_trial against real `relax-gym serve` processes (echo environment)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from relax_gym_core.client import (
    ClientOptions,
    GatewayClient,
    RemoteTrialError,
    TrialGoneError,
    build_output,
    run_trial,
)
from relax_gym_core.errors import TrialFailedError
from relax_gym_core.testing.web import GatewayProcess, start_gateway

pytestmark = pytest.mark.anyio

SAFETY_S = 60  # guards against hangs only
FAST = ClientOptions(poll_interval_s=0.05, retry_backoff_s=0.05)


def echo_spec(max_concurrency: int, queue_capacity: int) -> dict[str, Any]:
    return {
        "echo": {
            "environment": "echo",
            "runtime": "echo",
            "max_concurrency": max_concurrency,
            "queue_capacity": queue_capacity,
        }
    }


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with start_gateway(echo_spec(4, 16)) as process:
        yield process


class Recorder(httpx.AsyncBaseTransport):
    """Wraps a real transport: records (op, status) and can fail or redirect requests."""

    def __init__(self, fail: Callable[[str], bool] = lambda _op: False) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.fail = fail
        self.seen: list[tuple[str, int | None]] = []
        self.redirect: httpx.URL | None = None
        self.redirect_after_create: httpx.URL | None = None
        self.refused = anyio.Event()  # set once a create was answered 429

    @staticmethod
    def op_of(request: httpx.Request) -> str:
        path = request.url.path
        if path == "/v1/trials":
            return "create"
        return path.rsplit("/", 1)[-1] if path.endswith(("/renew", "/abort")) else path.split("/")[1]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        op = self.op_of(request)
        if self.fail(op):
            self.seen.append((op, None))
            raise httpx.ConnectError("injected failure", request=request)
        if self.redirect is not None:
            request.url = request.url.copy_with(host=self.redirect.host, port=self.redirect.port)
        response = await self.inner.handle_async_request(request)
        self.seen.append((op, response.status_code))
        if op == "create" and response.status_code == 429:
            self.refused.set()
        if op == "create" and response.status_code == 202 and self.redirect_after_create is not None:
            self.redirect = self.redirect_after_create
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_trial_completes_with_the_echo_reward(gateway: GatewayProcess, make_request: Any) -> None:
    request = make_request({"reward": {"scalar": 0.75, "components": {"exact": 1}}, "sleep_s": 0.2})
    with anyio.fail_after(SAFETY_S):
        snapshot = await run_trial(request, gateway_url=gateway.url, options=FAST)
    assert snapshot.status.value == "completed"
    output = build_output(snapshot)
    assert output["metadata"]["nemo_gym"].pop("cleanup") in ("pending", "confirmed")
    assert output == {
        "reward": 0.75,
        "metadata": {
            "nemo_gym": {
                "request_id": request.request_id,
                "status": "completed",
                "metrics": {"echo": True},
                # The gateway kept the trial's trajectory: Relax's rollout logs can point at it.
                "artifact_ref": f"/v1/trials/{request.request_id}/trajectory",
                "reward_components": {"exact": 1},
            },
            "rollout_stop_reason": "completed",  # Relax's rollout logging buckets it
        },
    }


async def test_settled_waits_for_the_cleanup_verdict(
    gateway: GatewayProcess, make_request: Any, tmp_path: Any
) -> None:
    running = make_request({"sleep_s": 60}, io_dir=str(tmp_path / "running"))
    done = make_request({"reward": 0.5}, io_dir=str(tmp_path / "done"))
    async with GatewayClient(gateway.url, options=FAST) as client:
        with anyio.fail_after(SAFETY_S):
            await client.create(running)
            with pytest.raises(TimeoutError, match=running.request_id):
                await client.settled(running.request_id, timeout_s=0.2)  # still running: no verdict yet
            await client.abort(running.request_id)
            aborted = await client.settled(running.request_id, timeout_s=SAFETY_S)
            await run_trial(done, client=client)
            completed = await client.settled(done.request_id, timeout_s=SAFETY_S)
    assert (aborted.status.value, aborted.cleanup) == ("aborted", "confirmed")
    assert (completed.status.value, completed.cleanup, completed.reward) == ("completed", "confirmed", 0.5)


async def test_concurrent_trials_keep_their_own_results(
    gateway: GatewayProcess, make_request: Any, tmp_path: Any
) -> None:
    requests = [
        make_request({"reward": index / 10, "sleep_s": 0.1}, io_dir=str(tmp_path / f"io-{index}"))
        for index in range(8)
    ]
    results: dict[str, float | dict[str, Any] | None] = {}

    async def one(request: Any) -> None:
        results[request.request_id] = (await run_trial(request, gateway_url=gateway.url, options=FAST)).reward

    with anyio.fail_after(SAFETY_S):
        async with anyio.create_task_group() as tg:
            for request in requests:
                tg.start_soon(one, request)
    assert results == {request.request_id: index / 10 for index, request in enumerate(requests)}


async def test_failing_trial_reports_its_code(gateway: GatewayProcess, make_request: Any) -> None:
    with anyio.fail_after(SAFETY_S), pytest.raises(RemoteTrialError) as caught:
        await run_trial(make_request({"fail": True}), gateway_url=gateway.url, options=FAST)
    assert isinstance(caught.value, TrialFailedError)
    assert str(caught.value) == "Remote trial failed with error code 'agent_error'"
    assert caught.value.snapshot.error == {"code": "agent_error"}


async def test_ignores_proxy_variables(
    gateway: GatewayProcess, make_request: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with anyio.fail_after(SAFETY_S):
        snapshot = await run_trial(make_request({"reward": 1.0}), gateway_url=gateway.url, options=FAST)
    assert snapshot.reward == 1.0


async def test_full_queue_is_waited_out(make_request: Any, tmp_path: Any) -> None:
    with start_gateway(echo_spec(1, 0)) as busy_gateway:
        blocker = make_request({"sleep_s": 300}, io_dir=str(tmp_path / "blocker"))
        recorder = Recorder()
        with anyio.fail_after(SAFETY_S):
            async with GatewayClient(busy_gateway.url, options=FAST) as admin:
                await admin.create(blocker)  # holds the only slot; no queue behind it

                async def free_the_slot_after_a_refusal() -> None:
                    await recorder.refused.wait()
                    await admin.abort(blocker.request_id)

                async with (
                    GatewayClient(busy_gateway.url, options=FAST, transport=recorder) as client,
                    anyio.create_task_group() as tg,
                ):
                    tg.start_soon(free_the_slot_after_a_refusal)
                    snapshot = await run_trial(make_request({"reward": 0.5}), client=client)
    assert snapshot.reward == 0.5
    creates = [status for op, status in recorder.seen if op == "create"]
    assert creates[0] == 429
    assert creates[-1] == 202


async def test_renew_survives_a_transient_failure(gateway: GatewayProcess, make_request: Any) -> None:
    failures = iter(range(4))

    def fail_first_renews(op: str) -> bool:
        return op == "renew" and next(failures, None) is not None

    recorder = Recorder(fail_first_renews)
    # The run outlasts the 3 s lease: it can only complete if renews get through after the failures.
    request = make_request({"sleep_s": 4, "reward": 1.0}, NEMO_GYM_LEASE_S="3")
    with anyio.fail_after(SAFETY_S):
        async with GatewayClient(gateway.url, options=FAST, transport=recorder) as client:
            snapshot = await run_trial(request, client=client)
    assert (snapshot.status.value, snapshot.reward) == ("completed", 1.0)
    renews = [status for op, status in recorder.seen if op == "renew"]
    assert renews[:4] == [None] * 4
    assert 204 in renews[4:]
    assert ("abort", 202) not in recorder.seen


async def test_gateway_restart_is_reported(gateway: GatewayProcess, make_request: Any) -> None:
    with start_gateway(echo_spec(1, 0)) as first:
        recorder = Recorder()
        # After create the client's traffic lands on another gateway process: a restart as seen on the wire.
        recorder.redirect_after_create = httpx.URL(gateway.url)
        request = make_request({"sleep_s": 300})
        with anyio.fail_after(SAFETY_S):
            async with GatewayClient(first.url, options=FAST, transport=recorder) as client:
                with pytest.raises(TrialGoneError) as caught:
                    await run_trial(request, client=client)
    assert str(caught.value) == (
        "NeMo Gym gateway restarted (service_epoch changed); the trial was lost: "
        f"request_id={request.request_id} (HTTP 404: trial not found)"
    )
    assert caught.value.restarted
