"""The bridge's own Python per model call: the gateway's ASGI app driven in one process, no sockets.

bench/bridge.py measures the deployed stack (uvicorn, reqwest, the kernel), whose CPU per call moves by
±20 % between runs on a shared machine. This drives `create_app(...)` directly with ASGI messages and
an upstream client that answers at once, so what it times is the bridge's own work per call (routing,
capability, deadline and abort scope, JSON in and out, overlay, metrics, trajectory, the answer), and
it moves by a few percent. 64 echo trials, 64 concurrent callers, best and median of five passes.

Run: .venv/bin/python bench/bridge_python.py [--calls 20000] [--trajectories on|off]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

import bridge  # this directory's bench/bridge.py: the same app, trials and bodies
from relax_gym_core.bridge import UPSTREAM_CLIENTS, UpstreamReply

REPLY = json.dumps(bridge.REPLY).encode()
REQUEST = json.dumps(bridge.REQUEST).encode()


class AtOnce:
    """An upstream client that answers every call with REPLY after one turn of the loop."""

    def __init__(self, **_options: Any) -> None:
        pass

    async def post(
        self, url: str, *, headers: Mapping[str, str], body: bytes, timeout_s: float
    ) -> UpstreamReply:
        await asyncio.sleep(0)
        return UpstreamReply(200, "application/json", REPLY, ())

    async def close(self) -> None:
        pass


type App = Any  # the ASGI app create_app() returns


async def request(app: App, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP request as uvicorn would hand it over: (status, body)."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(message.get("body", b"") for message in sent[1:])


async def measure(calls: int, trajectories: bool) -> list[float]:
    UPSTREAM_CLIENTS["at-once"] = AtOnce
    app = bridge.bench_app("at-once", "http://127.0.0.1:8000", trajectories=trajectories)
    inbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put)
    )
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    for index in range(bridge.TRIALS):
        body = json.dumps(bridge.echo_trial(index, "http://127.0.0.1:9")).encode()
        status, text = await request(app, "POST", "/v1/trials", body)
        assert status == 202, text
    paths = [f"/ng-rollout/{index:032x}-0/v1/chat/completions" for index in range(bridge.TRIALS)]

    async def caller(first: int, count: int) -> None:
        for step in range(count):
            status, text = await request(app, "POST", paths[(first + step) % bridge.TRIALS], REQUEST)
            assert status == 200, text

    await asyncio.gather(*(caller(k, 100) for k in range(bridge.TRIALS)))  # warm up
    passes = []
    for _ in range(5):
        gc.collect()
        started = time.process_time()
        await asyncio.gather(*(caller(k, calls // bridge.TRIALS) for k in range(bridge.TRIALS)))
        passes.append((time.process_time() - started) / (calls // bridge.TRIALS * bridge.TRIALS))
    await inbox.put({"type": "lifespan.shutdown"})
    await outbox.get()
    await lifespan
    return passes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--trajectories", choices=["on", "off"], default="on")
    args = parser.parse_args()
    passes = asyncio.run(measure(args.calls, args.trajectories == "on"))
    print(
        f"bridge Python per call (trajectories {args.trajectories}): best {min(passes) * 1e6:.1f} us, "
        f"median {statistics.median(passes) * 1e6:.1f} us over 5 passes of {args.calls} calls"
    )


if __name__ == "__main__":
    main()
