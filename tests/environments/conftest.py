"""Fake plugin distributions: real dist-info directories on sys.path, found by importlib.metadata.

Every fake gets a unique top-level module name, so modules cached in sys.modules by one test never
satisfy another; they are dropped again at teardown. Entry points of plugins that happen to be
installed in the venv (the workplace plugin, ...) are blocked by the tests, so these tests neither
depend on nor break because of them.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from attrs import frozen

from relax_gym_core.plugin.manager import DISABLE_VAR, ENTRY_POINT_GROUP, TRACE_VAR

# A complete plugin: one environment run by a NeMo Gym simple agent over a math resource server, an
# EnvironmentDefinition subclass (`{methods}` is its class body: the reference behaviour unless a test
# overrides some of its methods) with a stateful cleanup contract on its resources server.
GOOD_PLUGIN = """
from relax_gym_core.plugin import (
    CleanupContract, EnvironmentDefinition, NemoGymServer, RowError, hookimpl, reference,
)

ENV = "{env}"


class Environment(EnvironmentDefinition):
{methods}


@hookimpl
def register_environments(registrar):
    registrar.add(
        Environment(
            name=ENV,
            configs=("default", "hard"),
            agent="simple_agent",
            description="math with a judge",
            servers=(
                NemoGymServer(
                    name="simple_agent",
                    kind="responses_api_agents",
                    implementation="simple_agent",
                    server_class="responses_api_agents.simple_agent.app:SimpleAgent",
                ),
                NemoGymServer(
                    name="math",
                    kind="resources_servers",
                    implementation="math_with_judge",
                    server_class="resources_servers.math_with_judge.app:MathResourcesServer",
                ),
            ),
            cleanup=CleanupContract(server="math", probe_path="/cleanup/{{rollout_id}}"),
        )
    )
"""


@frozen
class FakeDist:
    site: Path
    distribution: str
    version: str
    package: str  # the unique top-level package holding the plugin modules


# Entry points in group relax_gym really installed in this environment (blocked in these tests); read
# once, before any test puts a fake distribution on sys.path.
OTHER_PLUGINS = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def write_dist(
    root: Path,
    *,
    distribution: str,
    version: str = "1.2.3",
    entry_points: Mapping[str, str],
    modules: Mapping[str, str],
) -> FakeDist:
    """A dist-info + package under root/site; `{pkg}` in entry-point values is the package name."""
    site = root / "site"
    package = f"relax_gym_fake_{uuid.uuid4().hex[:12]}"
    dist_info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    lines = [f"{name} = {value.format(pkg=package)}" for name, value in entry_points.items()]
    (dist_info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n" + "\n".join(lines) + "\n")
    (site / package).mkdir()
    (site / package / "__init__.py").write_text("")
    for name, source in modules.items():
        (site / package / f"{name}.py").write_text(textwrap.dedent(source))
    return FakeDist(site=site, distribution=distribution, version=version, package=package)


@pytest.fixture
def install_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeDist]]:
    """Write a fake distribution and put it on sys.path for this test only."""
    installed: list[FakeDist] = []

    def install(**kwargs: object) -> FakeDist:
        dist = write_dist(tmp_path / f"dist{len(installed)}", **kwargs)  # type: ignore[arg-type]
        monkeypatch.syspath_prepend(str(dist.site))
        installed.append(dist)
        return dist

    yield install
    for dist in installed:
        for name in [name for name in sys.modules if name.split(".")[0] == dist.package]:
            del sys.modules[name]


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No inherited plugin switches; returns the installed entry points to block."""
    monkeypatch.delenv(DISABLE_VAR, raising=False)
    monkeypatch.delenv(TRACE_VAR, raising=False)
    return list(OTHER_PLUGINS)


def good_plugin(env: str, methods: str = "") -> str:
    """Source of a complete plugin module registering environment `env`, its class body `methods` (source
    at any indentation; the reference behaviour when empty)."""
    body = textwrap.indent(textwrap.dedent(methods).strip("\n"), "    ") if methods.strip() else "    pass"
    return GOOD_PLUGIN.format(env=env, methods=body)


@pytest.fixture(name="good_plugin")
def _good_plugin() -> Callable[..., str]:
    return good_plugin


@frozen
class CLI:
    """Runs `python -m relax_gym_core.cli` as a real process that sees only the given fake dists."""

    cwd: Path

    def __call__(
        self, *args: str, sites: tuple[Path, ...] = (), disable: tuple[str, ...] = ()
    ) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if k not in (DISABLE_VAR, TRACE_VAR, "PYTHONPATH")}
        if sites:
            environ["PYTHONPATH"] = os.pathsep.join(str(site) for site in sites)
        blocked = [*OTHER_PLUGINS, *disable]
        if blocked:
            environ[DISABLE_VAR] = ",".join(blocked)
        return subprocess.run(
            [sys.executable, "-m", "relax_gym_core.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.cwd,
            env=environ,
            check=False,
        )


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    return CLI(cwd=tmp_path)
