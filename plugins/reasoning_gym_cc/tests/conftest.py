"""Fixtures of the reasoning_gym_cc plugin's tests: a plugin manager with only this plugin."""

from __future__ import annotations

import pytest
from relax_gym_core.testing import Hooks, plugin_hooks

from relax_gym_reasoning_gym_cc import plugin


@pytest.fixture
def hooks() -> Hooks:
    return plugin_hooks("reasoning_gym_cc", plugin)
