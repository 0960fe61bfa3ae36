"""What the catalogue's tests share: a catalogued server the installed NeMo Gym does not have is skipped by
name (the catalogue holds servers of later releases than CI's 0.4.0; they register only where they exist)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from relax_gym_core.gym.installed import gym_python
from relax_gym_core.gym.release import nemo_gym_release

from relax_gym_catalogue.upstream import installed


@pytest.fixture(scope="session")
def require_installed() -> Callable[[str], None]:
    """Skip the test when this NeMo Gym lacks the server, naming its version."""

    def require(name: str) -> None:
        if not installed(name):
            pytest.skip(f"not in this NeMo Gym ({nemo_gym_release(gym_python()).version})")

    return require
