"""`relax-gym mix` as a real process: rows tagged with their environment (never re-tagged), unusable rows
dropped by their plugin and counted, a seeded shuffle, an atomic output, and errors naming file:line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

MIX_PLUGIN = """
from relax_gym_core.plugin import STATELESS, EnvironmentDefinition, NemoGymServer, hookimpl

AGENT = NemoGymServer(
    name="agent", kind="responses_api_agents", implementation="simple_agent", server_class="m:C"
)


class Beta(EnvironmentDefinition):
    def drop_reason(self, row):
        return "marked unusable" if row["metadata"].get("usable") is False else None


@hookimpl
def register_environments(registrar):
    common = {"agent": "agent", "servers": (AGENT,), "cleanup": STATELESS}
    registrar.add(EnvironmentDefinition(name="alpha", configs=("a1", "a2"), **common))
    registrar.add(Beta(name="beta", configs=("b1",), **common))
"""


def relax_row(text: str, **metadata: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": text}], "metadata": metadata}


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(f"{json.dumps(row)}\n" for row in rows))
    return path


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def site(install_dist: Callable[..., Any]) -> Path:
    dist = install_dist(
        distribution="relax-gym-mix", entry_points={"mix": "{pkg}.plugin"}, modules={"plugin": MIX_PLUGIN}
    )
    path: Path = dist.site
    return path


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    alpha = write(tmp_path / "alpha.jsonl", [relax_row(f"a{i}", n=i) for i in range(12)])
    beta = write(
        tmp_path / "beta.jsonl",
        [relax_row(f"b{i}", n=i, usable=i % 4 != 0) for i in range(8)],  # rows 0 and 4 are unusable
    )
    return alpha, beta


def test_rows_are_tagged_dropped_and_shuffled_reproducibly(
    cli: Any, site: Path, inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    alpha, beta = inputs
    args = (f"alpha:a2={alpha}", f"beta={beta}")
    first = cli("mix", *args, "--output", "mixed.jsonl", sites=(site,))
    assert first.returncode == 0, first.stderr
    assert "alpha=12 beta=6 total=18" in first.stdout
    assert "dropped beta=2 (marked unusable)" in first.stdout
    rows = read(tmp_path / "mixed.jsonl")
    assert len(rows) == 18
    for row in rows:
        expected = ("alpha", "a2") if row["input"][0]["content"].startswith("a") else ("beta", "b1")
        assert (row["metadata"]["environment"], row["metadata"]["config"]) == expected
        assert row["metadata"]["data_source"] == expected[0]
    assert {row["input"][0]["content"] for row in rows if row["metadata"]["environment"] == "beta"} == {
        f"b{i}" for i in range(8) if i % 4
    }
    # Shuffled: the two environments interleave; the same seed writes the same file, another seed another.
    assert [row["metadata"]["environment"] for row in rows] != sorted(
        row["metadata"]["environment"] for row in rows
    )
    again = cli("mix", *args, "--output", "again.jsonl", sites=(site,))
    other = cli("mix", *args, "--output", "other.jsonl", "--seed", "7", sites=(site,))
    assert again.returncode == other.returncode == 0
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "mixed.jsonl").read_bytes()
    assert (tmp_path / "other.jsonl").read_bytes() != (tmp_path / "mixed.jsonl").read_bytes()
    assert sorted(read(tmp_path / "other.jsonl"), key=json.dumps) == sorted(rows, key=json.dumps)


def test_the_first_config_is_the_default_and_matching_tags_are_kept(
    cli: Any, site: Path, tmp_path: Path
) -> None:
    source = write(tmp_path / "a.jsonl", [relax_row("x", environment="alpha", config="a1"), relax_row("y")])
    result = cli("mix", f"alpha={source}", "--output", "out.jsonl", sites=(site,))
    assert result.returncode == 0, result.stderr
    assert [
        (r["metadata"]["environment"], r["metadata"]["config"]) for r in read(tmp_path / "out.jsonl")
    ] == [
        ("alpha", "a1"),
        ("alpha", "a1"),
    ]


@pytest.mark.parametrize(
    ("rows", "source", "needle"),
    [
        (
            [relax_row("x", environment="beta")],
            "alpha={path}",
            "in.jsonl:1: metadata.environment is 'beta', not 'alpha'",
        ),
        (
            [relax_row("x"), relax_row("y", config="a1")],
            "alpha:a2={path}",
            "in.jsonl:2: metadata.config is 'a1'",
        ),
        ([{"question": "raw"}], "alpha={path}", "in.jsonl:1: not a Relax row"),
        (["not an object"], "alpha={path}", "Expected an object at"),
        ([relax_row("x")], "gamma={path}", "no installed plugin provides environment 'gamma'"),
        ([relax_row("x")], "alpha:zz={path}", "has no config 'zz' (its configs: a1, a2)"),
        ([relax_row("x", usable=False)], "beta={path}", "no usable rows for beta:b1"),
        ([relax_row("x")], "alpha{path}", "expected ENV[:CONFIG]=RELAX.jsonl"),
    ],
)
def test_bad_input_is_refused_by_name_and_nothing_is_written(
    cli: Any, site: Path, tmp_path: Path, rows: list[Any], source: str, needle: str
) -> None:
    path = write(tmp_path / "in.jsonl", rows)
    (tmp_path / "out.jsonl").write_text("previous mix\n")
    result = cli("mix", source.format(path=path), "--output", "out.jsonl", sites=(site,))
    assert result.returncode != 0
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert (tmp_path / "out.jsonl").read_text() == "previous mix\n"
    assert not list(tmp_path.glob("*.tmp"))


def test_the_output_may_not_be_an_input(cli: Any, site: Path, inputs: tuple[Path, Path]) -> None:
    alpha, _beta = inputs
    before = alpha.read_bytes()
    result = cli("mix", f"alpha={alpha}", "--output", str(alpha), sites=(site,))
    assert result.returncode != 0
    assert "the source is never overwritten" in result.stderr
    assert alpha.read_bytes() == before
