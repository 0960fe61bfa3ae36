"""What `relax-gym plugins` and `relax-gym convert` do, callable without the command line.

`describe_plugins` and `format_plugins` list what is installed; `convert_file` turns a raw NeMo Gym
JSONL file into a Relax one through the plugins' convert_row hooks, with the reference converter's file
safety: the source is never opened for writing, the output is replaced atomically, and every refusal
names the file and line.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from relax_gym_core.environments.manager import Hooks
from relax_gym_core.errors import ConversionError, PluginError, RowError

# ---- relax-gym plugins ---------------------------------------------------------------------------------


def describe_plugins(hooks: Hooks) -> dict[str, Any]:
    """The installed plugins and the environments each registers, as one JSON-ready document.

    Keys are fixed: {"plugins": [{"name", "distribution", "version", "module", "environments":
    [{"name", "configs", "agent", "description"}]}]}. The built-in reference implementations are part
    of the core, not a plugin, and are not listed.
    """
    registry = hooks.environments
    owned: dict[str, list[dict[str, Any]]] = {}
    for definition in registry:
        owned.setdefault(registry.owner(definition.name), []).append(
            {
                "name": definition.name,
                "configs": list(definition.configs),
                "agent": definition.agent,
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
    if not plugins:
        return "No relax-gym plugins installed."
    lines = _table(
        ("PLUGIN", "DISTRIBUTION", "VERSION", "MODULE"),
        [(p["name"], p["distribution"] or "-", p["version"] or "-", p["module"]) for p in plugins],
    )
    environments = [(env, p["name"]) for p in plugins for env in p["environments"]]
    lines.append("")
    if not environments:
        lines.append("No environments registered.")
        return "\n".join(lines)
    lines += _table(
        ("ENVIRONMENT", "PLUGIN", "CONFIGS", "AGENT", "DESCRIPTION"),
        [
            (
                env["name"],
                plugin,
                ",".join(env["configs"]),
                env["agent"],
                " ".join(env["description"].split()),
            )
            for env, plugin in environments
        ],
    )
    return "\n".join(lines)


# ---- relax-gym convert ---------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _rows(path: Path, source: IO[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; bad lines raise ConversionError naming file:line."""
    for number, raw in enumerate(source, start=1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            raise ConversionError(f"Invalid JSON at {path}:{number}: not UTF-8 text") from None
        if not text.strip():
            continue
        try:
            row = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise ConversionError(f"Invalid JSON at {path}:{number}: {exc}") from None
        if not isinstance(row, dict):
            raise ConversionError(f"Expected an object at {path}:{number}")
        yield number, row


def _check_distinct(input_path: Path, output_path: Path) -> None:
    """Refuse an output that is the input file itself (same path, relative path, symlink, hard link)."""
    try:
        same = output_path.exists() and os.path.samefile(input_path, output_path)
    except OSError as exc:
        raise ConversionError(f"cannot inspect {output_path}: {exc.strerror}") from None
    if same:
        raise ConversionError(
            f"Input and output must refer to different files: {input_path} and {output_path} "
            "are the same file; the source is never overwritten"
        )


def _encode(path: Path, number: int, converted: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(converted, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConversionError(f"{path}:{number}: the converted row is not JSON: {exc}") from None
    return text.encode() + b"\n"


def _open_temp(directory: Path, name: str) -> tuple[Path, IO[bytes]]:
    """A new file next to the output (same filesystem, so os.replace is atomic), created with the umask."""
    while True:
        temp = directory / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        return temp, os.fdopen(fd, "wb")


def _write_rows(
    hooks: Hooks, environment: str, path: Path, source: IO[bytes], sink: IO[bytes], *, limit: int | None
) -> int:
    count = 0
    for number, row in _rows(path, source):
        try:
            converted = hooks.convert_row(environment, row)
        except (RowError, PluginError) as exc:  # PluginError: the plugin broke the Relax row shape
            raise ConversionError(f"{path}:{number}: {exc}") from None
        except Exception as exc:  # a plugin bug: keep its traceback, say where it happened
            exc.add_note(f"while converting {path}:{number} for environment {environment!r}")
            raise
        sink.write(_encode(path, number, converted))
        count += 1
        if limit is not None and count >= limit:
            break
    return count


def convert_file(
    hooks: Hooks, environment: str, input_path: Path, output_path: Path, *, limit: int | None = None
) -> int:
    """Convert each row of `input_path` with convert_row(environment, row) into `output_path`.

    Returns the number of rows written. Raises ConversionError (or UnknownEnvironmentError) on the first
    problem; then the temporary file is gone and an existing output is left as it was.
    """
    if limit is not None and limit < 1:
        raise ConversionError("--limit must be greater than zero")
    hooks.environments.get(environment)  # UnknownEnvironmentError names the installed ones
    try:
        source = input_path.open("rb")
    except OSError as exc:
        raise ConversionError(f"cannot read {input_path}: {exc.strerror}") from None
    with source:
        _check_distinct(input_path, output_path)
        try:
            output_path.parent.mkdir(parents=True, exist_ok=True)
            temp, sink = _open_temp(output_path.parent, output_path.name)
        except OSError as exc:
            raise ConversionError(f"cannot write {output_path}: {exc.strerror}") from None
        count = 0
        replaced = False
        try:
            with sink:
                count = _write_rows(hooks, environment, input_path, source, sink, limit=limit)
                sink.flush()
                os.fsync(sink.fileno())
            if count:
                os.replace(temp, output_path)
                replaced = True
        except OSError as exc:
            raise ConversionError(f"cannot write {output_path}: {exc.strerror or exc}") from None
        finally:
            if not replaced:
                with contextlib.suppress(OSError):
                    temp.unlink()
    if not count:
        raise ConversionError(f"No rows converted from {input_path}")
    return count
