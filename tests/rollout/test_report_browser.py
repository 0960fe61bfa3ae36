"""The report's trial page in a real browser: headless Chromium renders it (a screenshot with the turns'
colours where they belong) and its filters hide and show rows. Chromium is Debian's package, which `make
test` installs where it can (`make browser`, as root); elsewhere this module is skipped, saying so. In CI
(CI set) a missing Chromium fails instead: there the browser check must run.

Chromium is kept off every network: a host resolver that resolves nothing, a proxy on a closed loopback
port, and no background services."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from attrs import define
from PIL import Image

from relax_gym_core.rollout.overview import overview
from relax_gym_core.testing.web import GatewayProcess, ScriptedPolicy

from .conftest import SECRET, echo_row, relax_gym, write_rows

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "no chromium on PATH (`make browser` as root, or apt-get install chromium)"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason=NO_CHROMIUM),
]
OFFLINE = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-default-apps", "--no-pings",
    "--disable-domain-reliability", "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
)  # fmt: skip
USER = (0x1F, 0x6F, 0xEB)  # the border of a user turn (trial_view.STYLE)
ASSISTANT = (0x08, 0x7A, 0x1F)


@define
class Run:
    label: str
    summary: dict[str, Any]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        pytest.fail(f"CI must run the browser check: {NO_CHROMIUM}")
    profile = tmp_path / "chromium-profile"
    command = [CHROMIUM, *OFFLINE, f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def report_dir(
    tmp_path_factory: pytest.TempPathFactory, echo_gateway: GatewayProcess, policy: ScriptedPolicy
) -> Path:
    tmp = tmp_path_factory.mktemp("browser")
    rows = [echo_row("solve it", reward=1.0, model={"api": "chat", "calls": 1}), echo_row("crash", fail=True)]
    data = write_rows(tmp / "data.jsonl", rows)
    out = tmp / "run"
    rollout = relax_gym(
        "rollout", "echo", "--data", str(data), "--policy", policy.base_url, "--out", str(out),
        "--gateway", echo_gateway.url, "--api-key-env", "POLICY_KEY",
        env={**os.environ, "POLICY_KEY": SECRET},
    )  # fmt: skip
    assert rollout.returncode == 0, rollout.stderr
    assert relax_gym("report", str(out)).returncode == 0
    return out


def test_a_trial_page_renders_its_turns_in_chromium(report_dir: Path, tmp_path: Path) -> None:
    page = report_dir / "report_files" / "trials" / "1-1.html"
    shot = tmp_path / "trial.png"
    result = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,900", page.as_uri())
    assert shot.is_file(), result.stderr
    with Image.open(shot) as image:
        rgb = image.convert("RGB")
        colours = {rgb.getpixel((x, y)) for x in range(0, rgb.width, 2) for y in range(rgb.height)}
    assert USER in colours and ASSISTANT in colours  # both turns drawn with their role's border


def test_the_report_filters_its_trials_in_chromium(report_dir: Path, tmp_path: Path) -> None:
    # The page as the browser built it, after the "failed" filter ran: only the failed row is shown.
    report = report_dir / "report.html"
    probe = tmp_path / "probe.html"
    probe.write_text(
        report.read_text().replace("</body>", "<script>only('failed')</script></body>"), encoding="utf-8"
    )
    shutil.copytree(report_dir / "report_files", tmp_path / "report_files")
    result = chromium(tmp_path, "--dump-dom", probe.as_uri())
    assert result.returncode == 0, result.stderr
    rows = result.stdout.split("<tr data-k=")[1:]
    shown = [row for row in rows if 'style="display: none;"' not in row.split(">", 1)[0]]
    assert len(rows) == 2 and len(shown) == 1 and shown[0].startswith('"failed')


def test_the_overview_renders_and_sorts_by_a_column_in_chromium(report_dir: Path, tmp_path: Path) -> None:
    """The real report's overview, then the overview of three environments sorted in the browser by a click
    on "mean reward": ascending, then descending, a missing value last either way."""
    shown = chromium(tmp_path, "--dump-dom", (report_dir / "report.html").as_uri())
    assert shown.returncode == 0, shown.stderr
    assert '<table id="overview">' in shown.stdout and '<tr data-env="echo">' in shown.stdout

    runs = [
        Run("A", {"environments": {name: {"trials": 1, "mean_reward": mean} for name, mean in MEANS.items()}})
    ]
    page = tmp_path / "overview.html"
    click = (
        "<script>const th = [...document.querySelectorAll('#overview th')]"
        ".find(h => h.textContent === 'mean reward');"
    )
    for clicks, order in ((1, ["low", "high", "none"]), (2, ["high", "low", "none"])):
        page.write_text(
            f"<!doctype html><html><body>{overview(runs)}{click}"
            + "th.click();" * clicks
            + "</script></body></html>"
        )
        sorted_dom = chromium(tmp_path, "--dump-dom", page.as_uri())
        assert sorted_dom.returncode == 0, sorted_dom.stderr
        assert re.findall(r'<tr data-env="(\w+)">', sorted_dom.stdout) == order


MEANS = {"high": 0.9, "none": None, "low": 0.1}
