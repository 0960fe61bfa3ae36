"""Processes of a rollout on this host, read from /proc (standard library only: servers inside the NeMo
Gym environment use it to prove that nothing a trial started is left)."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Not gone and not a zombie (a zombie holds no resources; it only awaits its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :][:1] not in ("Z", "X")
