"""Bridge overhead: the same load against a scripted upstream directly and through the gateway's bridge.

Three processes on 127.0.0.1: an upstream answering a fixed chat completion, the gateway (real uvicorn,
echo trials with live rollout ids), and a closed-loop driver. Reported per concurrency level: calls/s
direct vs bridged, added p50/p99 latency, and the gateway's CPU per bridged call (all its threads, from
/proc/<pid>/stat), for each upstream HTTP client side by side.

Two drivers:
- `python`: aiohttp drives and an aiohttp.web app answers. Always available, but on two cores the driver and
  the upstream take CPU the gateway would otherwise have.
- `wrk`: wrk drives and nginx answers (Debian: `apt-get install wrk nginx-light`), both C and cheap, so
  bridged calls/s is close to the gateway's own ceiling. Used by default when both are on PATH.

Run: .venv/bin/python bench/bridge.py [--levels 1,64,256,1024] [--seconds 3]
                                      [--clients pyreqwest,aiohttp,httpx] [--driver auto|python|wrk]
                                      [--profile DIR]  (py-spy on the gateway per bridged level)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from relax_gym_core.gym.processes import stop_process

TRIALS = 64
FLOOR = "floor"  # not a client: a zero-logic uvicorn + pyreqwest proxy, the ceiling for this stack
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


def run_floor_proxy() -> None:
    """The least any bridge on this stack can cost: uvicorn + pyreqwest forwarding bytes, no checks at all."""
    from relax_gym_core.bridge import UPSTREAM_CLIENTS  # noqa: PLC0415
    from relax_gym_core.gateway.server import bind, run  # noqa: PLC0415

    target = os.environ["BENCH_UPSTREAM"] + "/agentic_api/v1/chat/completions"
    headers = {"Authorization": "Bearer tok", "Content-Type": "application/json"}
    holder: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup
            holder["client"] = UPSTREAM_CLIENTS["pyreqwest"]()
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown
            await holder["client"].close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        reply = await holder["client"].post(target, headers=headers, body=body, timeout_s=60)
        head = [(b"content-type", reply.content_type.encode())]
        await send({"type": "http.response.start", "status": reply.status, "headers": head})
        await send({"type": "http.response.body", "body": reply.body})

    run(app, bind("127.0.0.1", 0))  # type: ignore[arg-type]


def bench_app(upstream_client: str, public_url: str, *, trajectories: bool) -> Any:
    """The gateway app of this bench (and bridge_python.py): TRIALS echo trials at once, callbacks to
    127.0.0.1, and rollout ids numbered in creation order so a driver can address the trials it made."""
    from relax_gym_core.bridge import CallbackPolicy  # noqa: PLC0415
    from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments  # noqa: PLC0415

    counter = itertools.count()
    specs = {
        "echo": {"environment": "echo", "runtime": "echo", "max_concurrency": TRIALS, "queue_capacity": 0}
    }
    settings = GatewaySettings(
        environments=parse_environments(json.dumps(specs), source="bench"),
        callback_policy=CallbackPolicy.parse(hosts=[], networks=["127.0.0.1/32"], proxy=None),
        upstream_client=upstream_client,
        public_url=public_url,
        trajectories=trajectories,
    )
    return create_app(settings, new_rollout_id=lambda: f"{next(counter):032x}-0")


def echo_trial(index: int, upstream: str) -> dict[str, Any]:
    """The create body of echo trial `index` (an hour long), its model calls going to `upstream`."""
    return {
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


def run_gateway() -> None:
    from relax_gym_core.gateway.server import bind, run, url_of  # noqa: PLC0415

    sock = bind("127.0.0.1", 0)
    trajectories = os.environ.get("BENCH_TRAJECTORIES", "on") == "on"
    run(bench_app(os.environ["BENCH_CLIENT"], url_of(sock), trajectories=trajectories), sock)


# ---- driver -----------------------------------------------------------------------------------------


def free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {root}/body;
  proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fastcgi;
  uwsgi_temp_path {root}/uwsgi;
  scgi_temp_path {root}/scgi;
  keepalive_requests 10000000;
  server {{
    listen 127.0.0.1:{port};
    location / {{ default_type application/json; return 200 '{reply}'; }}
  }}
}}
"""

# wrk posts REQUEST; bridged paths rotate over the trials' rollout ids like the python driver's workers.
WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer agent-side"
local counter = 0
request = function()
  counter = counter + 1
  if {bridged} then
    return wrk.format(nil, string.format("/ng-rollout/%032x-0/v1/chat/completions", counter % {trials}))
  end
  return wrk.format(nil, "/agentic_api/v1/chat/completions")
end
"""


def have_wrk() -> bool:
    return shutil.which("wrk") is not None and shutil.which("nginx") is not None


@contextmanager
def nginx_upstream(port: int) -> Iterator[None]:
    with tempfile.TemporaryDirectory(prefix="relax-gym-bench-") as root:
        conf = Path(root, "nginx.conf")
        conf.write_text(NGINX_CONF.format(root=root, port=port, reply=json.dumps(REPLY)))
        proc = subprocess.Popen(
            [shutil.which("nginx") or "nginx", "-c", str(conf), "-p", root], stderr=subprocess.DEVNULL
        )
        try:
            yield
        finally:
            stop_process(proc, signal.SIGQUIT, timeout_s=30)


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"unexpected wrk duration {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Load:
    calls: int
    seconds: float
    p50_s: float
    p99_s: float
    errors: int


def wrk_load(base_url: str, *, bridged: bool, concurrency: int, seconds: float) -> Load:
    """One closed-loop wrk run; latency percentiles from --latency, errors = socket errors + non-2xx."""
    script = WRK_SCRIPT.format(
        body=json.dumps(REQUEST), bridged="true" if bridged else "false", trials=TRIALS
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as handle:
        handle.write(script)
        handle.flush()
        duration = f"-d{max(1, round(seconds))}s"
        out = subprocess.run(
            [
                "wrk", "-t1", f"-c{concurrency}", duration, "--timeout", "60s", "--latency",
                "-s", handle.name, base_url,
            ],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    if "Latency Distribution" not in out:
        raise RuntimeError(f"wrk printed no latency figures:\n{out}")
    calls = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors += int(non_2xx.group(1)) if non_2xx else 0
    p50, p99 = (_seconds(m) for m in re.findall(r"^\s+(?:50|99)%\s+(\S+)\s*$", out, re.MULTILINE))
    return Load(calls=calls - errors, seconds=seconds, p50_s=p50, p99_s=p99, errors=errors)


def python_load(urls: list[str], concurrency: int, seconds: float) -> Load:
    calls, latencies, errors = asyncio.run(load(urls, concurrency, seconds))
    return Load(calls, seconds, pct(latencies, 0.5), pct(latencies, 0.99), errors)


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
            body = echo_trial(index, upstream)
            async with session.post(f"{gateway}/v1/trials", json=body) as response:
                if response.status != 202:
                    raise RuntimeError(f"create failed: {response.status} {await response.text()}")


@dataclass(frozen=True)
class Level:
    driver: str
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
            f"{self.driver:6} {self.client:9} {self.concurrency:>5} "
            f"{self.direct_rps:>9.0f} {self.bridge_rps:>9.0f} "
            f"{self.added_p50_ms:>8.2f} {self.added_p99_ms:>8.2f} {self.gateway_cpu_ms_per_call:>15.3f} "
            f"{self.errors:>6}"
        )


HEADER = (
    f"{'driver':6} {'client':9} {'conc':>5} {'direct/s':>9} {'bridge/s':>9} {'+p50 ms':>8} {'+p99 ms':>8} "
    f"{'gw CPU ms/call':>15} {'errors':>6}"
)


@contextmanager
def profiled(pid: int, out: Path | None, seconds: float) -> Iterator[None]:
    """py-spy (raw, all threads, 250 Hz) on the gateway for the bridged load, when asked for (--profile)."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("bench/bridge.py: --profile needs py-spy on PATH (pip install py-spy)")
    command = [spy, "record", "-p", str(pid), "-r", "250", "-d", str(max(1, int(seconds))), "--threads"]
    recorder = subprocess.Popen(
        [*command, "-f", "raw", "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        recorder.wait()


def measure(
    client: str,
    levels: list[int],
    seconds: float,
    driver: str,
    trajectories: str = "on",
    profile: Path | None = None,
) -> list[Level]:
    port = free_port()
    upstream = f"http://127.0.0.1:{port}"
    rows = []
    serve_upstream = (
        nginx_upstream(port) if driver == "wrk" else process("upstream", {"BENCH_PORT": str(port)})
    )
    with serve_upstream:
        asyncio.run(wait_http(f"{upstream}/agentic_api/v1/chat/completions"))
        role = "floor" if client == FLOOR else "gateway"
        env = {"BENCH_CLIENT": client, "BENCH_UPSTREAM": upstream, "BENCH_TRAJECTORIES": trajectories}
        with process(role, env, "listening on") as (gw, line):
            gateway = line.rsplit(" ", 1)[1]
            if role == "gateway":
                asyncio.run(create_trials(gateway, upstream))
            bridged = [f"{gateway}/ng-rollout/{i:032x}-0/v1/chat/completions" for i in range(TRIALS)]
            direct = [f"{upstream}/agentic_api/v1/chat/completions"]
            # Warm up pools and the upstream client's threads before the first measured level.
            if driver == "wrk":
                wrk_load(gateway, bridged=True, concurrency=64, seconds=1)
            else:
                asyncio.run(load(bridged, 8, 0.5))
            for level in levels:
                if driver == "wrk":
                    plain = wrk_load(upstream, bridged=False, concurrency=level, seconds=seconds)
                else:
                    plain = python_load(direct, level, seconds)
                cpu_before = cpu_seconds(gw.pid)
                out = profile / f"{client}-{level}.txt" if profile is not None else None
                with profiled(gw.pid, out, seconds):
                    if driver == "wrk":
                        via = wrk_load(gateway, bridged=True, concurrency=level, seconds=seconds)
                    else:
                        via = python_load(bridged, level, seconds)
                cpu = cpu_seconds(gw.pid) - cpu_before
                rows.append(
                    Level(
                        driver=driver,
                        client=client if trajectories == "on" else f"{client}-off",
                        concurrency=level,
                        direct_rps=plain.calls / seconds,
                        bridge_rps=via.calls / seconds,
                        added_p50_ms=(via.p50_s - plain.p50_s) * 1000,
                        added_p99_ms=(via.p99_s - plain.p99_s) * 1000,
                        gateway_cpu_ms_per_call=cpu / max(via.calls + via.errors, 1) * 1000,
                        errors=plain.errors + via.errors,
                    )
                )
    return rows


def best(a: Level, b: Level) -> Level:
    """The better of two runs of one level: the lower CPU per call, the higher rate."""
    keep = a if a.gateway_cpu_ms_per_call <= b.gateway_cpu_ms_per_call else b
    return replace(keep, bridge_rps=max(a.bridge_rps, b.bridge_rps))


def _pairs(rows: list[Level], again: list[Level]) -> list[tuple[Level, Level]]:
    by_level = {r.concurrency: r for r in again}
    return [(r, by_level.get(r.concurrency, r)) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["upstream", "gateway", "floor"])
    parser.add_argument("--levels", default="1,64,256,1024")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default=f"pyreqwest,aiohttp,httpx,{FLOOR}")
    parser.add_argument("--driver", choices=["auto", "python", "wrk"], default="auto")
    parser.add_argument(
        "--trajectories-off",
        action="store_true",
        help="also measure the first client with trajectories off, alternated with on (the capture's cost)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=2,
        help="with --trajectories-off: how many pairs of runs, off and on (default 2)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record the gateway with py-spy during each bridged level: DIR/<client>-<level>.txt (raw)",
    )
    args = parser.parse_args()
    if args.role == "upstream":
        run_upstream()
        return
    if args.role == "gateway":
        run_gateway()
        return
    if args.role == "floor":
        run_floor_proxy()
        return
    driver = args.driver
    if driver == "auto":
        driver = "wrk" if have_wrk() else "python"
        if driver == "python":
            print(
                "wrk/nginx not found: using the python driver (apt-get install wrk nginx-light for the C one)"
            )
    elif driver == "wrk" and not have_wrk():
        sys.exit(
            "bench/bridge.py: --driver wrk needs wrk and nginx on PATH (apt-get install wrk nginx-light)"
        )
    levels = [int(x) for x in args.levels.split(",")]
    clients = args.clients.split(",")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows = [
        row
        for client in clients
        for row in measure(client, levels, args.seconds, driver, profile=args.profile)
    ]
    pairs: list[tuple[list[Level], list[Level]]] = []  # (on, off) runs back to back
    if args.trajectories_off:
        # `--pairs` pairs of runs back to back, off first in every other one: load that moves between
        # pairs hits both of a pair, and neither side always runs second (later runs tend to be slower).
        for index in range(max(1, args.pairs)):
            order = ("off", "on") if index % 2 == 0 else ("on", "off")
            done = {
                kind: measure(clients[0], levels, args.seconds, driver, trajectories=kind) for kind in order
            }
            pairs.append((done["on"], done["off"]))
        for again, _ in pairs:
            rows = [best(r, a) if r.client == clients[0] else r for r, a in _pairs(rows, again)]
        offs = [off for _, off in pairs]
        rows += [functools.reduce(best, level_rows) for level_rows in zip(*offs, strict=True)]
    print(HEADER)
    for row in rows:
        print(row.line())
    if args.trajectories_off:
        captured = {r.concurrency: r for r in rows if r.client == clients[0]}
        for index, without in enumerate(r for r in rows if r.client == f"{clients[0]}-off"):
            on = captured[without.concurrency]
            each = [
                ons[index].gateway_cpu_ms_per_call / offs_[index].gateway_cpu_ms_per_call
                for ons, offs_ in pairs
            ]
            print(
                f"trajectories on/off at {without.concurrency}: CPU per call "
                f"{on.gateway_cpu_ms_per_call / without.gateway_cpu_ms_per_call:.2f}x best of each, "
                f"{statistics.median(each):.2f}x the median of {len(each)} pairs "
                f"({', '.join(f'{x:.2f}' for x in each)}); calls/s {on.bridge_rps / without.bridge_rps:.0%} "
                "(target: CPU <= 1.10x)"
            )
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
