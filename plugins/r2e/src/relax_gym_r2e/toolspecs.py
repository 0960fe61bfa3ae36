"""The local runtime's tools as the model sees them (Responses function tools) and the task prompt."""

from __future__ import annotations

import copy
from typing import Any

PROMPT = """\
You are working in a git repository at /workspace/repo, the working directory of every command. Fix the \
issue below by changing the repository's source files.

Tools: `bash` runs a shell command in a sandbox (no network; only /workspace is writable; each call \
starts a fresh shell, files persist), `view` shows a file with line numbers or lists a directory, \
`str_replace` replaces exactly one occurrence of a text in a file. Hidden tests check your fix; do not \
write tests. When you are done, answer with a short summary of the change.

<issue>
{problem_statement}
</issue>"""


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
        "strict": False,
    }


TOOLS: tuple[dict[str, Any], ...] = (
    _tool(
        "bash",
        "Run a bash command in /workspace/repo inside the sandbox; returns its output and exit code.",
        {
            "command": {"type": "string", "description": "The command line to run."},
            "timeout": {
                "type": "number",
                "description": "Seconds before the command is killed (default 30).",
            },
        },
        ["command"],
    ),
    _tool(
        "view",
        "Show a file with line numbers (optionally a line range), or list a directory.",
        {
            "path": {"type": "string", "description": "Path relative to /workspace/repo, or absolute."},
            "start_line": {"type": "integer", "description": "First line to show (1-based)."},
            "end_line": {"type": "integer", "description": "Last line to show."},
        },
        ["path"],
    ),
    _tool(
        "str_replace",
        "Replace the one occurrence of old_str in a file with new_str (fails unless it occurs exactly once).",
        {
            "path": {"type": "string", "description": "Path relative to /workspace/repo, or absolute."},
            "old_str": {"type": "string", "description": "The exact text to replace."},
            "new_str": {"type": "string", "description": "The replacement text."},
        },
        ["path", "old_str", "new_str"],
    ),
)
TOOL_NAMES = frozenset(tool["name"] for tool in TOOLS)


def tools() -> list[dict[str, Any]]:
    """Fresh copies of the tool schemas (rows are mutated by callers)."""
    return copy.deepcopy(list(TOOLS))


def prompt(problem_statement: str) -> str:
    return PROMPT.format(problem_statement=problem_statement.strip())
