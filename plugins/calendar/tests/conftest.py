"""Fixtures of the calendar plugin's tests: a plugin manager with only this plugin, and upstream's
example rows read from the installed nemo-gym package."""

from __future__ import annotations

from typing import Any

import pytest
from relax_gym_core.testing import Hooks, plugin_hooks

from relax_gym_calendar import plugin
from relax_gym_calendar.plugin import example_rows


@pytest.fixture
def hooks() -> Hooks:
    return plugin_hooks("calendar", plugin)


@pytest.fixture(scope="session")
def rows() -> list[dict[str, Any]]:
    return example_rows()
