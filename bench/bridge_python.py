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
import itertools
import json
import statistics
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from relax_gym_core.bridge import UPSTREAM_CLIENTS, CallbackPolicy, UpstreamReply
from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments

TRIALS = 64
REPLY = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
REQUEST = json.dumps(
    {"model": "agent", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 1.0}
).encode()


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


def trial_body(index: int) -> bytes:
    return json.dumps(
        {
            "protocol_version": "relax-nemo-gym/v1",
            "request_id": f"bench-{index}",
            "session": {"session_id": f"s{index}", "group_id": "g", "rollout_mode": "train"},
            "environment": {
                "name": "echo",
                "config": "echo",
                "task": {"metadata": {"echo": {"sleep_s": 3600}}},
            },
            "model_endpoint": {
                "base_url": "http://127.0.0.1:9/agentic_api",
                "api_key": f"k{index}",
                "model": "p",
            },
            "interrupt_policy": "protected",
            "deadline_s": 3600,
            "lease_s": 3600,
        }
    ).encode()


async def measure(calls: int, trajectories: bool) -> list[float]:
    UPSTREAM_CLIENTS["at-once"] = AtOnce
    counter = itertools.count()
    specs = {
        "echo": {"environment": "echo", "runtime": "echo", "max_concurrency": TRIALS, "queue_capacity": 0}
    }
    settings = GatewaySettings(
        environments=parse_environments(json.dumps(specs), source="bench"),
        callback_policy=CallbackPolicy.parse(hosts=[], networks=["127.0.0.1/32"], proxy=None),
        upstream_client="at-once",
        public_url="http://127.0.0.1:8000",
        trajectories=trajectories,
    )
    app = create_app(settings, new_rollout_id=lambda: f"{next(counter):032x}-0")
    inbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put)
    )
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    for index in range(TRIALS):
        status, text = await request(app, "POST", "/v1/trials", trial_body(index))
        assert status == 202, text
    paths = [f"/ng-rollout/{index:032x}-0/v1/chat/completions" for index in range(TRIALS)]

    async def caller(first: int, count: int) -> None:
        for step in range(count):
            status, text = await request(app, "POST", paths[(first + step) % TRIALS], REQUEST)
            assert status == 200, text

    await asyncio.gather(*(caller(k, 100) for k in range(TRIALS)))  # warm up
    passes = []
    for _ in range(5):
        gc.collect()
        started = time.process_time()
        await asyncio.gather(*(caller(k, calls // TRIALS) for k in range(TRIALS)))
        passes.append((time.process_time() - started) / (calls // TRIALS * TRIALS))
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
