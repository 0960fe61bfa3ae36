"""ingym.processes.alive: what servers inside NeMo Gym use to prove a trial's processes are gone."""

from __future__ import annotations

import os
import subprocess
import sys

from relax_gym_core.ingym.processes import alive


def test_a_running_process_is_alive_and_a_zombie_or_a_reaped_one_is_not() -> None:
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert alive(child.pid)
        assert child.stdin is not None
        child.stdin.close()  # it exits; until reaped it is a zombie, which holds nothing
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        assert not alive(child.pid)
    finally:
        child.wait()
    assert not alive(child.pid)
