"""Verifier probes: the verifier contract, per bundled task (the seed's "golden mode", and more).

Outputs are what an agent produces with the local tools: the verifier replays them in a fresh workspace
when no rollout workspace exists (as for `relax-gym probe`), diffs, and runs the hidden tests.

- ``golden``: the golden patch applied with ``git apply`` through the bash tool -> 1.0
- ``wrong``: a plausible fix that applies but fails the tests, written with str_replace -> 0.1
- ``empty``: an answer without any change -> 0.0
"""

from __future__ import annotations

from typing import Any

from relax_gym_core.plugin import VerifierProbe, answer, function_call, message

from relax_gym_r2e import tasks
from relax_gym_r2e.rows import example_row

GOLDEN, WRONG, EMPTY = 1.0, 0.1, 0.0
_DELIMITER = "RELAX_GYM_PATCH"


def apply_patch_command(patch: str) -> str:
    """A bash command that applies `patch` in the repository (a quoted heredoc: nothing is expanded)."""
    if any(line == _DELIMITER for line in patch.splitlines()):
        raise ValueError("the patch contains the heredoc delimiter")
    return f"git apply <<'{_DELIMITER}'\n{patch}{_DELIMITER}\n"


def edits(built: tasks.Built, changed: dict[str, str], tag: str) -> list[dict[str, Any]]:
    """str_replace calls turning the base files into `changed` (a whole file each: one occurrence)."""
    files = built.task.files
    return [
        function_call(
            "str_replace", {"path": path, "old_str": files[path], "new_str": content}, f"{tag}_{index}"
        )
        for index, (path, content) in enumerate(sorted(changed.items()))
    ]


def probes_for(built: tasks.Built) -> list[VerifierProbe]:
    name = built.task.name
    row = example_row(name)
    golden = (
        function_call("bash", {"command": apply_patch_command(built.golden_patch)}, f"{name}_golden"),
        message("Applied the fix.", f"{name}_golden"),
    )
    wrong = (
        *edits(built, dict(built.task.wrong_fix), f"{name}_wrong"),
        message("Fixed it.", f"{name}_wrong"),
    )
    empty = answer("I could not find the problem.", f"{name}_empty")
    return [
        VerifierProbe(name=f"{name}:golden", row=row, output=golden, expected_reward=GOLDEN),
        VerifierProbe(name=f"{name}:wrong", row=row, output=wrong, expected_reward=WRONG),
        VerifierProbe(name=f"{name}:empty", row=row, output=empty, expected_reward=EMPTY),
    ]


def verifier_probes() -> list[VerifierProbe]:
    """Three probes per bundled task."""
    return [probe for built in tasks.built_tasks().values() for probe in probes_for(built)]
