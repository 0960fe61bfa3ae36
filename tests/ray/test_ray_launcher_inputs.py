"""RayLauncher without a cluster: bad input is refused before any process starts, and Ray stays inside the
NeMo Gym environment (only ray_host imports it; the launcher runs it as a process)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from relax_gym_core.errors import ConfigError
from relax_gym_core.replicas.ray import DEFAULT_RESOURCES, RayLauncher, _checked_resources

SRC = Path(__file__).resolve().parents[2] / "src" / "relax_gym_core"


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"CPU": -1}, "'CPU' must be a non-negative number"),
        ({"relax_gym_replica": float("nan")}, "'relax_gym_replica' must be a non-negative number"),
        ({"CPU": True}, "'CPU' must be a non-negative number"),
        ({"": 1}, "'' must be a non-negative number"),
    ],
)
def test_bad_resources_are_refused_before_anything_starts(resources: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RayLauncher("127.0.0.1:1", resources)


def test_resources_default_to_one_cpu_and_are_kept_as_given() -> None:
    assert _checked_resources(None) == _checked_resources({}) == dict(DEFAULT_RESOURCES) == {"CPU": 1.0}
    assert _checked_resources({"CPU": 2, "relax_gym_replica": 1}) == {"CPU": 2.0, "relax_gym_replica": 1.0}


def test_an_empty_address_is_refused() -> None:
    with pytest.raises(ConfigError, match="the Ray cluster address must not be empty"):
        RayLauncher("  ")


def _imports_ray(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        if any(name == "ray" or name.startswith("ray.") for name in names):
            return True
    return False


def test_only_ray_host_imports_ray() -> None:
    importing = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if _imports_ray(p))
    assert importing == ["replicas/ray_host.py"]
    launcher = (SRC / "replicas" / "ray.py").read_text()
    assert "import ray_host" not in launcher and "from relax_gym_core.replicas.ray_host" not in launcher
