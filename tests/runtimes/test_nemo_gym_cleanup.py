"""The NeMo Gym run adapter's cleanup verdicts, against a real HTTP server on 127.0.0.1 that records
every call: only a probe answering {"clean": true} confirms; a refused cleanup POST is cleanup_failed; a
probe that answers garbage is cleanup_probe_failed; anything else is unverified. A stateless
environment is confirmed without a single call, and so is a run whose own /run answer states its rollout
released (relax_gym_core.ingym.mark_released)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from relax_gym_core.ingym import RELEASED_KEY, rollout_id_of
from relax_gym_core.plugin.cleanup import CleanupURLs
from relax_gym_core.plugin.host import reference_environment
from relax_gym_core.plugin.runs import (
    CLEANUP_CONFIRMED,
    CLEANUP_FAILED,
    CLEANUP_PROBE_FAILED,
    CLEANUP_UNVERIFIED,
    RunContext,
    RunHandle,
)
from relax_gym_core.plugin.specs import EnvironmentSpec
from relax_gym_core.protocol import parse_create_request
from relax_gym_core.runtimes.nemo_gym import NemoGymRuntime
from relax_gym_core.testing.web import serve_in_thread

pytestmark = pytest.mark.anyio

_rollouts = itertools.count()

# What a probe URL answers, by the name in its path.
PROBE_ANSWERS: dict[str, Response] = {
    "clean": JSONResponse({"clean": True}),
    "dirty": JSONResponse({"clean": False}),
    "truthy": JSONResponse({"clean": "yes"}),  # only the JSON literal true confirms
    "absent": JSONResponse({"status": "ok"}),
    "text": PlainTextResponse("all clean"),
    "array": JSONResponse([{"clean": True}]),
    "string": JSONResponse("clean"),
    "error": JSONResponse({"clean": True}, status_code=500),  # an error status proves nothing
}
# What a cleanup POST answers, by the name in its path.
POST_STATUS = {"accept": 200, "conflict": 409, "missing": 404, "gone": 410}


class Agent:
    """A NeMo Gym agent and environment server: /run answers at once; cleanup routes as named above."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.released: dict[str, str] = {}  # rollout id -> the rollout its /run answer states released
        self.app = Starlette(
            routes=[
                Route("/run", self.run, methods=["POST"]),
                Route("/cleanup/{answer}/{rollout_id}", self.cleanup, methods=["POST"]),
                Route("/probe/{answer}/{rollout_id}", self.probe, methods=["GET"]),
            ]
        )

    async def run(self, request: Request) -> Response:
        rollout_id = rollout_id_of(await request.json())
        released = self.released.get(rollout_id or "")
        if released is None:
            return JSONResponse({"reward": 1.0})
        # As NeMo Gym's simple_agent passes on a verify answer that states a release.
        params = {"metadata": {RELEASED_KEY: released}}
        return JSONResponse({"reward": 1.0, "responses_create_params": params})

    async def cleanup(self, request: Request) -> Response:
        self.calls.append(("POST", request.url.path))
        return JSONResponse({}, status_code=POST_STATUS[request.path_params["answer"]])

    async def probe(self, request: Request) -> Response:
        self.calls.append(("GET", request.url.path))
        return PROBE_ANSWERS[request.path_params["answer"]]


@pytest.fixture(scope="module")
def agent() -> Iterator[tuple[Agent, str]]:
    server = Agent()
    with serve_in_thread(server.app) as running:
        yield server, running.url


class Run:
    """One finished run of a runtime built for the test's cleanup URLs, and the calls it caused."""

    def __init__(
        self, agent: tuple[Agent, str], make_body: Any, *, stateless: bool = False, **paths: str
    ) -> None:
        """paths: CleanupURLs field -> a path on the agent, e.g. cleanup_probe_url="/probe/clean"."""
        self.server, url = agent
        self.rollout_id = f"rollout-{next(_rollouts)}"
        urls = {key: f"{url}{path}/{{rollout_id}}" for key, path in paths.items()}
        spec = EnvironmentSpec(
            config="default",
            environment="echo",
            agent_name="agent",
            agent_url=url,
            cleanup=CleanupURLs(stateless=stateless, **urls),
        )
        self.runtime = NemoGymRuntime(spec, reference_environment("echo"))
        self.request = parse_create_request(make_body())

    async def start(self) -> RunHandle:
        context = RunContext(
            request=self.request, rollout_id=self.rollout_id, environment="echo", config="default"
        )
        handle = await self.runtime.start(context)
        assert (await handle.wait()).reward == 1.0  # a normal finish; the cleanup steps come after
        return handle

    def calls(self) -> list[tuple[str, str]]:
        """Calls that named this run's rollout id (the cleanup contract's, not /run)."""
        return [call for call in self.server.calls if self.rollout_id in call[1]]

    def path(self, kind: str, answer: str) -> str:
        return f"/{kind}/{answer}/{self.rollout_id}"


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ("clean", CLEANUP_CONFIRMED),
        ("dirty", CLEANUP_UNVERIFIED),
        ("truthy", CLEANUP_UNVERIFIED),
        ("absent", CLEANUP_UNVERIFIED),
        ("text", CLEANUP_PROBE_FAILED),
        ("array", CLEANUP_PROBE_FAILED),
        ("string", CLEANUP_PROBE_FAILED),
        ("error", CLEANUP_PROBE_FAILED),
    ],
)
async def test_probe_verdicts(agent: Any, make_body: Any, answer: str, verdict: Any) -> None:
    run = Run(agent, make_body, cleanup_probe_url=f"/probe/{answer}")
    try:
        handle = await run.start()
        assert await handle.probe_cleanup() == verdict
        assert run.calls() == [("GET", run.path("probe", answer))]
    finally:
        await run.runtime.close()


@pytest.mark.parametrize("answer", ["conflict", "missing", "gone"])
async def test_a_refused_cleanup_post_is_cleanup_failed_without_probing(
    agent: Any, make_body: Any, answer: str
) -> None:
    run = Run(
        agent,
        make_body,
        abort_url=f"/cleanup/{answer}",
        force_cleanup_url=f"/cleanup/{answer}",
        cleanup_probe_url="/probe/clean",
    )
    try:
        handle = await run.start()
        assert await handle.force_cleanup() == CLEANUP_FAILED
        assert await handle.abort() == CLEANUP_FAILED
        assert CLEANUP_FAILED.error_code == "cleanup_failed"
        assert run.calls() == [("POST", run.path("cleanup", answer))] * 2  # the probe is never asked
    finally:
        await run.runtime.close()


@pytest.mark.parametrize(("probe", "verdict"), [("clean", CLEANUP_CONFIRMED), ("dirty", CLEANUP_UNVERIFIED)])
async def test_an_accepted_cleanup_post_is_only_as_good_as_the_probe(
    agent: Any, make_body: Any, probe: str, verdict: Any
) -> None:
    run = Run(
        agent,
        make_body,
        abort_url="/cleanup/accept",
        force_cleanup_url="/cleanup/accept",
        cleanup_probe_url=f"/probe/{probe}",
    )
    try:
        handle = await run.start()
        assert await handle.force_cleanup() == verdict
        assert await handle.abort() == verdict
        post, get = ("POST", run.path("cleanup", "accept")), ("GET", run.path("probe", probe))
        assert run.calls() == [post, get, post, get]
    finally:
        await run.runtime.close()


async def test_stateless_is_confirmed_without_any_call(agent: Any, make_body: Any) -> None:
    # URLs are given too, so a call would be seen if the adapter made one.
    run = Run(
        agent,
        make_body,
        stateless=True,
        abort_url="/cleanup/accept",
        force_cleanup_url="/cleanup/accept",
        cleanup_probe_url="/probe/dirty",
    )
    try:
        handle = await run.start()
        assert await handle.probe_cleanup() == CLEANUP_CONFIRMED
        assert await handle.force_cleanup() == CLEANUP_CONFIRMED
        assert await handle.abort() == CLEANUP_CONFIRMED
        assert run.calls() == []
    finally:
        await run.runtime.close()


async def test_without_a_probe_url_nothing_is_confirmed(agent: Any, make_body: Any) -> None:
    run = Run(agent, make_body, force_cleanup_url="/cleanup/accept")
    try:
        handle = await run.start()
        assert await handle.probe_cleanup() == CLEANUP_UNVERIFIED
        assert run.calls() == []
        assert await handle.force_cleanup() == CLEANUP_UNVERIFIED  # accepted, but nothing can prove it
        assert run.calls() == [("POST", run.path("cleanup", "accept"))]
        assert await handle.abort() == CLEANUP_UNVERIFIED  # no abort URL: nothing to call
        assert run.calls() == [("POST", run.path("cleanup", "accept"))]
    finally:
        await run.runtime.close()


@pytest.mark.parametrize("whose", ["its own", "another"])
async def test_a_run_answer_stating_the_release_is_the_probes_answer(
    agent: Any, make_body: Any, whose: str
) -> None:
    """Its own rollout id: confirmed without asking (the probe here would say "dirty"). Another's: asked."""
    run = Run(agent, make_body, cleanup_probe_url="/probe/dirty")
    run.server.released[run.rollout_id] = run.rollout_id if whose == "its own" else "rollout-other"
    try:
        handle = await run.start()
        if whose == "its own":
            assert await handle.probe_cleanup() == CLEANUP_CONFIRMED
            assert run.calls() == []
        else:
            assert await handle.probe_cleanup() == CLEANUP_UNVERIFIED
            assert run.calls() == [("GET", run.path("probe", "dirty"))]
    finally:
        await run.runtime.close()
