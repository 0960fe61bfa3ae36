"""Which Claude Code the agent runs (the project-local 2.1.237 that `make gym` installs), what `relax-gym
plugins` says about it, and the settings every trial's CLI gets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from relax_gym_core.testing.web import run_cli

from relax_gym_reasoning_gym_cc import claude, plugin


def fake_install(prefix: Path, version: str) -> Path:
    """An npm prefix as `npm install --prefix` lays it out, with a stand-in executable."""
    package = prefix / "node_modules" / "@anthropic-ai" / "claude-code"
    package.mkdir(parents=True)
    (package / "package.json").write_text(
        json.dumps({"name": "@anthropic-ai/claude-code", "version": version})
    )
    executable = prefix / "node_modules" / ".bin" / "claude"
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    return executable


def test_the_project_local_cli_is_the_pinned_version() -> None:
    installed = claude.require({})
    assert installed.path == (claude._CHECKOUT / claude.PREFIX / "node_modules/.bin/claude").absolute()
    assert installed.version == claude.VERSION == "2.1.237"
    ran = subprocess.run(
        [installed.path, "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert ran.stdout.split()[0] == claude.VERSION  # what package.json says is what runs


def test_a_missing_or_other_version_cli_is_refused_with_what_to_do(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "claude")
    with pytest.raises(claude.ClaudeCodeMissing, match=r"RELAX_GYM_CC_CLAUDE=.*nowhere.*make gym"):
        claude.require({claude.CLAUDE_ENV: missing})
    other = fake_install(tmp_path / "prefix", "2.0.1")
    with pytest.raises(
        claude.ClaudeCodeMissing, match=r"Claude Code 2\.0\.1 at .*: this environment runs .*2\.1\.237"
    ):
        claude.require({claude.CLAUDE_ENV: str(other)})
    assert claude.report({claude.CLAUDE_ENV: str(other)}).startswith("Claude Code 2.0.1 at ")
    pinned = fake_install(tmp_path / "pinned", claude.VERSION)
    assert claude.report({claude.CLAUDE_ENV: str(pinned)}) == f"Claude Code 2.1.237 at {pinned.absolute()}"


def test_relax_gym_plugins_reports_the_cli_version_and_path() -> None:
    listed = run_cli("plugins", "--json", timeout_s=60)
    assert listed.returncode == 0, listed.stderr
    (ours,) = [p for p in json.loads(listed.stdout)["plugins"] if p["name"] == "reasoning_gym_cc"]
    (environment,) = ours["environments"]
    expected = f"Claude Code 2.1.237 at {claude.require({}).path}"
    assert environment["name"] == plugin.REASONING_GYM.name and expected in environment["description"]
    table = run_cli("plugins", timeout_s=60)
    assert table.returncode == 0, table.stderr
    assert expected in table.stdout


def test_settings_keep_histories_linear_and_leave_only_bash() -> None:
    assert claude.SETTINGS["env"]["DISABLE_COMPACT"] == "1"
    denied = set(claude.SETTINGS["permissions"]["deny"])
    assert (
        "Bash" not in denied and {"Read", "Write", "Edit", "WebFetch", "WebSearch", "Task", "Agent"} <= denied
    )
    assert claude.SETTINGS["sandbox"]["enabled"] is False  # ours wraps the shell; the CLI's own is off
