"""Fixtures of the workplace plugin's tests: a plugin manager with only this plugin, and upstream's
example rows read from the installed nemo-gym package."""

from __future__ import annotations

from typing import Any

import pytest
from relax_gym_core.testing import Hooks, plugin_hooks

from relax_gym_workplace import plugin
from relax_gym_workplace.plugin import example_rows


@pytest.fixture
def hooks() -> Hooks:
    return plugin_hooks("workplace", plugin)


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return example_rows()
