"""README.md is a front door a newcomer reads: at most 200 lines of readable width, linking every page of
docs/, and no link of the README or the docs leads nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_readable() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200
    assert [line for line in lines if len(line) > 120] == []


def test_the_readme_links_every_docs_page() -> None:
    linked = {(ROOT / target).resolve() for target in LINK.findall(README.read_text())}
    assert [page.name for page in PAGES if page.resolve() not in linked] == []


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_leads_somewhere(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # a URL
            continue
        path = (page.parent / target).resolve()
        if not path.is_relative_to(ROOT):  # beside the repository (the team's shared references)
            continue
        assert path.exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"
