"""What a rollout shows while it runs: done / running / queued / failed, the mean reward so far, trials/s and
the ETA. A live panel (rich) on a terminal; a plain line every few seconds otherwise (logs, CI, pipes).

Counts are updated from the event loop (trials starting and ending) and from the trials.jsonl writer
(trials done once their line is on disk), hence the lock.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

import anyio
from attrs import frozen

from relax_gym_core.rollout.summary import is_scored

PLAIN_INTERVAL_S = 10.0
LIVE_INTERVAL_S = 0.25


@frozen(kw_only=True)
class Counts:
    planned: int
    done: int
    running: int
    queued: int
    failed: int
    mean_reward: float | None
    rate: float  # trials/s finished by this invocation
    eta_s: float | None


class Progress:
    def __init__(self, *, planned: int, finished: Mapping[Any, Mapping[str, Any]], queued: int) -> None:
        self._lock = threading.Lock()
        self._planned = planned
        self._done = len(finished)
        self._done_now = 0
        self._running = 0
        self._queued = queued
        scored = [float(record["reward"]) for record in finished.values() if is_scored(record)]
        self._failed = len(finished) - len(scored)
        self._reward_sum = math.fsum(scored)
        self._scored = len(scored)
        self._started = time.monotonic()

    def started(self) -> None:
        with self._lock:
            self._queued -= 1
            self._running += 1

    def left(self) -> None:
        with self._lock:
            self._running -= 1

    def stop_queue(self) -> None:
        with self._lock:
            self._queued = 0

    def durable(self, record: Mapping[str, Any]) -> None:
        with self._lock:
            self._done += 1
            self._done_now += 1
            if is_scored(record):
                self._scored += 1
                self._reward_sum += float(record["reward"])
            else:
                self._failed += 1

    @property
    def done_now(self) -> int:
        with self._lock:
            return self._done_now

    def counts(self) -> Counts:
        with self._lock:
            elapsed = max(time.monotonic() - self._started, 1e-9)
            rate = self._done_now / elapsed
            left = max(self._planned - self._done, 0)
            return Counts(
                planned=self._planned,
                done=self._done,
                running=self._running,
                queued=self._queued,
                failed=self._failed,
                mean_reward=self._reward_sum / self._scored if self._scored else None,
                rate=rate,
                eta_s=left / rate if rate > 0 else None,
            )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def plain_line(counts: Counts) -> str:
    mean = "-" if counts.mean_reward is None else f"{counts.mean_reward:.3f}"
    return (
        f"rollout: {counts.done}/{counts.planned} done, {counts.running} running, {counts.queued} queued, "
        f"{counts.failed} failed | mean reward {mean} | {counts.rate:.2f} trials/s | "
        f"ETA {_duration(counts.eta_s)}"
    )


def _is_terminal(stream: IO[str]) -> bool:
    return stream.isatty() and os.environ.get("TERM") != "dumb"


class LiveView:
    """Run `run()` as a task while trials run; cancel it when they are done (it then draws a last time)."""

    def __init__(self, progress: Progress, stream: IO[str] | None = None) -> None:
        self._progress = progress
        self._stream = stream or sys.stderr

    async def run(self) -> None:
        if _is_terminal(self._stream):
            try:
                await self._live()
            except ImportError:  # rich is the `rollout` extra; without it, plain lines
                pass
            else:
                return
        await self._plain()

    async def _plain(self) -> None:
        try:
            while True:
                await anyio.sleep(PLAIN_INTERVAL_S)
                print(plain_line(self._progress.counts()), file=self._stream, flush=True)
        finally:
            print(plain_line(self._progress.counts()), file=self._stream, flush=True)

    async def _live(self) -> None:
        from rich.console import Console  # noqa: PLC0415 - rich only when a terminal is watching
        from rich.live import Live  # noqa: PLC0415

        console = Console(file=self._stream)
        with Live(self._panel(), console=console, auto_refresh=False, transient=False) as live:
            try:
                while True:
                    await anyio.sleep(LIVE_INTERVAL_S)
                    live.update(self._panel(), refresh=True)
            finally:
                live.update(self._panel(), refresh=True)

    def _panel(self) -> Any:
        from rich.table import Table  # noqa: PLC0415

        counts = self._progress.counts()
        table = Table(title="relax-gym rollout", show_header=True, header_style="bold")
        for name in ("done", "running", "queued", "failed", "mean reward", "trials/s", "ETA"):
            table.add_column(name, justify="right")
        mean = "-" if counts.mean_reward is None else f"{counts.mean_reward:.3f}"
        table.add_row(
            f"{counts.done}/{counts.planned}",
            str(counts.running),
            str(counts.queued),
            f"[red]{counts.failed}[/red]" if counts.failed else "0",
            mean,
            f"{counts.rate:.2f}",
            _duration(counts.eta_s),
        )
        return table
