"""A whole trial's cost over NeMo Gym's own: the same workplace_assistant rows, the same scripted policy
(one tool call, its output fed back, then an answer), (a) straight at the simple_agent's `/run` (NeMo Gym
alone: its servers, the policy server) and (b) as trials through relax-gym (`relax-gym up`: create, poll,
cleanup proven by the environment; the verdict read from the create's answer when it holds one, else
polled), at concurrency 1 and 16. Wall time per trial and CPU per trial of the whole machine (/proc/stat,
every process), as ratios (b) / (a). Target: <= 1.05x wall, <= 1.10x CPU.

Run: .venv/bin/python bench/trial_overhead.py [--trials 48] [--rounds 2] [--split]. Each round runs both paths
at both levels, alternated; the best round of each is kept, and beside it the median of each round's own
ratios (the two paths of a round run back to back); exits 0 whatever the figures are. --split then runs each
path once more at concurrency 16 and prints its CPU per trial process by process (what the gap is made of).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from relax_gym_core.bridge.payloads import repair_responses
from relax_gym_core.client import ClientOptions, GatewayClient, run_trial
from relax_gym_core.gym.config import servers_of
from relax_gym_core.gym.processes import run_gym_servers
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.policies import formats
from relax_gym_core.policies.replies import (
    ModelReply,
    RecordedRequest,
    ScriptedReply,
    ToolCall,
    reply_text,
    reply_tool_calls,
)
from relax_gym_core.policies.server import ScriptedPolicy
from relax_gym_core.policies.threaded import ThreadedServer
from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CleanupState,
    CreateTrialRequest,
    Generation,
    parse_create_request,
)
from relax_gym_core.rollout.data import example_rows
from relax_gym_core.testing.processes import start_up

ENVIRONMENT, CONFIG = "workplace_assistant", "workplace-assistant-v1"
LEVELS = (1, 16)
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
_ids = itertools.count()


def one_tool_then_answer(request: RecordedRequest) -> ScriptedReply:
    """A call of the first tool offered, then an answer once its output came back: the same turns on both
    paths, whatever the row (a deterministic function of the conversation, no per-trial state)."""
    body = request.body if isinstance(request.body, dict) else {}
    items = body.get("input")
    answered = isinstance(items, list) and any(
        isinstance(item, dict) and item.get("type") == "function_call_output" for item in items
    )
    tools = body.get("tools") or []
    if not answered and tools:
        return reply_tool_calls(ToolCall(str(tools[0]["name"]), {}))
    return reply_text("Done.")


def nemo_gym_policy() -> Starlette:
    """The same script for NeMo Gym's agent called straight: it posts `/v1/responses` and accepts only a
    complete Response object, so the answer is rendered and then completed as the bridge completes it for
    trials (payloads.repair_responses)."""

    async def responses(request: Request) -> JSONResponse:
        raw = await request.body()
        body = json.loads(raw)
        recorded = RecordedRequest(
            method="POST", path=request.url.path, query="", headers={}, body=body, raw_body=raw,
            resource="responses",
        )  # fmt: skip
        reply = one_tool_then_answer(recorded)
        assert isinstance(reply, ModelReply)
        return JSONResponse(repair_responses(formats.responses_object(reply, model="policy"), body))

    return Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])


def busy_seconds() -> float:
    """CPU time of the whole machine so far (every process: user, nice, system, irq, softirq), from
    /proc/stat; not idle, iowait or steal (another guest's time on this machine's cores)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) * TICK_S


def _ticks(stat_path: str) -> int:
    """utime + stime of one process or thread, from its /proc stat line."""
    with open(stat_path) as stat:
        text = stat.read()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _tree(pid: int) -> list[int]:
    """`pid` and every process under it."""
    found = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                for child in children.read().split():
                    found += _tree(int(child))
    except FileNotFoundError:
        pass  # ended meanwhile
    return found


def cpu_by_part(gateway_pid: int) -> dict[str, int]:
    """CPU ticks so far of each part of the bench: our processes, NeMo Gym's, the policy stand-ins."""
    parts: dict[str, int] = {}

    def add(part: str, stat_path: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # ended meanwhile
            parts[part] = parts.get(part, 0) + _ticks(stat_path)

    policy_threads = {t.native_id for t in threading.enumerate() if t.name.startswith("uvicorn ")}
    for task in os.listdir("/proc/self/task"):
        part = "policy stand-ins (threads here)" if int(task) in policy_threads else "bench: clients"
        add(part, f"/proc/self/task/{task}/stat")
    ours = _tree(gateway_pid)
    for pid in set(_tree(os.getpid())[1:]) - set(ours):
        add("NeMo Gym servers, called straight", f"/proc/{pid}/stat")
    for pid in ours:
        command = b""
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read()
        if pid == gateway_pid:
            part = "relax-gym up (gateway, bridge, runtime)"
        elif b"trajectories/writer.py" in command:
            part = "trajectory writer process"
        else:
            part = "NeMo Gym servers, under relax-gym up"
        add(part, f"/proc/{pid}/stat")
    return parts


async def measure(
    run_one: Callable[[int], Awaitable[None]], trials: int, concurrency: int
) -> tuple[float, float]:
    """(wall s per trial, machine CPU s per trial) of `trials` runs, `concurrency` at a time."""
    slots = anyio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with slots:
            await run_one(index)

    wall, cpu = time.perf_counter(), busy_seconds()
    async with anyio.create_task_group() as group:
        for index in range(trials):
            group.start_soon(one, index)
    return (time.perf_counter() - wall) / trials * concurrency, (busy_seconds() - cpu) / trials


def task_of(row: dict[str, Any]) -> dict[str, Any]:
    return {"messages": row["input"], "metadata": row["metadata"]}


def trial_request(row: dict[str, Any], policy_url: str) -> CreateTrialRequest:
    body = {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": f"overhead-{os.getpid()}-{next(_ids)}",
        "session": {"session_id": "overhead-session", "group_id": "g", "rollout_mode": "eval"},
        "environment": {"name": ENVIRONMENT, "config": CONFIG, "task": task_of(row)},
        "model_endpoint": {"base_url": policy_url, "api_key": "overhead-key", "model": "policy"},
        "interrupt_policy": "protected",
        "deadline_s": 600,
        "lease_s": 600,
    }
    return parse_create_request(json.dumps(body))


async def main(trials: int, rounds: int, split: bool) -> None:
    hooks = make_plugin_manager()
    definition = hooks.environments.get(ENVIRONMENT)
    rows = example_rows(hooks, ENVIRONMENT)
    policy = ScriptedPolicy(
        one_tool_then_answer
    ).start()  # for trials: Relax's wire shape, under /agentic_api
    direct_policy = ThreadedServer(nemo_gym_policy())  # for the agent called straight
    direct_policy.start()
    port = httpx.URL(direct_policy.url).port or 0
    options = ClientOptions()  # the thin client's defaults: long polls, 1 s at most each
    best: dict[tuple[str, int], tuple[float, float]] = {}
    # Each round's own ratios too: both paths of a level run back to back, so load that moves between
    # rounds hits both, and the median of those pairs drifts less than the ratio of two bests.
    paired: dict[int, list[tuple[float, float]]] = {level: [] for level in LEVELS}
    splits: dict[str, dict[str, float]] = {}  # --split: path -> part -> CPU s per trial
    try:
        with (
            run_gym_servers(servers_of([definition]), gateway_host="127.0.0.1", gateway_port=port) as direct,
            start_up([ENVIRONMENT]) as gateway,
        ):
            run_url = f"{direct[definition.agent].url}/run"
            async with (
                httpx.AsyncClient(trust_env=False, timeout=None) as http,
                GatewayClient(gateway.url, options=options) as client,
            ):

                async def nemo_gym(index: int) -> None:
                    task = task_of(rows[index % len(rows)])
                    body = definition.build_run_body(task, Generation(), f"{next(_ids)}-0")
                    answer = await http.post(run_url, json=body)
                    answer.raise_for_status()

                async def relax_gym(index: int) -> None:
                    request = trial_request(rows[index % len(rows)], policy.base_url)
                    snapshot = await run_trial(request, client=client)
                    if snapshot.cleanup in (None, CleanupState.PENDING):  # as a rollout does: asked if
                        await client.settled(request.request_id, timeout_s=120)  # not known yet

                # The scripted policy records every request it answers (for tests to read). Kept across
                # rounds, thousands of parsed workplace bodies made every full collection of this process
                # (the trials' clients, both policy stand-ins) slower, round after round, on the trials'
                # side only: cleared before each measure.
                await measure(nemo_gym, len(rows), 1)  # warm both paths
                await measure(relax_gym, len(rows), 1)
                paths = (("nemo_gym", nemo_gym), ("relax_gym", relax_gym))
                for round_index in range(rounds):
                    for level in LEVELS:
                        this_round = {}
                        # Each path first in every other round: neither always runs second.
                        for name, path in paths if round_index % 2 == 0 else paths[::-1]:
                            policy.clear()  # see below
                            wall, cpu = await measure(path, trials, level)
                            kept = best.get((name, level), (wall, cpu))
                            best[(name, level)] = (min(wall, kept[0]), min(cpu, kept[1]))
                            this_round[name] = (wall, cpu)
                        (aw, ac), (bw, bc) = this_round["nemo_gym"], this_round["relax_gym"]
                        paired[level].append((bw / aw, bc / ac))
                for name, path in paths if split else ():
                    policy.clear()
                    before = cpu_by_part(gateway.pid)
                    await measure(path, trials, LEVELS[-1])
                    after = cpu_by_part(gateway.pid)
                    splits[name] = {
                        part: (after[part] - before.get(part, 0)) * TICK_S / trials for part in after
                    }
    finally:
        policy.stop()
        direct_policy.stop()
    print(f"{'concurrency':>11} {'NeMo Gym ms':>12} {'relax-gym ms':>13} {'wall x':>7} "
          f"{'NeMo Gym CPU ms':>16} {'relax-gym CPU ms':>17} {'CPU x':>6} "
          f"{'rounds: wall x, CPU x':>26}")  # fmt: skip
    for level in LEVELS:
        (aw, ac), (bw, bc) = best[("nemo_gym", level)], best[("relax_gym", level)]
        walls, cpus = zip(*paired[level], strict=True)
        rounds_text = f"median {statistics.median(walls):.2f}, {statistics.median(cpus):.2f}"
        print(f"{level:>11} {aw * 1e3:>12.1f} {bw * 1e3:>13.1f} {bw / aw:>7.2f} "
              f"{ac * 1e3:>16.1f} {bc * 1e3:>17.1f} {bc / ac:>6.2f} {rounds_text:>26}")  # fmt: skip
    print("targets: wall <= 1.05x, CPU <= 1.10x (per trial; wall is per trial per slot at concurrency > 1)")
    if splits:
        print(f"\nCPU ms per trial at concurrency {LEVELS[-1]}, part by part (one more run of each path):")
        print(f"{'part':>42} {'NeMo Gym':>9} {'relax-gym':>10}")
        for part in sorted({part for figures in splits.values() for part in figures}):
            a, b = (splits[name].get(part, 0.0) * 1e3 for name in ("nemo_gym", "relax_gym"))
            if a or b:
                print(f"{part:>42} {a:>9.2f} {b:>10.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--split", action="store_true", help="then CPU per trial, process by process")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.trials, arguments.rounds, arguments.split))
