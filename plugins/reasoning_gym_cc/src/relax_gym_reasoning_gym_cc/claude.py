"""The Claude Code CLI this environment runs, and the settings every trial's CLI gets.

The CLI is installed by the project's set-up (`make`: npm into ``.tools/claude-code``), never globally and
never at trial time (upstream's claude_code_agent would `npm install -g` when `claude` is not on PATH; our
agent never calls that). Where it is: $RELAX_GYM_CC_CLAUDE, else the project-local prefix next to this
checkout. Its version is read from the npm package's own package.json (a file read: `relax-gym plugins`
reports it on every call without starting the 300 MB binary).

Standard library only: it runs in the NeMo Gym environment and in the gateway's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "2.1.237"  # the seed's version
CLAUDE_ENV = "RELAX_GYM_CC_CLAUDE"  # path of the `claude` executable to use
PREFIX = Path(".tools") / "claude-code"  # the project-local npm prefix, relative to the checkout
_BIN = Path("node_modules") / ".bin" / "claude"
_PACKAGE_JSON = Path("node_modules") / "@anthropic-ai" / "claude-code" / "package.json"
# plugins/reasoning_gym_cc/src/relax_gym_reasoning_gym_cc/claude.py -> the checkout (editable installs)
_CHECKOUT = Path(__file__).resolve().parents[4]

# Tools the model may not use: everything but Bash (the seed's list; Bash is the only useful tool).
DENIED_TOOLS = (
    "Agent", "CronCreate", "CronDelete", "CronList", "DesignSync", "Edit", "EnterWorktree", "ExitWorktree",
    "Glob", "Grep", "NotebookEdit", "Read", "ReportFindings", "ScheduleWakeup", "SendMessage", "Skill",
    "Task", "TaskCreate", "TaskGet", "TaskList", "TaskOutput", "TaskStop", "TaskUpdate", "WebFetch",
    "WebSearch", "Workflow", "Write",
)  # fmt: skip

SETTINGS: dict[str, Any] = {
    # Compaction off: every model call carries the whole linear history (what the trainer learns from).
    "env": {"DISABLE_COMPACT": "1", "PYTHONDONTWRITEBYTECODE": "1"},
    "permissions": {"deny": list(DENIED_TOOLS)},
    # The CLI's own sandbox stays off: Bash is sandboxed by our $CLAUDE_CODE_SHELL (sandbox.py).
    "sandbox": {"enabled": False, "failIfUnavailable": False, "allowUnsandboxedCommands": True},
}


class ClaudeCodeMissing(RuntimeError):
    """The CLI is not installed where we look, or is not the version we run."""


@dataclass(frozen=True)
class ClaudeCode:
    path: Path
    version: str | None  # None: no package.json beside it (a CLI installed some other way)

    def describe(self) -> str:
        return f"Claude Code {self.version or '(unknown version)'} at {self.path}"


def _version_of(executable: Path) -> str | None:
    """The npm package version of an npm-installed `claude` (<prefix>/node_modules/.bin/claude)."""
    package = executable.parent.parent.parent / _PACKAGE_JSON
    try:
        version = json.loads(package.read_text()).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


def locate(environ: Mapping[str, str] = os.environ) -> ClaudeCode:
    """The CLI to run: $RELAX_GYM_CC_CLAUDE, else the checkout's .tools/claude-code; ClaudeCodeMissing
    names both and how to install it."""
    configured = environ.get(CLAUDE_ENV)
    path = Path(configured) if configured else _CHECKOUT / PREFIX / _BIN
    if not os.access(path, os.X_OK):
        where = f"${CLAUDE_ENV}={configured}" if configured else str(path)
        raise ClaudeCodeMissing(
            f"Claude Code not found at {where}: run `make gym` in the relax-gym checkout (installs "
            f"@anthropic-ai/claude-code@{VERSION} into {PREFIX}) or set {CLAUDE_ENV} to a claude {VERSION}"
        )
    return ClaudeCode(path.absolute(), _version_of(path))


def require(environ: Mapping[str, str] = os.environ) -> ClaudeCode:
    """locate(), refusing any version but VERSION (the seed's, which these settings were made for)."""
    claude = locate(environ)
    if claude.version is not None and claude.version != VERSION:
        raise ClaudeCodeMissing(f"{claude.describe()}: this environment runs Claude Code {VERSION}")
    return claude


def report(environ: Mapping[str, str] = os.environ) -> str:
    """One line for `relax-gym plugins`: what the agent would run, or why it cannot."""
    try:
        return require(environ).describe()
    except ClaudeCodeMissing as exc:
        return str(exc)
