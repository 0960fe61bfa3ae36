"""pytest fixtures for relax-gym plugin authors (registered through the ``pytest11`` entry point).

    def test_contract(relax_gym_hooks):
        check_registration(relax_gym_hooks, "my_environment")

    @pytest.mark.nemo_gym("my_environment")
    def test_probes(relax_gym_hooks, relax_gym_verifier):
        check_probes(relax_gym_hooks, "my_environment", relax_gym_verifier("my_environment"))

Fixtures:

- ``relax_gym_hooks``: a fresh plugin manager with every installed plugin, per test.
- ``relax_gym_verifier(environment, *, hooks=None) -> Verifier``: the environment's real verifying resources
  server, started once per session (environments with the same verifying server share it). A
  ``Verifier`` is ``verify(row, output) -> float`` (posts ``verify_body(row, output)`` to ``/verify``;
  what ``check_probes`` takes), ``.post(body)`` for a raw answer, ``.url`` for other routes.
- ``relax_gym_servers(environment, *, hooks=None) -> GymServers``: every server of the environment
  (resources server and agent), started once per session: ``.urls`` by server name, ``.resources``,
  ``.agent``, ``.verify`` (a Verifier), and ``.model``, the servers' policy_model: a ModelSlot that
  answers 503 until a test installs an ASGI app with ``with servers.model.serving(app): ...``.
- ``relax_gym_up(*environments, env=None, args=()) -> GatewayProcess``: ``relax-gym up ENV...`` (real
  servers + gateway; ``env``: extra variables for it; ``args``: extra arguments such as
  ``("--replicas", "2")``), once per session per set of environments, variables and arguments:
  ``.url`` (the gateway), ``.output`` (its printed lines), ``.process``.
- ``relax_gym_fresh_up -> GatewayProcess``: a ``relax-gym up`` of the test's ``nemo_gym`` environments (and
  ``env`` and ``args``) for this test alone, e.g. to signal it; started early like the shared ones, stopped
  after the test unless it has exited.

The servers run in the dedicated NeMo Gym environment ($RELAX_GYM_NEMO_GYM_PYTHON, else .gym/venv) and are
stopped, by PID, when the session ends. They are shared: tests must leave them as they found them (their
own rollout ids and sessions; count before and after, not from zero). ``relax_gym_servers`` and
``relax_gym_up`` need the gateway extra; ``relax_gym_verifier`` needs only the core.

Markers: ``e2e`` marks tests that need NeMo Gym servers or the real CLI (every test using the fixtures above
but ``relax_gym_hooks`` gets it automatically; ``-m "not e2e"`` leaves them out). ``nemo_gym(*environments,
env=None, args=())`` says which environments a test's server fixtures are for: those servers then start in
the background as soon as collection ends, while earlier tests run (``relax_gym_up`` with all the
environments together, ``env`` and ``args``, as the test will ask for it). Under pytest-xdist, run with
``--dist loadgroup``: the tests of one shared server set go to one worker (an ``xdist_group`` each), which
starts the set when its first test asks for it.

This module imports with the light core plus pytest: the rest is imported by the fixtures that use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from relax_gym_core.plugin.host import Hooks, make_plugin_manager

if TYPE_CHECKING:
    from relax_gym_core.testing.gym import GymServers, SharedServers, Verifier
    from relax_gym_core.testing.processes import GatewayProcess

SERVER_FIXTURES = ("relax_gym_verifier", "relax_gym_servers", "relax_gym_up", "relax_gym_fresh_up")
MARKERS = {
    "e2e": "needs real NeMo Gym servers or the real CLI (deselect with -m 'not e2e')",
    "nemo_gym(*environments, env=None, args=())": "the NeMo Gym environments whose shared servers the test "
    "uses (they start in the background when collection ends)",
}
_SHARED = pytest.StashKey["SharedServers"]()


def pytest_configure(config: pytest.Config) -> None:
    declared = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    for marker, help_text in MARKERS.items():
        if marker.split("(", 1)[0] not in declared:  # a project may describe them itself
            config.addinivalue_line("markers", f"{marker}: {help_text}")


@pytest.hookimpl(tryfirst=True)  # before -m selects (and xdist reads groups): a marker added here counts
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouping = config.pluginmanager.hasplugin("xdist")
    for item in items:
        uses_servers = any(name in SERVER_FIXTURES for name in getattr(item, "fixturenames", ()))
        if (uses_servers or item.get_closest_marker("nemo_gym")) and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.e2e)
        group = _xdist_group(item) if grouping else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _xdist_group(item: pytest.Item) -> str | None:
    """Under pytest-xdist (`-n N --dist loadgroup`), the tests of one shared server set run on one worker,
    so each set starts once per run, not once per worker."""
    environments, env, args = _nemo_gym(item)
    fixtures = set(getattr(item, "fixturenames", ()))
    kinds = [kind for kind in ("servers", "verifier", "up") if f"relax_gym_{kind}" in fixtures]
    if not environments or not kinds:
        return None
    extra = ",".join([*(f"{k}={v}" for k, v in env.items()), *args])
    return f"relax-gym:{'+'.join(kinds)}:{','.join(environments)}:{extra}"


def pytest_collection_finish(session: pytest.Session) -> None:
    # An xdist worker collects every test but runs only some: it starts what its tests ask for, when asked.
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    from relax_gym_core.testing.gym import Wanted  # noqa: PLC0415 - only when servers are used

    wanted: list[Wanted] = []
    for item in session.items:
        environments, env, args = _nemo_gym(item)
        if not environments:
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        for kind in ("servers", "verifier"):
            if f"relax_gym_{kind}" in fixtures:
                wanted.append(Wanted(kind, environments))
        if "relax_gym_up" in fixtures:
            wanted.append(Wanted("up", environments, tuple(env.items()), args=args))
        if "relax_gym_fresh_up" in fixtures:
            wanted.append(Wanted("fresh-up", environments, tuple(env.items()), owner=item.nodeid, args=args))
    if wanted:
        _shared(session.config).prestart(wanted)


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_shared(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_shared(config)  # when the session never finished (an internal error): nothing is left running


def _stop_shared(config: pytest.Config) -> None:
    shared = config.stash.get(_SHARED, None)
    if shared is not None:
        del config.stash[_SHARED]
        shared.close()


def _nemo_gym(item: pytest.Item) -> tuple[tuple[str, ...], dict[str, str], tuple[str, ...]]:
    """The environments, extra variables and extra `up` arguments of the item's nemo_gym markers (all of
    them together; the closest marker that gives arguments gives them)."""
    marks = list(item.iter_markers("nemo_gym"))
    environments = tuple(sorted({str(name) for mark in marks for name in mark.args}))
    env = {str(k): str(v) for mark in reversed(marks) for k, v in (mark.kwargs.get("env") or {}).items()}
    args = next((tuple(str(a) for a in mark.kwargs["args"]) for mark in marks if mark.kwargs.get("args")), ())
    return environments, dict(sorted(env.items())), args


def _shared(config: pytest.Config) -> SharedServers:
    shared = config.stash.get(_SHARED, None)
    if shared is None:
        from relax_gym_core.testing.gym import SharedServers  # noqa: PLC0415 - only when servers are used

        shared = config.stash[_SHARED] = SharedServers()
    return shared


@pytest.fixture
def relax_gym_hooks() -> Hooks:
    """A fresh plugin manager with every installed plugin (minus $RELAX_GYM_DISABLE_PLUGINS)."""
    return make_plugin_manager()


@pytest.fixture(scope="session")
def relax_gym_verifier(pytestconfig: pytest.Config) -> Callable[..., Verifier]:
    """``relax_gym_verifier(environment, *, hooks=None)``: its real verifier, shared by the session."""
    return _shared(pytestconfig).verifier


@pytest.fixture(scope="session")
def relax_gym_servers(pytestconfig: pytest.Config) -> Callable[..., GymServers]:
    """``relax_gym_servers(environment, *, hooks=None)``: all its servers, shared by the session."""
    return _shared(pytestconfig).servers


@pytest.fixture(scope="session")
def relax_gym_up(pytestconfig: pytest.Config) -> Callable[..., GatewayProcess]:
    """``relax_gym_up(*environments, env=None, args=())``: `relax-gym up` of these environments, shared."""
    return _shared(pytestconfig).up


@pytest.fixture
def relax_gym_fresh_up(
    request: pytest.FixtureRequest, pytestconfig: pytest.Config
) -> Iterator[GatewayProcess]:
    """`relax-gym up` of the test's ``nemo_gym`` environments for this test alone (it may stop it)."""
    environments, env, args = _nemo_gym(request.node)
    if not environments:
        pytest.fail("relax_gym_fresh_up needs the test marked @pytest.mark.nemo_gym(ENVIRONMENT, ...)")
    shared = _shared(pytestconfig)
    with shared.fresh_up(request.node.nodeid, *environments, env=env, args=args) as gateway:
        yield gateway
