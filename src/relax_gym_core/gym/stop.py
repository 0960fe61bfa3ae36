"""Stopping processes we started, by PID: a signal, a bounded wait, then SIGKILL. Standard library only:
the Ray host (replicas/ray_host.py) runs it inside the NeMo Gym environment."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relax_gym_core.gym.spawn import ServerProcess


def stop_processes(
    processes: Iterable[subprocess.Popen[Any] | ServerProcess],
    sig: int = signal.SIGINT,
    timeout_s: float = 15.0,
) -> None:
    """`sig` to each process still running, then wait for them together (several stop in the time of the
    slowest, not their sum), then SIGKILL for any still running after timeout_s."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.send_signal(sig)
    stop = time.monotonic() + timeout_s
    for process in running:
        try:
            process.wait(timeout=max(0.0, stop - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop_process(
    process: subprocess.Popen[Any] | ServerProcess, sig: int = signal.SIGINT, timeout_s: float = 15.0
) -> None:
    """Stop a process we started: `sig`, then SIGKILL if it has not exited within timeout_s."""
    stop_processes([process], sig, timeout_s)
