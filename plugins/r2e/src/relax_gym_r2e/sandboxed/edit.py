"""The file tools, run inside the sandbox: ``view`` (a file with line numbers, or a directory) and
``str_replace`` (exactly one occurrence). Request on stdin: {"op": "view"|"str_replace", ...}.

Exit code 0 with the answer on stdout, or 1 with the reason. Paths are relative to the repository
(/workspace/repo) unless absolute; the sandbox's read-only mounts decide what can be written.
"""

import json
import os
import sys
from typing import Any

REPO = "/workspace/repo"
MAX_LISTED = 400


def resolve(path: object) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError("path must be a non-empty string")
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(REPO, path))


def view_directory(path: str) -> str:
    lines = [f"{path}/"]
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(name for name in dirs if name not in (".git", "__pycache__"))
        depth = root[len(path) :].count(os.sep)
        if depth >= 2:
            dirs[:] = []
        for name in sorted(files):
            lines.append(os.path.join(root, name)[len(path) + 1 :])
            if len(lines) > MAX_LISTED:
                lines.append("... (listing cut)")
                return "\n".join(lines)
        lines.extend(os.path.join(root, name)[len(path) + 1 :] + "/" for name in dirs)
    return "\n".join(lines)


def view(request: dict[str, Any]) -> str:
    path = resolve(request.get("path"))
    if os.path.isdir(path):
        return view_directory(path)
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().splitlines()
    start = request.get("start_line") or 1
    end = request.get("end_line") or len(lines)
    if not isinstance(start, int) or not isinstance(end, int) or start < 1 or end < start - 1:
        raise ValueError(f"bad line range {start}..{end}")
    return "\n".join(f"{number:6d}\t{lines[number - 1]}" for number in range(start, min(end, len(lines)) + 1))


def str_replace(request: dict[str, Any]) -> str:
    path = resolve(request.get("path"))
    old, new = request.get("old_str"), request.get("new_str", "")
    if not isinstance(old, str) or not old:
        raise ValueError("old_str must be a non-empty string")
    if not isinstance(new, str):
        raise TypeError("new_str must be a string")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    count = text.count(old)
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        raise ValueError(f"old_str {where} in {path}: it must occur exactly once (include more context)")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text.replace(old, new, 1))
    return f"Replaced 1 occurrence in {path}."


def handle(request: object) -> str:
    if not isinstance(request, dict):
        raise TypeError("the request must be a JSON object")
    operations = {"view": view, "str_replace": str_replace}
    name = request.get("op")
    operation = operations.get(name) if isinstance(name, str) else None
    if operation is None:
        raise ValueError(f"unknown operation {name!r}")
    return operation(request)


def main() -> int:
    try:
        answer = handle(json.loads(sys.stdin.read()))
    except (OSError, TypeError, ValueError, UnicodeError) as exc:
        print(f"Error: {exc}")
        return 1
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
