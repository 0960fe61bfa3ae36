"""Rollout throughput: `relax-gym rollout` against the echo environment at concurrency 256, as a ratio to
driving the same trials through the trial API directly (run_trial, same client options, same requests).

Run: .venv/bin/python bench/rollout.py [--trials 3000] [--rounds 2]  (or `make bench`). One real
`relax-gym serve` (echo, 256 slots) serves every driver; each round runs them all, in rotating order, so
background load hits them alike, and the best round of each is kept. Exits 0 whatever the figures are: a
slow machine shows MISS, it does not fail.

Every driver is a Python process of its own (none shares a GIL with this script's policy server):
- direct: 256 trials in flight through one GatewayClient, each `await run_trial(...)` in an anyio task group
  (as the rollout runs them); trials/s over the loop's wall time. The reference.
- direct from asyncio tasks: the same, each run_trial in a plain asyncio task (asyncio.gather), the way
  asyncio code that imports the client would call it. Information only.
- rollout: the CLI writing trials.jsonl (one fsynced line per trial), summary.json and the live view's plain
  lines; trials/s over the span of its trials (first create to last end, from trials.jsonl), and over the
  whole command (interpreter start-up, policy check and summary included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple

import anyio

from relax_gym_core.client import run_trial
from relax_gym_core.errors import RelaxGymError
from relax_gym_core.protocol import InterruptPolicy
from relax_gym_core.rollout.data import DataRow, Route
from relax_gym_core.rollout.policy import check_policy
from relax_gym_core.rollout.run import (
    Planned,
    ReplayAwareClient,
    TrialSettings,
    build_request,
    client_options,
)
from relax_gym_core.testing.web import ScriptedPolicy, start_gateway

CONCURRENCY = 256
SPECS = {
    "echo": {"environment": "echo", "runtime": "echo", "max_concurrency": CONCURRENCY, "queue_capacity": 1024}
}
TARGET_RATIO = 0.8  # the rollout's bookkeeping (records, fsync, live view) may cost at most a fifth
DIRECT_MODES = ("anyio", "asyncio")


class Row(NamedTuple):
    figure: str
    value: str
    target: str
    ok: bool | None


def echo_rows(count: int) -> list[DataRow]:
    """`count` echo rows (reward 1.0 at once), as the rollout reads them from a file."""
    return [
        DataRow(
            i + 1,
            Route("echo", "echo"),
            {"messages": [{"role": "user", "content": f"task {i}"}], "metadata": {"echo": {}}},
            f"{i:016x}",
            None,
        )
        for i in range(count)
    ]


def write_rows(path: Path, rows: list[DataRow]) -> None:
    lines = (json.dumps({"input": row.task["messages"], "metadata": row.task["metadata"]}) for row in rows)
    path.write_text("".join(line + "\n" for line in lines))


async def direct(
    gateway_url: str, policy_url: str, rows: list[DataRow], run_id: str, mode: str
) -> tuple[float, int]:
    """(trials/s, trials that failed) of run_trial driven straight at the gateway, CONCURRENCY at a time."""
    settings = TrialSettings(
        run_id=run_id,
        policy=check_policy(policy_url, model=None, key=None, key_variable=None),
        oracle=None,
        deadline_s=lambda _env: 900.0,
        interrupt_policy=lambda _env: InterruptPolicy.PROTECTED,
    )
    failed = 0
    async with ReplayAwareClient(gateway_url, options=client_options(CONCURRENCY)) as client:

        async def one(row: DataRow, release: Callable[[], None]) -> None:
            nonlocal failed
            try:
                snapshot = await run_trial(build_request(settings, Planned(row, 1), 1), client=client)
            except RelaxGymError:
                failed += 1
            else:
                failed += snapshot.reward != 1.0
            finally:
                release()

        started = time.perf_counter()
        if mode == "anyio":
            slots = anyio.Semaphore(CONCURRENCY)
            async with anyio.create_task_group() as tg:
                for row in rows:
                    await slots.acquire()
                    tg.start_soon(one, row, slots.release)
        else:
            gate = asyncio.Semaphore(CONCURRENCY)
            tasks: list[Awaitable[None]] = []
            for row in rows:
                await gate.acquire()
                tasks.append(asyncio.create_task(one(row, gate.release)))
            await asyncio.gather(*tasks)
        return len(rows) / (time.perf_counter() - started), failed


def direct_in_subprocess(
    gateway_url: str, policy_url: str, data: Path, run_id: str, mode: str
) -> tuple[float, int]:
    command = [sys.executable, __file__, "--direct", gateway_url, policy_url, str(data), run_id, mode]
    answer = subprocess.run(command, check=True, capture_output=True, text=True)
    rate, failed = json.loads(answer.stdout.strip().splitlines()[-1])
    return float(rate), int(failed)


def rollout(gateway_url: str, policy_url: str, data: Path, out: Path, count: int) -> tuple[float, float, int]:
    """(trials/s over its trials' span, trials/s over the whole command, trials not scored 1.0 or not run)
    of `relax-gym rollout`."""
    command = [sys.executable, "-m", "relax_gym_core.cli", "rollout", "echo", "--data", str(data)]
    command += ["--policy", policy_url, "--concurrency", str(CONCURRENCY), "--out", str(out)]
    command += ["--gateway", gateway_url]
    started = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    whole = time.perf_counter() - started
    path = out / "trials.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if not lines:
        return 0.0, 0.0, count
    first = min(line["timings"]["started_at"] for line in lines)
    last = max(line["timings"]["started_at"] + line["timings"]["total_s"] for line in lines)
    failed = count - sum(1 for line in lines if line["reward"] == 1.0)
    return len(lines) / (last - first), len(lines) / whole, failed


def print_table(rows: list[Row]) -> None:
    header = Row("figure", "value", "target", None)
    widths = [
        max(len((row.figure, row.value, row.target)[column]) for row in (header, *rows))
        for column in range(3)
    ]
    for row in (header, *rows):
        verdict = "ok?" if row is header else "" if row.ok is None else "ok" if row.ok else "MISS"
        cells = (row.figure.ljust(widths[0]), row.value.rjust(widths[1]), row.target.ljust(widths[2]))
        print("  ".join((*cells, verdict)).rstrip())


def measure(trials: int, rounds: int) -> tuple[dict[str, float], dict[str, int]]:
    best = dict.fromkeys(("anyio", "asyncio", "span", "whole"), 0.0)
    errors = dict.fromkeys(("anyio", "asyncio", "rollout"), 0)
    drivers = [*DIRECT_MODES, "rollout"]
    with tempfile.TemporaryDirectory(prefix="relax-gym-bench-") as tmp, ScriptedPolicy() as policy:
        data = Path(tmp) / "rows.jsonl"
        write_rows(data, echo_rows(trials))
        with start_gateway(SPECS) as gateway:
            for round_ in range(rounds):
                for driver in drivers[round_ % 3 :] + drivers[: round_ % 3]:
                    if driver == "rollout":
                        out = Path(tmp) / f"out{round_}"
                        span, whole, failed = rollout(gateway.url, policy.base_url, data, out, trials)
                        best["span"], best["whole"] = max(best["span"], span), max(best["whole"], whole)
                    else:
                        run_id = f"direct-{driver}-{round_}"
                        rate, failed = direct_in_subprocess(
                            gateway.url, policy.base_url, data, run_id, driver
                        )
                        best[driver] = max(best[driver], rate)
                    errors[driver] += failed
    return best, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3000)  # seconds a driver: fewer would time start-up
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--direct", nargs=5, metavar=("GATEWAY", "POLICY", "DATA", "RUN_ID", "MODE"), help="(internal)"
    )
    args = parser.parse_args()
    if args.direct:
        gateway_url, policy_url, data, run_id, mode = args.direct
        rows = echo_rows(len(Path(data).read_text().splitlines()))
        print(json.dumps(anyio.run(direct, gateway_url, policy_url, rows, run_id, mode)))
        return 0
    started, load = time.perf_counter(), os.getloadavg()[0]
    best, errors = measure(args.trials, args.rounds)
    ratio = best["span"] / best["anyio"] if best["anyio"] else 0.0
    print_table(
        [
            Row(
                f"direct run_trial, {CONCURRENCY} in flight",
                f"{best['anyio']:,.0f} trials/s",
                "(the reference)",
                None,
            ),
            Row("relax-gym rollout, over its trials", f"{best['span']:,.0f} trials/s", "", None),
            Row("rollout / direct", f"{ratio:.2f}", f">= {TARGET_RATIO}", ratio >= TARGET_RATIO),
            Row(
                "relax-gym rollout, whole command",
                f"{best['whole']:,.0f} trials/s",
                "(start-up included)",
                None,
            ),
            Row(
                "direct run_trial from asyncio tasks",
                f"{best['asyncio']:,.0f} trials/s",
                "(information)",
                None,
            ),
            Row(
                "failed or unscored trials: direct / rollout",
                f"{errors['anyio'] + errors['asyncio']} / {errors['rollout']}",
                "0 / 0",
                errors["anyio"] + errors["asyncio"] + errors["rollout"] == 0,
            ),
        ]
    )
    print(
        f"({args.trials} echo trials per driver and round, best of {args.rounds}; "
        f"{time.perf_counter() - started:.0f} s on {os.cpu_count()} CPUs; load average {load:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end: wall-clock figures assume an otherwise idle machine)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
