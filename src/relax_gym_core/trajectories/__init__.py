"""Trajectories: each trial's run and model calls, kept with its record and served with it."""

from relax_gym_core.trajectories.fold import counts, fold_stream
from relax_gym_core.trajectories.store import (
    DEFAULT_MAX_BYTES,
    FORMAT,
    REDACTED,
    Recorder,
    TrajectoryStore,
    trajectory_path,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMAT",
    "REDACTED",
    "Recorder",
    "TrajectoryStore",
    "counts",
    "fold_stream",
    "trajectory_path",
]
