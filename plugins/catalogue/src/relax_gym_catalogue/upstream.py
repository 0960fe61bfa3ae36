"""The installed NeMo Gym's own files for a catalogued server, read in place at run time (never copied):
its config (``resources_servers/<name>/configs/<config>.yaml``), the classes its ``app.py`` files run,
its example rows and its recorded rollouts.

The NeMo Gym tree is found once per process, through the NeMo Gym environment's python (one subprocess,
relax_gym_core.gym.installed); the YAML is read here with PyYAML (its C loader where built), the class a
server runs from its ``app.py`` (servers.main_class: parsed, never imported; the core never imports NeMo
Gym). An installed package does not change under a running process, so each server is read once: every
plugin manager registers the catalogue, and a test or a CLI run may build several.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from attrs import frozen
from relax_gym_core.gym.installed import installed_file, read_jsonl

from relax_gym_catalogue.servers import main_class

AGENT_KIND = "responses_api_agents"
RESOURCES_KIND = "resources_servers"
_LAUNCHER_KEYS = frozenset({"entrypoint", "datasets", "host", "port"})  # the launcher's, not the instance's
_WIRED_KEYS = frozenset({"resources_server", "model_server"})  # agent_server() wires these itself
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the same documents, eight times faster


class UpstreamError(Exception):
    """What is wrong with an installed server's files (names the file)."""


class NotInstalled(UpstreamError):
    """The server is not in this NeMo Gym at all (a server of a later NeMo Gym than the one installed)."""


@functools.cache
def tree() -> Path:
    """The directory holding nemo_gym/, resources_servers/ and responses_api_agents/ (site-packages for
    the wheel, the checkout for a source install)."""
    return installed_file("nemo_gym", "__init__.py").parent.parent


@frozen(kw_only=True)
class Instance:
    """One server instance of an upstream config: its key, kind, implementation directory and fields."""

    name: str
    kind: str
    implementation: str
    fields: Mapping[str, Any]

    def own_fields(self) -> dict[str, Any]:
        """The instance's fields without the launcher's and the agent's wiring."""
        return {k: v for k, v in self.fields.items() if k not in _LAUNCHER_KEYS | _WIRED_KEYS}


@frozen(kw_only=True)
class UpstreamServer:
    """What a catalogued server's installed files say: the agent and resources server instances of its
    config, the classes they run, and where its rows and recordings are."""

    name: str
    config: str  # the config file's stem
    resources: Instance
    resources_class: str  # "module:Class"
    agent: Instance
    agent_class: str
    directory: Path

    @property
    def description(self) -> str:
        text = self.resources.fields.get("description")
        return str(text) if isinstance(text, str) else ""

    def example_rows(self) -> list[dict[str, Any]]:
        return read_jsonl(self.directory / "data" / "example.jsonl")

    def offers_tools(self) -> bool:
        """Whether its tasks give the model tools: its first example row's params name any (a server's rows
        share their tools)."""
        return _offers_tools(self.directory / "data" / "example.jsonl")

    def recorded_lines(self) -> list[str]:
        """The lines of data/example_rollouts.jsonl (a line may be a placeholder, not JSON)."""
        path = self.directory / "data" / "example_rollouts.jsonl"
        if not path.is_file():
            return []
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _instances(path: Path) -> list[Instance]:
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)  # noqa: S506 - a safe loader
    except (OSError, yaml.YAMLError) as exc:
        raise UpstreamError(f"{path}: cannot read it ({exc})") from None
    found = []
    for key, value in (document or {}).items():
        if not isinstance(value, dict) or len(value) != 1:
            continue
        ((kind, inner),) = value.items()
        if kind in (AGENT_KIND, RESOURCES_KIND) and isinstance(inner, dict) and len(inner) == 1:
            ((implementation, fields),) = inner.items()
            found.append(Instance(name=key, kind=kind, implementation=implementation, fields=fields or {}))
    return found


def _example_agent(agents: list[Instance], name: str) -> Instance | None:
    """The agent whose datasets include the server's own example.jsonl (else the only agent)."""
    own = f"{RESOURCES_KIND}/{name}/data/example.jsonl"
    for agent in agents:
        datasets = agent.fields.get("datasets") or []
        if any(isinstance(d, dict) and d.get("jsonl_fpath") == own for d in datasets):
            return agent
    return agents[0] if len(agents) == 1 else None


def installed(name: str) -> bool:
    """Whether this NeMo Gym has resources server `name` at all (a later release's may be catalogued)."""
    return (tree() / RESOURCES_KIND / name).is_dir()


@functools.cache
def _offers_tools(path: Path) -> bool:
    """One line read once per process: every plugin manager registers the catalogue, at every command."""
    try:
        with path.open(encoding="utf-8") as lines:
            first = next((line for line in lines if line.strip()), "")
    except OSError:
        return True  # nothing says it has none: the bound for tool use, not one generation
    row = parse_recorded(first) or {}
    params = row.get("responses_create_params")
    return bool(params.get("tools")) if isinstance(params, dict) else False


@functools.cache
def read_server(name: str, config: str | None = None) -> UpstreamServer:
    """The installed files of resources server `name`, with its config `config` (default: `<name>.yaml`,
    else its only one); UpstreamError names the file when something is missing or malformed."""
    directory = tree() / RESOURCES_KIND / name
    if not installed(name):
        raise NotInstalled(f"{directory}: no such server in this NeMo Gym")
    configs = directory / "configs"
    stem = config or name
    path = configs / f"{stem}.yaml"
    if config is None and not path.is_file():
        found = sorted(configs.glob("*.yaml")) if configs.is_dir() else []
        if len(found) != 1:
            raise UpstreamError(f"{configs}: name one of its {len(found)} configs for {name}")
        path, stem = found[0], found[0].stem
    if not path.is_file():
        raise UpstreamError(f"{path}: no such config (is {name} in this NeMo Gym?)")
    instances = _instances(path)
    agent = _example_agent([i for i in instances if i.kind == AGENT_KIND], name)
    if agent is None:
        raise UpstreamError(f"{path}: no agent runs {name}'s example rows")
    ref = agent.fields.get("resources_server")
    wanted = ref.get("name") if isinstance(ref, dict) else None
    resources = next((i for i in instances if i.kind == RESOURCES_KIND and i.name == wanted), None)
    if resources is None:
        raise UpstreamError(f"{path}: agent {agent.name} names no resources server of this config")
    agent_app = tree() / AGENT_KIND / agent.implementation / "app.py"
    try:
        resources_class, agent_class = main_class(directory / "app.py"), main_class(agent_app)
    except LookupError as exc:
        raise UpstreamError(str(exc)) from None
    return UpstreamServer(
        name=name,
        config=stem,
        resources=resources,
        resources_class=f"{RESOURCES_KIND}.{resources.implementation}.app:{resources_class}",
        agent=agent,
        agent_class=f"{AGENT_KIND}.{agent.implementation}.app:{agent_class}",
        directory=directory,
    )


def located(fields: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """`fields` with upstream's relative file paths (``*_fpath``, ``*_path``) made absolute. NeMo Gym runs
    each server in its own directory and resolves them from there, or from the tree's root; relax-gym runs
    servers elsewhere."""
    found = dict(fields)
    for key, value in fields.items():
        if not key.endswith(("_fpath", "_path")) or not isinstance(value, str) or Path(value).is_absolute():
            continue
        for base in (directory, tree()):
            if (base / value).exists():
                found[key] = str(base / value)
                break
    return found


def parse_recorded(line: str) -> dict[str, Any] | None:
    """One recorded rollout, or None for a line that is not one (a placeholder)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None
