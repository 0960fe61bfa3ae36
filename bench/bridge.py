"""Bridge overhead: the same load against a scripted upstream directly and through the gateway's bridge.

Three processes on 127.0.0.1: a minimal upstream (aiohttp.web, a fixed chat completion), the gateway
(real uvicorn, echo trials holding live capabilities), and this driver. Reported per concurrency level:
calls/s direct vs bridged, added p50/p99 latency, and the gateway's CPU per bridged call (from
/proc/<pid>/stat), for each upstream HTTP client (aiohttp vs httpx) side by side.

Run: .venv/bin/python bench/bridge.py [--levels 1,64,256,1024] [--seconds 3] [--clients aiohttp,httpx]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from relax_gym_core.gym.processes import stop_process

TRIALS = 64
REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "policy",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
REQUEST = {"model": "agent", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 1.0}


# ---- roles run as subprocesses --------------------------------------------------------------------


def run_upstream() -> None:
    body = json.dumps(REPLY).encode()

    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=int(os.environ["BENCH_PORT"]), print=None, access_log=None)


def run_gateway() -> None:
    from relax_gym_core.bridge import CallbackPolicy  # noqa: PLC0415
    from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments  # noqa: PLC0415
    from relax_gym_core.gateway.server import bind, run, url_of  # noqa: PLC0415

    counter = itertools.count()
    specs = {
        "echo": {"environment": "echo", "runtime": "echo", "max_concurrency": TRIALS, "queue_capacity": 0}
    }
    sock = bind("127.0.0.1", 0)
    settings = GatewaySettings(
        environments=parse_environments(json.dumps(specs), source="bench"),
        callback_policy=CallbackPolicy.parse(hosts=[], networks=["127.0.0.1/32"], proxy=None),
        upstream_client=os.environ["BENCH_CLIENT"],
        public_url=url_of(sock),
    )
    # Deterministic capabilities so the driver can address the trials it created, in order.
    app = create_app(settings, new_rollout_id=lambda: f"{next(counter):032x}-0")
    run(app, sock)


# ---- driver -----------------------------------------------------------------------------------------


def free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def process(
    role: str, env: dict[str, str], ready_line: str | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--role", role],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    line = ""
    try:
        if ready_line is not None:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if ready_line not in line:
                raise RuntimeError(f"{role} did not start: {line!r}")
        yield proc, line
    finally:
        stop_process(proc, signal.SIGTERM, timeout_s=30)
        if proc.stdout is not None:
            proc.stdout.close()


async def wait_http(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(500):
            try:
                async with session.post(url, json={}) as response:
                    await response.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.02)
    raise RuntimeError(f"{url} did not come up")


async def load(urls: list[str], concurrency: int, seconds: float) -> tuple[int, list[float], int]:
    """Closed-loop load: `concurrency` workers post back to back until time is up."""
    body = json.dumps(REQUEST).encode()
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:

        async def worker(index: int) -> None:
            nonlocal errors
            url = urls[index % len(urls)]
            headers = {"Content-Type": "application/json", "Authorization": "Bearer agent-side"}
            while time.perf_counter() < stop:
                started = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                        ok = response.status == 200
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return len(latencies), latencies, errors


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def create_trials(gateway: str, upstream: str) -> None:
    async with aiohttp.ClientSession() as session:
        for index in range(TRIALS):
            body = {
                "protocol_version": "relax-nemo-gym/v1",
                "request_id": f"bench-{index}",
                "session": {"session_id": f"s{index}", "group_id": "g", "rollout_mode": "train"},
                "environment": {
                    "name": "echo",
                    "config": "echo",
                    "task": {"metadata": {"echo": {"sleep_s": 3600}}},
                },
                "model_endpoint": {
                    "base_url": f"{upstream}/agentic_api",
                    "api_key": f"tok{index}",
                    "model": "policy",
                },
                "interrupt_policy": "protected",
                "deadline_s": 3600,
                "lease_s": 3600,
            }
            async with session.post(f"{gateway}/v1/trials", json=body) as response:
                if response.status != 202:
                    raise RuntimeError(f"create failed: {response.status} {await response.text()}")


@dataclass(frozen=True)
class Level:
    client: str
    concurrency: int
    direct_rps: float
    bridge_rps: float
    added_p50_ms: float
    added_p99_ms: float
    gateway_cpu_ms_per_call: float
    errors: int

    def line(self) -> str:
        return (
            f"{self.client:8} {self.concurrency:>5} {self.direct_rps:>9.0f} {self.bridge_rps:>9.0f} "
            f"{self.added_p50_ms:>8.2f} {self.added_p99_ms:>8.2f} {self.gateway_cpu_ms_per_call:>15.3f} "
            f"{self.errors:>6}"
        )


HEADER = (
    f"{'client':8} {'conc':>5} {'direct/s':>9} {'bridge/s':>9} {'+p50 ms':>8} {'+p99 ms':>8} "
    f"{'gw CPU ms/call':>15} {'errors':>6}"
)


def measure(client: str, levels: list[int], seconds: float) -> list[Level]:
    port = free_port()
    upstream = f"http://127.0.0.1:{port}"
    rows = []
    with process("upstream", {"BENCH_PORT": str(port)}):
        asyncio.run(wait_http(f"{upstream}/agentic_api/v1/chat/completions"))
        with process("gateway", {"BENCH_CLIENT": client}, "listening on") as (gw, line):
            gateway = line.rsplit(" ", 1)[1]
            asyncio.run(create_trials(gateway, upstream))
            bridged = [f"{gateway}/ng-rollout/{i:032x}-0/v1/chat/completions" for i in range(TRIALS)]
            direct = [f"{upstream}/agentic_api/v1/chat/completions"]
            asyncio.run(load(bridged, 8, 0.5))  # warm up pools
            for level in levels:
                n_direct, lat_direct, err_direct = asyncio.run(load(direct, level, seconds))
                cpu_before = cpu_seconds(gw.pid)
                n_bridge, lat_bridge, err_bridge = asyncio.run(load(bridged, level, seconds))
                cpu = cpu_seconds(gw.pid) - cpu_before
                rows.append(
                    Level(
                        client=client,
                        concurrency=level,
                        direct_rps=n_direct / seconds,
                        bridge_rps=n_bridge / seconds,
                        added_p50_ms=(pct(lat_bridge, 0.5) - pct(lat_direct, 0.5)) * 1000,
                        added_p99_ms=(pct(lat_bridge, 0.99) - pct(lat_direct, 0.99)) * 1000,
                        gateway_cpu_ms_per_call=cpu / max(n_bridge, 1) * 1000,
                        errors=err_direct + err_bridge,
                    )
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["upstream", "gateway"])
    parser.add_argument("--levels", default="1,64,256,1024")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="aiohttp,httpx")
    args = parser.parse_args()
    if args.role == "upstream":
        run_upstream()
        return
    if args.role == "gateway":
        run_gateway()
        return
    levels = [int(x) for x in args.levels.split(",")]
    clients = args.clients.split(",")
    rows = [row for client in clients for row in measure(client, levels, args.seconds)]
    print(HEADER)
    for row in rows:
        print(row.line())
    for client in clients:
        mine = [r for r in rows if r.client == client]
        if len(mine) > 1:
            flat = mine[-1].gateway_cpu_ms_per_call / mine[0].gateway_cpu_ms_per_call
            print(
                f"{client}: CPU per call at {mine[-1].concurrency} / at {mine[0].concurrency} = {flat:.2f}x"
            )
    print("targets: CPU/call flat (<= 1.5x), +p50 <= 1 ms at 1, >= 3,000 calls/s at 256, no errors at 1,024")


if __name__ == "__main__":
    main()
