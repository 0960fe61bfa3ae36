"""`relax-gym plugins`: the installed plugins, the environments each registers, and the NeMo Gym their
servers run (a table, or JSON)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.processes import gym_python
from relax_gym_core.gym.release import NemoGymRelease, nemo_gym_release
from relax_gym_core.plugin.host import Hooks, make_plugin_manager


def describe_nemo_gym() -> dict[str, Any]:
    """The NeMo Gym environment `relax-gym up` would start servers from: {"python", "version", "source",
    "commit", "observability"}, or {"python", "error"} when there is none (how to make one)."""
    try:
        python = gym_python()
        return {"python": python, **nemo_gym_release(python).to_json()}
    except ConfigError as exc:
        return {"python": None, "error": str(exc)}


def describe_plugins(hooks: Hooks) -> dict[str, Any]:
    """The installed plugins and the environments each registers, as one JSON-ready document.

    Keys are fixed: {"plugins": [{"name", "distribution", "version", "module", "environments":
    [{"name", "configs", "agent", "needs", "description"}]}]}. The built-in reference implementations are part
    of the core, not a plugin, and are not listed. plugins() adds "nemo_gym" (describe_nemo_gym()).
    """
    registry = hooks.environments
    owned: dict[str, list[dict[str, Any]]] = {}
    for definition in registry:
        owned.setdefault(registry.owner(definition.name), []).append(
            {
                "name": definition.name,
                "configs": list(definition.configs),
                "agent": definition.agent,
                "needs": list(definition.needs),
                "description": definition.description,
            }
        )
    return {
        "plugins": [
            {
                "name": info.name,
                "distribution": info.distribution,
                "version": info.version,
                "module": info.module,
                "environments": owned.get(info.name, []),
            }
            for info in hooks.plugins
        ]
    }


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in (headers, *rows)
    ]


def format_plugins(document: dict[str, Any]) -> str:
    """The human view of describe_plugins(): a plugin table, then an environment table."""
    plugins = document["plugins"]
    tail = _nemo_gym_line(document.get("nemo_gym"))
    if not plugins:
        return "\n".join(["No relax-gym plugins installed.", *tail])
    lines = _table(
        ("PLUGIN", "DISTRIBUTION", "VERSION", "MODULE"),
        [(p["name"], p["distribution"] or "-", p["version"] or "-", p["module"]) for p in plugins],
    )
    environments = [(env, p["name"]) for p in plugins for env in p["environments"]]
    lines.append("")
    if not environments:
        lines.append("No environments registered.")
        return "\n".join([*lines, *tail])
    lines += _table(
        ("ENVIRONMENT", "PLUGIN", "CONFIGS", "AGENT", "NEEDS", "DESCRIPTION"),
        [
            (
                env["name"],
                plugin,
                ",".join(env["configs"]),
                env["agent"],
                "; ".join(env["needs"]) or "-",
                " ".join(env["description"].split()),
            )
            for env, plugin in environments
        ],
    )
    return "\n".join([*lines, *tail])


def _nemo_gym_line(found: dict[str, Any] | None) -> list[str]:
    if found is None:
        return []
    if found.get("error"):
        return ["", f"NeMo Gym: none ({found['error']})"]
    fields = {key: found[key] for key in ("version", "source", "commit", "observability")}
    return ["", f"Servers run {NemoGymRelease(**fields).describe()} at {found['python']}"]


def plugins(*, as_json: bool = False) -> str:
    """What `relax-gym plugins` prints."""
    document = {**describe_plugins(make_plugin_manager()), "nemo_gym": describe_nemo_gym()}
    return json.dumps(document, indent=2) if as_json else format_plugins(document)
