"""Shared fixtures: a controllable clock, a factory for valid create bodies, trials kept in memory."""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis times its inputs and examples; these machines are shared and noisy, and nothing here is a
# timed assertion: a slow draw under load is not a failure (it failed a clean-clone run once).
settings.register_profile("relax-gym", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("relax-gym")

_ids = itertools.count()


class FakeClock:
    """Monotonic clock the test moves by hand (no sleeps)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def create_body(
    *,
    request_id: str | None = None,
    env: str = "echo",
    config: str = "echo",
    echo: dict[str, Any] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "protocol_version": "relax-nemo-gym/v1",
        "request_id": request_id or f"relax-test-{next(_ids)}",
        "session": {"session_id": "session-secret-token", "group_id": "g1", "rollout_mode": "train"},
        "environment": {
            "name": env,
            "config": config,
            "task": {"messages": [{"role": "user", "content": "hi"}], "metadata": {"echo": echo or {}}},
        },
        "model_endpoint": {
            "base_url": "http://127.0.0.1:9/v1",
            "api_key": "sk-secret-token",
            "model": "policy",
        },
        "interrupt_policy": "protected",
        "deadline_s": 600,
        "lease_s": 60,
    }
    for key, value in overrides.items():
        body[key] = copy.deepcopy(value)
    return body


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def make_body() -> Any:
    return create_body


@pytest.fixture(scope="session", autouse=True)
def _trials_in_memory_unless_asked() -> Iterator[None]:
    """Gateways this run starts without --state-dir keep trials in memory: no test writes to the user's
    data directory, and no two share a ledger. Tests of durability pass a directory of their own."""
    before = os.environ.get("RELAX_GYM_STATE_DIR")
    os.environ["RELAX_GYM_STATE_DIR"] = ":memory:"
    yield
    if before is None:
        del os.environ["RELAX_GYM_STATE_DIR"]
    else:
        os.environ["RELAX_GYM_STATE_DIR"] = before


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: slow tests, then those on real servers, then the rest. xdist hands out work in this
    order, so the quick tests fill in at the end and no worker runs a two-minute test alone."""

    def rank(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("e2e") else 2

    items.sort(key=rank)
