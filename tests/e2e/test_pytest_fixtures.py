"""The relax_gym pytest plugin's server fixtures: tests that use them are e2e by themselves, a session shares
one server set per environment, the model slot answers with the app a test installs, and a Verifier turns
a verifier's answer into a reward or a clear failure."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from relax_gym_core.testing.gym import GymServers, ModelSlot, Verifier, VerifierError
from relax_gym_core.testing.web import GatewayProcess

SUITE = """
import pytest


def test_plain():
    pass


def test_verifier(relax_gym_verifier):
    pass


def test_servers(relax_gym_servers):
    pass


@pytest.fixture
def stack(relax_gym_up):
    return relax_gym_up


def test_up_through_a_fixture(stack):
    pass


@pytest.mark.nemo_gym("some_env")
def test_fresh_up(relax_gym_fresh_up):
    pass


@pytest.mark.nemo_gym("some_env", env={"A": "1"})
def test_marked_only():
    pass
"""


def test_tests_using_servers_are_e2e_by_themselves(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not e2e"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line for line in result.stdout.splitlines() if "::" in line] == ["test_suite.py::test_plain"]
    assert "1/6 tests collected (5 deselected)" in result.stdout


GROUPED = """
import pytest

pytestmark = pytest.mark.nemo_gym("env_a")


@pytest.mark.parametrize("n", range(6))
def test_shares_the_set(relax_gym_up, n):
    pass  # the fixture is asked for, never called: no server starts


@pytest.mark.parametrize("n", range(6))
def test_plain(n):
    pass
"""


def test_under_xdist_the_tests_of_one_server_set_run_on_one_worker(tmp_path: Path) -> None:
    """--dist loadgroup with the plugin's groups: the set starts on one worker, not on each (this broke
    silently once, with pytest 9.2 and pytest-xdist 3.8)."""
    for module in ("test_one.py", "test_two.py"):
        (tmp_path / module).write_text(textwrap.dedent(GROUPED))
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    workers: dict[str, set[str]] = {}
    for line in result.stdout.splitlines():
        if "PASSED" in line and line.startswith("[gw"):
            worker, test = line.split()[0], line.split()[-1]
            workers.setdefault("grouped" if "test_shares_the_set" in test else "plain", set()).add(worker)
    assert len(workers["grouped"]) == 1, result.stdout  # all 12, both modules, on one worker
    assert workers["plain"], result.stdout


INNER = """
import pathlib

import httpx
import pytest


@pytest.mark.nemo_gym("workplace_assistant")
def test_a_verifier_answers(relax_gym_verifier):
    verifier = relax_gym_verifier("workplace_assistant")
    assert httpx.get(verifier.url + "/relax_gym/sessions", trust_env=False, timeout=30).status_code == 200
    pathlib.Path("url.txt").write_text(verifier.url)
"""


@pytest.mark.e2e
@pytest.mark.slow  # a session of its own, with a server of its own
def test_a_session_stops_the_servers_it_started(tmp_path: Path) -> None:
    pytest.importorskip("relax_gym_workplace")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    url = (tmp_path / "url.txt").read_text()
    with pytest.raises(httpx.ConnectError):  # nobody listens there any more
        httpx.get(f"{url}/relax_gym/sessions", trust_env=False, timeout=30)


def app_answering(path: str, status: int, body: Any) -> Starlette:
    async def answer(_request: Request) -> JSONResponse:
        return JSONResponse(body, status)

    return Starlette(routes=[Route(path, answer, methods=["POST"])])


@pytest.fixture(scope="module")
def slot() -> Iterator[ModelSlot]:
    model = ModelSlot()
    model.start()
    yield model
    model.stop()


def test_the_model_slot_answers_with_the_installed_app(slot: ModelSlot) -> None:
    def call() -> httpx.Response:
        return httpx.post(f"{slot.url}/v1/responses", json={}, trust_env=False, timeout=30)

    assert call().status_code == 503  # nobody installed a model: a call fails loudly
    with slot.serving(app_answering("/v1/responses", 200, {"id": "outer"})):
        assert call().json() == {"id": "outer"}
        with slot.serving(app_answering("/v1/responses", 200, {"id": "inner"})):
            assert call().json() == {"id": "inner"}
        assert call().json() == {"id": "outer"}
    assert call().status_code == 503


@pytest.mark.parametrize(
    ("status", "body", "reward"),
    [
        (200, {"reward": 1}, 1.0),
        (200, {"reward": 0.25, "extra": "kept"}, 0.25),
        (422, {"detail": "bad"}, None),
    ],
)
def test_a_verifier_gives_a_float_or_fails_clearly(
    slot: ModelSlot, status: int, body: Any, reward: float | None
) -> None:
    verify = Verifier(slot.url)
    row = {"responses_create_params": {"input": [{"role": "user", "content": "q"}]}}
    with slot.serving(app_answering("/verify", status, body)):
        if reward is None:
            with pytest.raises(VerifierError, match="HTTP 422"):
                verify(row, [])
        else:
            assert verify(row, []) == reward


@pytest.mark.parametrize("body", [{"reward": True}, {"reward": "1.0"}, {}])
def test_an_answer_without_a_numeric_reward_is_a_failure(slot: ModelSlot, body: Any) -> None:
    with slot.serving(app_answering("/verify", 200, body)), pytest.raises(VerifierError, match="no numeric"):
        Verifier(slot.url)({"responses_create_params": {"input": []}}, [])


@pytest.mark.nemo_gym("workplace_assistant")
def test_one_server_set_per_environment_and_one_up_per_set(
    relax_gym_servers: Callable[..., GymServers],
    relax_gym_verifier: Callable[..., Verifier],
    relax_gym_up: Callable[..., GatewayProcess],
) -> None:
    pytest.importorskip("relax_gym_workplace")
    servers = relax_gym_servers("workplace_assistant")
    assert relax_gym_servers("workplace_assistant") is servers
    assert relax_gym_verifier("workplace_assistant") is servers.verify  # the verifier of the full set
    assert set(servers.urls) == {"workplace_assistant", "workplace_assistant_simple_agent"}
    assert (
        httpx.get(f"{servers.resources}/relax_gym/sessions", trust_env=False, timeout=30).status_code == 200
    )
    assert relax_gym_up("workplace_assistant") is relax_gym_up("workplace_assistant")
