"""The thin client against an unkind world: a gateway restarting, a gateway answering without end, a FIFO
as input, and an IO directory removed under it.

The cases: create gave up after 3 attempts (~0.75 s) on connection refused although
NEMO_GYM_STARTUP_TIMEOUT_S is 30 s, so every session started during a gateway restart failed; a 300 MB
answer took the client to 1.9 GB; a FIFO as input hung it; an output path whose directory was gone
exited 0 without a word.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from relax_gym_core.client import ClientOptions, GatewayClient
from relax_gym_core.client.http import MAX_RESPONSE_BYTES
from relax_gym_core.errors import GatewayRequestError
from relax_gym_core.testing.web import ThreadedServer, serve_in_thread, start_gateway

SAFETY_S = 60  # guards against hangs only
ECHO = {"echo": {"environment": "echo", "runtime": "echo"}}
CLIENT = [sys.executable, "-m", "relax_gym_core.client"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.anyio
async def test_create_waits_for_a_restarting_gateway(make_request: Any) -> None:
    port = free_port()
    refused = anyio.Event()

    async def sleep(seconds: float) -> None:
        refused.set()  # a retry is about to wait: at least one attempt was refused
        await anyio.sleep(seconds)

    options = ClientOptions(startup_timeout_s=SAFETY_S, retry_backoff_s=0.25)
    created: list[Any] = []
    with contextlib.ExitStack() as stack:
        async with GatewayClient(f"http://127.0.0.1:{port}", options=options, sleep=sleep) as client:

            async def create() -> None:
                created.append(await client.create(make_request()))

            async with anyio.create_task_group() as tg:
                tg.start_soon(create)
                await refused.wait()
                # Starting a gateway takes longer than the old 3 attempts (~0.75 s) ever waited.
                await anyio.to_thread.run_sync(lambda: stack.enter_context(start_gateway(ECHO, port=port)))
    assert created[0].status.value in ("queued", "running", "completed")


@pytest.mark.anyio
async def test_refused_connections_are_retried_until_the_startup_timeout_only(
    fake_gateway: Any, make_client: Any, make_request: Any, recorder: Any
) -> None:
    gateway = fake_gateway()
    gateway.script["create"] = [httpx.ConnectError("connection refused")] * 1000
    async with make_client(gateway.transport(), startup_timeout_s=5) as client:
        with pytest.raises(GatewayRequestError, match=r"after \d+ attempts \(ConnectError\)$") as info:
            await client.create(make_request())
    assert int(str(info.value).split("after ")[1].split()[0]) > 3
    assert recorder.now - 1000.0 <= 5  # and no longer than the startup timeout


class EndlessGateway:
    """Answers a poll with a JSON body four times the cap, or with a length no client should accept."""

    def app(self) -> Starlette:
        async def endless(_request: Request) -> Response:
            async def chunks() -> AsyncIterator[bytes]:
                yield b'{"filler": "'
                chunk = b"x" * 65536
                for _ in range(4 * MAX_RESPONSE_BYTES // len(chunk)):
                    yield chunk
                yield b'"}'

            return StreamingResponse(chunks(), media_type="application/json")

        async def declared(_request: Request) -> Response:
            async def stalls() -> AsyncIterator[bytes]:
                yield b"{"
                await asyncio.Event().wait()  # the rest of the 300 MB never comes

            return StreamingResponse(stalls(), headers={"content-length": str(300 << 20)})

        return Starlette(
            routes=[
                Route("/v1/trials/endless", endless),
                Route("/v1/trials/declared", declared),
            ]
        )


@pytest.fixture
def endless() -> Iterator[ThreadedServer]:
    with serve_in_thread(EndlessGateway().app()) as server:
        yield server


@pytest.mark.anyio
async def test_a_response_is_read_up_to_its_cap_only(endless: ThreadedServer) -> None:
    server = endless
    options = ClientOptions(max_retries=0, request_timeout_s=SAFETY_S)
    async with GatewayClient(server.url, options=options) as client:
        for path in ("endless", "declared"):
            with pytest.raises(GatewayRequestError) as info:
                await client.get(path)
            assert (
                str(info.value) == f"Gateway get response is larger than {MAX_RESPONSE_BYTES} bytes; not read"
            )


def session_environ(tmp_path: Path, environ_for: Any, gateway_url: str) -> dict[str, str]:
    io_dir = tmp_path / "relax-agentic-command-1"
    io_dir.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAX_", "NEMO_GYM_", "OPENAI_"))}
    return {
        **base,
        **environ_for(gateway_url, str(io_dir), NEMO_GYM_POLL_INTERVAL_S="0.05"),
        "RELAX_INPUT_JSON": str(io_dir / "session_input.json"),
        "RELAX_OUTPUT_JSON": str(io_dir / "session_output.json"),
    }


def test_a_fifo_as_input_is_refused_not_waited_on(tmp_path: Path, environ_for: Any) -> None:
    environ = session_environ(tmp_path, environ_for, "http://127.0.0.1:9")
    os.mkfifo(environ["RELAX_INPUT_JSON"])  # nobody will ever write to it
    result = subprocess.run(
        CLIENT, env=environ, capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    assert (result.returncode, result.stderr) == (
        1,
        f"relax-gym-client: RELAX_INPUT_JSON must be a regular file: {environ['RELAX_INPUT_JSON']}\n",
    )


def test_a_removed_io_directory_exits_0_and_says_so(tmp_path: Path, environ_for: Any) -> None:
    with start_gateway(ECHO) as gateway:
        environ = session_environ(tmp_path, environ_for, gateway.url)
        Path(environ["RELAX_INPUT_JSON"]).write_text(json.dumps({"messages": [], "metadata": {"echo": {}}}))
        environ["RELAX_OUTPUT_JSON"] = str(tmp_path / "removed-by-relax" / "session_output.json")
        result = subprocess.run(
            CLIENT, env=environ, capture_output=True, text=True, timeout=SAFETY_S, check=False
        )
    assert result.returncode == 0
    assert result.stderr == (
        "relax-gym-client: RELAX_OUTPUT_JSON's directory no longer exists (Relax removes it when it cancels "
        "a session); the trial's result was not written\n"
    )
    assert not (tmp_path / "removed-by-relax").exists()
