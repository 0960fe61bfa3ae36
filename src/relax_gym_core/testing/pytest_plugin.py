"""pytest fixtures for relax-gym plugin authors (registered through the ``pytest11`` entry point).

    def test_contract(relax_gym_hooks):
        check_registration(relax_gym_hooks, "my_environment")

Each test gets a fresh plugin manager; nothing global is shared or monkeypatched between tests.
"""

from __future__ import annotations

import pytest

from relax_gym_core.environments import Hooks, make_plugin_manager


@pytest.fixture
def relax_gym_hooks() -> Hooks:
    """A fresh plugin manager with every installed plugin (minus $RELAX_GYM_DISABLE_PLUGINS)."""
    return make_plugin_manager()
