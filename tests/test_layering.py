"""The dependency rules that keep the tree readable: Relax imports the protocol and the thin client, so
they must not drag in the gateway's web stack; the trial state machine imports no HTTP framework; the
packages depend in one direction (protocol and the plugin API beside it -> trials -> runtimes/bridge ->
gateway -> commands); plugins use only the core's public API."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "relax_gym_core"

# What each part of relax_gym_core may import from relax_gym_core (besides itself), every import counted
# (module level, inside functions, under TYPE_CHECKING). Read top to bottom, it is the architecture.
BASE = {"errors", "ingym"}
# The library below the commands: what the rollout engine, the commands and the test support build on.
SERVICE = {
    "protocol",
    "observe",
    "trials",
    "trajectories",
    "plugin",
    "runtimes",
    "replicas",
    "bridge",
    "web",
    "gym",
}
SERVICE |= {"gateway"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    # What servers inside the NeMo Gym environment import: the wire names and cleanup protocol (stdlib).
    "ingym": set(),
    "protocol": BASE,
    # The plugin API, beside the protocol: what plugins import (environment objects, the run-adapter seam,
    # the hooks that register them) and the host's face (plugin.host: the plugin manager and registries).
    # Light: no trial service, ledger, web or server.
    "plugin": BASE | {"protocol"},
    "jsonl": BASE,
    "observe": BASE | {"protocol"},
    # Each trial's run and model calls, recorded while it runs and kept with its record.
    "trajectories": BASE | {"protocol", "observe"},
    "trials": BASE | {"protocol", "observe", "plugin", "trajectories"},
    "runtimes": BASE | {"protocol", "observe", "plugin"},
    "gym": BASE | {"protocol", "plugin", "policies"},  # a replay probe answers from the recorded turns
    "replicas": BASE | {"protocol", "observe", "plugin", "runtimes", "gym"},
    "web": BASE | {"protocol"},
    "bridge": BASE | {"protocol", "observe", "trials", "trajectories", "plugin", "web"},
    "gateway": BASE
    | {"protocol", "observe", "trials", "trajectories", "plugin", "runtimes", "replicas", "bridge"}
    | {"web"},
    "client": BASE | {"protocol"},
    # The scripted model servers: the tests' stand-in policy and the rollout's oracle.
    "policies": BASE | {"protocol", "plugin"},
    # `relax-gym rollout`: trials through the thin client, against a policy endpoint or the oracle.
    "rollout": BASE | SERVICE | {"client", "policies", "jsonl"},
    "commands": BASE | SERVICE | {"client", "policies", "jsonl", "rollout"},
    "cli": BASE | {"commands", "rollout"},
    # Public test support: may use all of the library, never the command line.
    "testing": BASE | SERVICE | {"client", "policies", "jsonl"},
}
# The public API a plugin distribution may import (its tests may also use the test support).
PLUGIN_API = {
    "",
    "plugin",
    "plugin.runs",
    "plugin.reference",
    "protocol",
    "errors",
    "gym.installed",
    "ingym",
    "ingym.sandbox",
    "ingym.processes",
}
# Their tests may also use the test support and start NeMo Gym servers.
PLUGIN_TEST_PARTS = ("testing", "gym")
# relax_gym_core.plugin's names: the author's face, exactly. The host's parts (the plugin manager, the
# registry, the checks it applies) are relax_gym_core.plugin.host's, which is not in PLUGIN_API.
AUTHOR_FACE = {
    "EnvironmentDefinition",
    "EnvironmentRegistrar",
    "RuntimeRegistrar",
    "hookimpl",
    "NemoGymServer",
    "resources_server",
    "agent_server",
    "simple_agent",
    "POLICY_MODEL",
    "CleanupContract",
    "CleanupURLs",
    "STATELESS",
    "VerifierProbe",
    "answer",
    "function_call",
    "message",
    "verify_body",
    "RunResult",
    "reference",
    "JudgeEndpoint",
    "JudgeVariables",
    "judge_endpoint",
    "RowError",
    "EnvironmentFailure",
}


def _part(module: str) -> str:
    """The ALLOWED key a relax_gym_core submodule belongs to."""
    return module.removeprefix("relax_gym_core").removeprefix(".").split(".")[0]


def _imports(path: Path, package: str) -> set[str]:
    """Every relax_gym_core module `path` imports (relative imports resolved against `package`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{node.module}" if node.module else parent
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    return {name for name in found if name == "relax_gym_core" or name.startswith("relax_gym_core.")}


def _module_of(path: Path) -> tuple[str, str]:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    package = module if parts[-1] == "__init__" else module.rsplit(".", 1)[0]
    return module, package


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (SRC.parent / relative).with_suffix(".py").is_file() or (SRC.parent / relative).is_dir()


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_each_part_imports_only_what_is_below_it(part: str) -> None:
    offending: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        module, package = _module_of(path)
        if _part(module) != part:
            continue
        for imported in sorted(_imports(path, package)):
            if not _is_module(imported) or imported == "relax_gym_core":
                continue  # a name imported from a module, or the lazy top-level package
            target = _part(imported)
            if target != part and target not in ALLOWED[part]:
                offending.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert offending == []


def test_every_part_is_placed() -> None:
    parts = {_part(_module_of(path)[0]) for path in SRC.rglob("*.py")} - {""}
    assert parts - set(ALLOWED) == set()  # no exemption: test support and commands are placed too


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "plugins").glob("*/src/**/*.py")) + sorted((ROOT / "plugins").glob("*/tests/**/*.py")),
)
def test_plugins_use_only_the_public_api(path: Path) -> None:
    in_tests = "tests" in path.relative_to(ROOT).parts[2:3]
    used = {
        imported.removeprefix("relax_gym_core").removeprefix(".")
        for imported in _imports(path, "plugin")
        if _is_module(imported)
    }
    beyond = {
        name for name in used - PLUGIN_API if not (in_tests and name.split(".")[0] in PLUGIN_TEST_PARTS)
    }
    assert beyond == set(), f"{path.relative_to(ROOT)} reaches past relax_gym_core's public API"


def test_the_plugin_api_exports_the_authors_face_only() -> None:
    # A name added to relax_gym_core.plugin is a name every plugin author reads: it grows on purpose, here.
    api = importlib.import_module("relax_gym_core.plugin")
    host = importlib.import_module("relax_gym_core.plugin.host")
    assert sorted(api.__all__) == sorted(AUTHOR_FACE)
    assert len(api.__all__) == len(set(api.__all__))
    assert set(host.__all__).isdisjoint(api.__all__)  # each name has one face
    assert all(hasattr(module, name) for module in (api, host) for name in module.__all__)


WEB = ("starlette", "uvicorn", "aiohttp", "pyreqwest", "relax_gym_core.gateway", "relax_gym_core.bridge")
HEAVY = ("torch", "sglang", "megatron")


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("relax_gym_core.protocol", (*WEB, "httpx", *HEAVY)),
        # The client's HTTP transport is aiohttp's client (client/transport.py); its server side is not.
        ("relax_gym_core.client", (*(m for m in WEB if m != "aiohttp"), "aiohttp.web", *HEAVY)),
        ("relax_gym_core.trials.book", (*WEB, "httpx", *HEAVY)),
        ("relax_gym_core.trials", ("starlette", "uvicorn", "relax_gym_core.gateway", *HEAVY)),
        # Importing a plugin imports no trial service, ledger, HTTP framework or server.
        ("relax_gym_core.plugin", (*WEB, "httpx", "relax_gym_core.trials", "sqlite3", *HEAVY)),
        # ... nor does the host's face: the commands and the test support import it.
        ("relax_gym_core.plugin.host", (*WEB, "httpx", "relax_gym_core.trials", "sqlite3", *HEAVY)),
        # What runs inside the NeMo Gym environment: the standard library only.
        ("relax_gym_core.ingym", ("attrs", "cattrs", "pluggy", "httpx", *WEB, *HEAVY)),
        ("relax_gym_core.ingym.sandbox", ("attrs", "cattrs", "pluggy", "httpx", *WEB, *HEAVY)),
        # ... and the catalogue's server classes, which the plugin reads its tables from.
        ("relax_gym_catalogue.servers", ("attrs", "cattrs", "pluggy", "httpx", "yaml", *WEB, *HEAVY)),
        ("relax_gym_core.observe", (*WEB, "httpx", *HEAVY)),
    ],
)
def test_module_imports_stay_light(module: str, forbidden: tuple[str, ...]) -> None:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout)
    offending = sorted(
        name for name in loaded if any(name == f or name.startswith(f + ".") for f in forbidden)
    )
    assert offending == []
