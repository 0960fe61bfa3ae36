"""docs/plugins.md stays true: every block it marks as a file (or an excerpt of one) is that file of the
repository exactly, and every relax_gym_core name it points readers to exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugins.md"
BLOCK = re.compile(r"<!-- (file|excerpt): (\S+) -->\n```[a-z]*\n(.*?)\n```\n", re.DOTALL)


def blocks() -> list[tuple[str, str, str]]:
    return [(kind, path, body) for kind, path, body in BLOCK.findall(GUIDE.read_text())]


def test_the_guide_shows_real_files() -> None:
    found = blocks()
    assert len(found) >= 6, "docs/plugins.md lost its file blocks"
    assert {path for _, path, _ in found} >= {
        "plugins/mcqa/pyproject.toml",
        "plugins/mcqa/src/relax_gym_mcqa/__init__.py",
        "plugins/mcqa/tests/test_mcqa.py",
        "plugins/gsm8k/src/relax_gym_gsm8k/plugin.py",
    }


def test_the_guide_leads_with_the_smallest_plugin() -> None:
    # The first file it shows is a whole plugin: one module of its own logic.
    kind, path, _body = blocks()[0]
    assert (kind, path) == ("file", "plugins/mcqa/src/relax_gym_mcqa/__init__.py")


@pytest.mark.parametrize(("kind", "path", "body"), blocks(), ids=[f"{k}:{p}" for k, p, _ in blocks()])
def test_each_block_is_the_file_it_names(kind: str, path: str, body: str) -> None:
    text = (ROOT / path).read_text()
    if kind == "file":
        assert body == text.rstrip(), f"{path} changed: update docs/plugins.md"
    else:
        assert body in text, f"the excerpt of {path} in docs/plugins.md is not in the file any more"


NAMES = sorted(set(re.findall(r"`(relax_gym_core(?:\.\w+)+)`", GUIDE.read_text())))


@pytest.mark.parametrize("dotted", NAMES)
def test_names_the_guide_points_to_exist(dotted: str) -> None:
    try:
        importlib.import_module(dotted)
        return
    except ModuleNotFoundError:
        module_name, _, attribute = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    assert hasattr(module, attribute), dotted


def test_the_guide_lists_every_name_of_the_authors_face() -> None:
    # The first item of "What a plugin may import" is relax_gym_core.plugin's face, name by name.
    section = GUIDE.read_text().split("## What a plugin may import")[1].split("\n## ")[0]
    first_item = section.split("\n- ")[1]
    listed = set(re.findall(r"`(\w+)`", first_item))
    api = importlib.import_module("relax_gym_core.plugin")
    assert set(api.__all__) - listed == set()
