"""JSONL files for the commands that read and write datasets (convert, mix): every refusal names the file
and line, and an output is replaced atomically or not at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from relax_gym_core.errors import ConversionError


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def read_rows(path: Path, source: IO[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
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


def open_source(path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except OSError as exc:
        raise ConversionError(f"cannot read {path}: {exc.strerror}") from None


def check_distinct(input_path: Path, output_path: Path) -> None:
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


def encode(path: Path, number: int, row: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(row, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
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


@contextlib.contextmanager
def atomic_output(output_path: Path) -> Iterator[IO[bytes]]:
    """A sink whose content replaces `output_path` when the block ends normally, synced to disk first.

    If the block raises, the temporary file is removed and an existing output is left as it was.
    """
    try:
        output_path.parent.mkdir(parents=True, exist_ok=True)
        temp, sink = _open_temp(output_path.parent, output_path.name)
    except OSError as exc:
        raise ConversionError(f"cannot write {output_path}: {exc.strerror}") from None
    replaced = False
    try:
        with sink:
            yield sink
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temp, output_path)
        replaced = True
    except OSError as exc:
        raise ConversionError(f"cannot write {output_path}: {exc.strerror or exc}") from None
    finally:
        if not replaced:
            with contextlib.suppress(OSError):
                temp.unlink()
