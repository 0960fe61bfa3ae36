"""Shared parts of the rollout tests: a real echo gateway (`relax-gym serve`), a real scripted policy
server, data files, and `relax-gym` run as a user runs it (a subprocess of this interpreter)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy, start_gateway

ECHO_SPECS = {"echo": {"environment": "echo", "runtime": "echo", "max_concurrency": 64, "queue_capacity": 64}}
SECRET = "sk-rollout-test-0123456789abcdef"  # the policy's key: it must reach the policy and nothing else


@pytest.fixture(scope="module")
def echo_gateway() -> Iterator[GatewayProcess]:
    with start_gateway(ECHO_SPECS) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def policy() -> Iterator[ScriptedPolicy]:
    """Answers every model call with the default text reply, and only when it carries SECRET."""
    with ScriptedPolicy(require_token=SECRET) as server:
        yield server


def echo_row(text: str, **echo: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": text}], "metadata": {"echo": echo}}


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def relax_gym(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relax_gym_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def start_relax_gym(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "relax_gym_core.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def trial_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


def metric(gateway: GatewayProcess, name: str, **labels: str) -> float:
    """One sample of the gateway's /metrics (0 when absent)."""
    import httpx  # noqa: PLC0415

    text = httpx.get(f"{gateway.url}/metrics", trust_env=False, timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, int], str] = {}
        self._open: tuple[str, int] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag in ("td", "span") and found.get("data-field"):
            self._open = (str(found["data-field"]), int(found.get("data-run") or 0))

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.cells[self._open] = data.strip()
            self._open = None


def shown(html: str) -> dict[tuple[str, int], str]:
    """The figures a report shows: (data-field, data-run) -> the text in that cell."""
    parser = _Cells()
    parser.feed(html)
    return parser.cells


def summary_value(summary: dict[str, Any], field: str) -> Any:
    """summary.json's value behind a report field ("echo.pass_at_k.1", "finished", "run.repeats")."""
    head, _, rest = field.partition(".")
    node: Any = summary["environments"][head] if head in summary["environments"] else summary[head]
    for part in rest.split(".") if rest else ():
        node = node.get(part) if isinstance(node, dict) else None  # absent: shown as n/a
    return node


def as_shown(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def check_report_numbers(html: str, summaries: list[dict[str, Any]]) -> int:
    """Every summary figure the report shows is summary.json's; returns how many were checked."""
    checked = 0
    for (field, run), text in shown(html).items():
        if field.startswith("row"):
            continue  # per-row means: checked against trials.jsonl by the caller
        assert text == as_shown(summary_value(summaries[run], field)), (field, run)
        checked += 1
    return checked


def pngs(html: str) -> dict[str, bytes]:
    """The plots embedded in a report, by data-plot name."""
    found = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"[^>]*data-plot="([^"]+)"', html)
    return {name: base64.b64decode(data) for data, name in found}
