"""The README's catalogue table is the registry's: every catalogued environment, its config, agent, needs
and how many of its recordings are replayed (test_catalogue_probes.py checks that they score as recorded)."""

from __future__ import annotations

from pathlib import Path

from relax_gym_core.plugin import Hooks, make_plugin_manager

README = Path(__file__).resolve().parents[3] / "README.md"
BEGIN, END = "<!-- catalogue table: begin -->", "<!-- catalogue table: end -->"


def catalogue_table(hooks: Hooks) -> str:
    registry = hooks.environments
    lines = [
        "| environment | config | agent | needs | recorded rollouts replayed |",
        "|---|---|---|---|---|",
    ]
    for definition in sorted(registry, key=lambda d: d.name):
        if registry.owner(definition.name) != "catalogue":
            continue
        agent = next(s for s in definition.servers if s.name == definition.agent).implementation
        probes = list(definition.verifier_probes())
        replayed = sum(probe.skip is None for probe in probes)
        reasons = sorted({probe.skip for probe in probes if probe.skip is not None})
        result = f"{replayed}/{len(probes)}" + "".join(f"; skipped: {reason}" for reason in reasons)
        needs = "; ".join(definition.needs) or "-"
        lines.append(f"| `{definition.name}` | `{definition.configs[0]}` | {agent} | {needs} | {result} |")
    return "\n".join(lines)


def test_the_readme_table_is_the_registrys() -> None:
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text
    documented = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert documented == catalogue_table(make_plugin_manager())
