"""The catalogue table (docs/nemo-gym.md) is the registry's: every catalogued environment, its config,
agent, needs and how many of its recordings are replayed (test_catalogue_probes.py checks that they score
as recorded).

The table lists the catalogue on NeMo Gym main; an older NeMo Gym (CI's 0.4.0) registers fewer servers, so
there its rows are checked and the other rows must be of catalogued servers it does not have."""

from __future__ import annotations

from pathlib import Path

from relax_gym_core.testing import Hooks, make_plugin_manager

from relax_gym_catalogue.catalogue import ENTRIES
from relax_gym_catalogue.upstream import installed

README = Path(__file__).resolve().parents[3] / "docs" / "nemo-gym.md"  # the catalogue table's page
BEGIN, END = "<!-- catalogue table: begin -->", "<!-- catalogue table: end -->"
HEADER = [
    "| environment | config | agent | needs | recorded rollouts replayed |",
    "|---|---|---|---|---|",
]


def registry_rows(hooks: Hooks) -> dict[str, str]:
    """The table row of each environment the catalogue registers, by name."""
    registry = hooks.environments
    rows = {}
    for definition in registry:
        if registry.owner(definition.name) != "catalogue":
            continue
        agent = next(s for s in definition.servers if s.name == definition.agent).implementation
        probes = list(definition.verifier_probes())
        replayed = sum(probe.skip is None for probe in probes)
        reasons = sorted({probe.skip for probe in probes if probe.skip is not None})
        result = f"{replayed}/{len(probes)}" + "".join(f"; skipped: {reason}" for reason in reasons)
        needs = "; ".join(definition.needs) or "-"
        name = definition.name
        rows[name] = f"| `{name}` | `{definition.configs[0]}` | {agent} | {needs} | {result} |"
    return rows


def test_the_readme_table_is_the_registrys() -> None:
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text
    lines = text.split(BEGIN, 1)[1].split(END, 1)[0].strip().splitlines()
    assert lines[:2] == HEADER
    documented = {line.split("`", 2)[1]: line for line in lines[2:]}
    assert list(documented) == sorted(documented)  # by name, one row each
    assert len(documented) == len(lines) - 2
    registered = registry_rows(make_plugin_manager())
    assert {name: documented.get(name) for name in registered} == registered
    others = set(documented) - set(registered)
    catalogued = {entry.name for entry in ENTRIES}
    assert all(name in catalogued and not installed(name) for name in others), sorted(others)
