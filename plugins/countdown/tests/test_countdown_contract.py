"""The environment countdown against relax-gym's conformance kit:
registration, conversion, result mapping, and its probes scored by its real verifier (a NeMo Gym server
the kit starts)."""

from __future__ import annotations

from typing import Any

from relax_gym_core.testing import EnvironmentContract

from relax_gym_countdown.plugin import example_rows


class TestCountdownContract(EnvironmentContract):
    environment = "countdown"

    def rows(self) -> list[dict[str, Any]]:
        return example_rows()
