"""A /run that fails says why in the gateway's log: the agent's answer (NeMo Gym's "Hit an exception ...
calling an inner server: ...") and the last lines each of the environment's servers logged (their
tracebacks), bounded, with the rollout id masked; the trial's own error stays agent_error, no text. A real
HTTP server on 127.0.0.1 answers /run with a 500."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from relax_gym_core.errors import AgentRunError
from relax_gym_core.plugin.host import reference_environment
from relax_gym_core.plugin.runs import RunContext
from relax_gym_core.plugin.specs import EnvironmentSpec
from relax_gym_core.protocol import parse_create_request
from relax_gym_core.runtimes.nemo_gym import TAIL_LINES, NemoGymRuntime, log_tail
from relax_gym_core.testing.web import serve_in_thread

pytestmark = pytest.mark.anyio
ROLLOUT = "0123456789abcdef0123456789abcdef-0"


async def run(request: Request) -> JSONResponse:
    body = await request.json()
    inner = (
        f'{{"detail": "missing expected_answer", "input": {{"_ng_rollout_id": "{body["_ng_rollout_id"]}"}}}}'
    )
    return JSONResponse(f"Hit an exception in agent calling an inner server: {inner}", status_code=500)


@pytest.fixture(scope="module")
def agent() -> Iterator[str]:
    with serve_in_thread(Starlette(routes=[Route("/run", run, methods=["POST"])])) as server:
        yield server.url


async def test_the_answer_and_the_servers_last_lines_go_to_the_log(
    agent: str, make_body: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent_log, resources_log, silent = (
        tmp_path / "agent.log",
        tmp_path / "resources.log",
        tmp_path / "quiet.log",
    )
    agent_log.write_text(
        "".join(f"line {n}\n" for n in range(100)) + f"Traceback: rollout {ROLLOUT} failed\n"
    )
    resources_log.write_text("ValidationError: expected_answer Field required\n")
    silent.write_text("")
    spec = EnvironmentSpec(
        config="default",
        environment="echo",
        agent_name="agent",
        agent_url=agent,
        server_logs=(str(agent_log), str(resources_log), str(silent), str(tmp_path / "gone.log")),
    )
    runtime = NemoGymRuntime(spec, reference_environment("echo"))
    context = RunContext(
        request=parse_create_request(make_body()), rollout_id=ROLLOUT, environment="echo", config="default"
    )
    with caplog.at_level(logging.WARNING, logger="relax_gym.nemo_gym"):
        handle = await runtime.start(context)
        with pytest.raises(AgentRunError, match=r"^NeMo Gym agent /run answered HTTP 500$"):
            await handle.wait()
    await runtime.close()
    said = [record.getMessage() for record in caplog.records]
    assert said[0].startswith('NeMo Gym agent /run answered HTTP 500: "Hit an exception in agent calling an')
    assert "missing expected_answer" in said[0]
    assert said[1].startswith(f"the last lines of {agent_log}:\n")
    assert said[1].splitlines()[1:] == [
        *(f"line {n}" for n in range(100 - TAIL_LINES + 1, 100)),
        "Traceback: rollout [redacted] failed",
    ]
    assert said[2] == f"the last lines of {resources_log}:\nValidationError: expected_answer Field required"
    assert len(said) == 3  # an empty log, or one that is gone, says nothing
    assert ROLLOUT not in "\n".join(said)


def test_a_long_log_is_read_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("x" * 10_000_000 + "\nlast\n")
    assert log_tail(str(log), 1) == "last"
