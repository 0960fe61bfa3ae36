"""`relax-gym plugins` and `relax-gym convert` as real processes seeing a real fake distribution."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from relax_gym_core.plugin.reference import convert_row

# The fake environment's own convert_row (its class body in the plugin module, which imports RowError and
# reference): refuses one field by name, has a bug on another, and otherwise converts as the reference does.
CONVERTING_METHODS = """
def convert_row(self, row):
    if "reject" in row:
        raise RowError("field 'reject' is not allowed")
    if "explode" in row:
        raise KeyError("a plugin bug")
    return reference.convert_row(row)
"""
GSM8K_ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Combien font 3 + 5 ? — réponds"}]},
    "expected_answer": 8,
    "reference_solution": "8",
}
WORKPLACE_ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "Mail Bob"}],
        "tools": [{"type": "function", "name": "send_email"}],
        "temperature": 1.0,
    },
    "ground_truth": [{"name": "send_email", "arguments": "{}"}],
    "id": 3,
}


@pytest.fixture
def site(install_dist: Callable[..., Any], good_plugin: Callable[..., str]) -> Path:
    dist = install_dist(
        distribution="relax-gym-fake",
        version="1.2.3",
        entry_points={"fake": "{pkg}.plugin"},
        modules={"plugin": good_plugin("fake_env", CONVERTING_METHODS)},
    )
    path: Path = dist.site
    return path


def jsonl(*rows: object) -> str:
    return "".join(f"{json.dumps(row)}\n" for row in rows)


def leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.rglob("*.tmp"))


def assert_clean_error(result: Any, needle: str) -> None:
    assert result.returncode == 2, result.stderr
    assert f"relax-gym: error: {needle}" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


# ---- plugins -------------------------------------------------------------------------------------------


def test_plugins_json_lists_the_distribution_and_its_environments(cli: Any, site: Path) -> None:
    result = cli("plugins", "--json", sites=(site,))
    assert result.returncode == 0, result.stderr
    [package] = {path.name for path in site.iterdir() if not path.name.endswith(".dist-info")}
    document = json.loads(result.stdout)
    assert set(document.pop("nemo_gym")) >= {"python"}  # which NeMo Gym the servers run: tests/gym
    assert document == {
        "plugins": [
            {
                "name": "fake",
                "distribution": "relax-gym-fake",
                "version": "1.2.3",
                "module": f"{package}.plugin",
                "environments": [
                    {
                        "name": "fake_env",
                        "configs": ["default", "hard"],
                        "agent": "simple_agent",
                        "needs": [],
                        "description": "math with a judge",
                    }
                ],
            }
        ]
    }


def test_plugins_table_is_readable_and_omits_the_builtin_reference(cli: Any, site: Path) -> None:
    result = cli("plugins", sites=(site,))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["PLUGIN", "DISTRIBUTION", "VERSION", "MODULE"]
    assert lines[1].split()[:3] == ["fake", "relax-gym-fake", "1.2.3"]
    assert lines[3].split() == ["ENVIRONMENT", "PLUGIN", "CONFIGS", "AGENT", "NEEDS", "DESCRIPTION"]
    assert lines[4].split() == [
        "fake_env",
        "fake",
        "default,hard",
        "simple_agent",
        "-",  # nothing beyond the NeMo Gym environment and a text policy
        "math",
        "with",
        "a",
        "judge",
    ]
    assert "reference" not in result.stdout


def test_plugins_without_any_installed(cli: Any) -> None:
    result = cli("plugins")
    assert result.returncode == 0
    assert result.stdout.startswith("No relax-gym plugins installed.\n")
    assert json.loads(cli("plugins", "--json").stdout)["plugins"] == []


def test_plugins_with_a_broken_plugin_is_one_clear_line(
    cli: Any, install_dist: Callable[..., Any], site: Path
) -> None:
    broken = install_dist(
        distribution="relax-gym-broken",
        entry_points={"broken": "{pkg}.plugin"},
        modules={"plugin": "raise ImportError('needs the vendor SDK')"},
    )
    result = cli("plugins", "--json", sites=(site, broken.site))
    assert_clean_error(result, "plugin entry point 'broken'")
    assert "relax-gym-broken" in result.stderr
    assert "needs the vendor SDK" in result.stderr
    disabled = cli("plugins", "--json", sites=(site, broken.site), disable=("broken",))
    assert [plugin["name"] for plugin in json.loads(disabled.stdout)["plugins"]] == ["fake"]


# ---- convert -------------------------------------------------------------------------------------------


def test_convert_writes_compact_utf8_rows_creating_parent_directories(
    cli: Any, site: Path, tmp_path: Path
) -> None:
    (tmp_path / "raw.jsonl").write_text(jsonl(GSM8K_ROW) + "\n   \n" + jsonl(WORKPLACE_ROW), encoding="utf-8")
    result = cli(
        "convert", "fake_env", "--input", "raw.jsonl", "--output", "out/sub/relax.jsonl", sites=(site,)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Converted 2 row(s) to out/sub/relax.jsonl\n"
    # Each row tagged with its environment and config, as `relax-gym mix` tags them: the thin client routes
    # it whatever NEMO_GYM_ENVIRONMENT / NEMO_GYM_CONFIG say.
    tags = {"environment": "fake_env", "config": "default", "data_source": "fake_env"}
    expected = [
        {**row, "metadata": {**row["metadata"], **tags}}
        for row in (convert_row(raw) for raw in (GSM8K_ROW, WORKPLACE_ROW))
    ]
    written = (tmp_path / "out" / "sub" / "relax.jsonl").read_text(encoding="utf-8")
    assert written == "".join(
        json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n" for row in expected
    )
    assert "réponds" in written
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("how", ["same path", "relative path", "symlink", "hard link"])
def test_convert_refuses_to_write_over_its_input(cli: Any, site: Path, tmp_path: Path, how: str) -> None:
    source = tmp_path / "raw.jsonl"
    content = jsonl(GSM8K_ROW, WORKPLACE_ROW)
    source.write_text(content)
    (tmp_path / "sub").mkdir()
    if how == "same path":
        output = str(source)
    elif how == "relative path":
        output = "sub/../raw.jsonl"
    elif how == "symlink":
        (tmp_path / "link.jsonl").symlink_to(source)
        output = "link.jsonl"
    else:
        os.link(source, tmp_path / "hard.jsonl")
        output = "hard.jsonl"
    result = cli("convert", "fake_env", "--input", "raw.jsonl", "--output", output, sites=(site,))
    assert_clean_error(result, "Input and output must refer to different files")
    assert source.read_text() == content
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (jsonl(GSM8K_ROW) + '{"question": \n', "Invalid JSON at raw.jsonl:2"),
        ('{"question": "q", "expected_answer": NaN}\n', "Invalid JSON at raw.jsonl:1"),
        (jsonl(GSM8K_ROW) + "\n" + jsonl([1, 2]), "Expected an object at raw.jsonl:3"),
        (jsonl(GSM8K_ROW, {**GSM8K_ROW, "reject": 1}), "raw.jsonl:2: field 'reject' is not allowed"),
        (jsonl({"question": "q"}), "raw.jsonl:1: NeMo Gym row must contain responses_create_params"),
        (jsonl(GSM8K_ROW) + "\udcff\n", "Invalid JSON at raw.jsonl:2: not UTF-8"),
    ],
)
def test_bad_rows_are_named_by_file_and_line_and_leave_the_output_alone(
    cli: Any, site: Path, tmp_path: Path, content: str, needle: str
) -> None:
    (tmp_path / "raw.jsonl").write_bytes(content.encode("utf-8", "surrogateescape"))
    output = tmp_path / "relax.jsonl"
    output.write_text("previous conversion\n")
    result = cli("convert", "fake_env", "--input", "raw.jsonl", "--output", "relax.jsonl", sites=(site,))
    assert_clean_error(result, needle)
    assert output.read_text() == "previous conversion\n"
    assert leftovers(tmp_path) == []


def test_limit_stops_before_later_lines_are_read(cli: Any, site: Path, tmp_path: Path) -> None:
    (tmp_path / "raw.jsonl").write_text(jsonl(GSM8K_ROW, WORKPLACE_ROW, GSM8K_ROW) + "not json\n")
    result = cli(
        "convert",
        "fake_env",
        "--input",
        "raw.jsonl",
        "--output",
        "relax.jsonl",
        "--limit",
        "2",
        sites=(site,),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Converted 2 row(s) to relax.jsonl\n"
    assert len((tmp_path / "relax.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_limit_must_be_positive(cli: Any, site: Path, tmp_path: Path, limit: str) -> None:
    (tmp_path / "raw.jsonl").write_text(jsonl(GSM8K_ROW))
    result = cli(
        "convert", "fake_env", "--input", "raw.jsonl", "--output", "o.jsonl", "--limit", limit, sites=(site,)
    )
    assert_clean_error(result, "--limit must be greater than zero")
    assert not (tmp_path / "o.jsonl").exists()


def test_no_rows_is_an_error_and_keeps_the_existing_output(cli: Any, site: Path, tmp_path: Path) -> None:
    (tmp_path / "raw.jsonl").write_text("\n  \n\t\n")
    output = tmp_path / "relax.jsonl"
    output.write_text("previous conversion\n")
    result = cli("convert", "fake_env", "--input", "raw.jsonl", "--output", "relax.jsonl", sites=(site,))
    assert_clean_error(result, "No rows converted from raw.jsonl")
    assert output.read_text() == "previous conversion\n"
    assert leftovers(tmp_path) == []


def test_output_is_replaced_not_rewritten_in_place(cli: Any, site: Path, tmp_path: Path) -> None:
    (tmp_path / "raw.jsonl").write_text(jsonl(GSM8K_ROW))
    output = tmp_path / "relax.jsonl"
    output.write_text("previous conversion\n")
    os.link(output, tmp_path / "reader-still-holds.jsonl")  # a second name for the old file
    result = cli("convert", "fake_env", "--input", "raw.jsonl", "--output", "relax.jsonl", sites=(site,))
    assert result.returncode == 0, result.stderr
    # A reader of the old file never sees a half-written one: the new content arrived as a new file.
    assert (tmp_path / "reader-still-holds.jsonl").read_text() == "previous conversion\n"
    assert json.loads(output.read_text())["metadata"]["expected_answer"] == "8"
    assert output.stat().st_ino != (tmp_path / "reader-still-holds.jsonl").stat().st_ino


def test_unknown_environment_names_the_installed_ones(cli: Any, site: Path, tmp_path: Path) -> None:
    (tmp_path / "raw.jsonl").write_text(jsonl(GSM8K_ROW))
    result = cli("convert", "fake_envv", "--input", "raw.jsonl", "--output", "o.jsonl", sites=(site,))
    assert_clean_error(result, "no installed plugin provides environment 'fake_envv' (installed: fake_env)")
    assert not (tmp_path / "o.jsonl").exists()


def test_a_config_the_environment_lacks_is_refused_naming_its_configs(
    cli: Any, site: Path, tmp_path: Path
) -> None:
    (tmp_path / "raw.jsonl").write_text(jsonl(GSM8K_ROW))
    result = cli("convert", "fake_env:nope", "--input", "raw.jsonl", "--output", "o.jsonl", sites=(site,))
    assert_clean_error(
        result, "'fake_env:nope': environment 'fake_env' has no config 'nope' (its configs: default, hard)"
    )
    assert not (tmp_path / "o.jsonl").exists()
    tagged = cli("convert", "fake_env:default", "--input", "raw.jsonl", "--output", "o.jsonl", sites=(site,))
    assert tagged.returncode == 0, tagged.stderr
    assert json.loads((tmp_path / "o.jsonl").read_text())["metadata"]["config"] == "default"


def test_missing_input_is_a_clear_error(cli: Any, site: Path) -> None:
    result = cli("convert", "fake_env", "--input", "missing.jsonl", "--output", "o.jsonl", sites=(site,))
    assert_clean_error(result, "cannot read missing.jsonl: No such file or directory")


def test_a_plugin_bug_keeps_its_traceback_and_says_where(cli: Any, site: Path, tmp_path: Path) -> None:
    (tmp_path / "raw.jsonl").write_text(jsonl(GSM8K_ROW, {**GSM8K_ROW, "explode": True}))
    result = cli("convert", "fake_env", "--input", "raw.jsonl", "--output", "o.jsonl", sites=(site,))
    assert result.returncode not in (0, 2)
    assert "KeyError: 'a plugin bug'" in result.stderr
    assert "while converting raw.jsonl:2 for environment 'fake_env'" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()
    assert leftovers(tmp_path) == []


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`relax-gym plugins | head -1`: the pipe closes before the command is done writing."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    with os.fdopen(write, "wb") as stdout:
        result = subprocess.run(
            [sys.executable, "-m", "relax_gym_core.cli", "plugins"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 141
    assert result.stderr == ""


def test_a_wiring_typo_is_refused_at_relax_gym_plugins_naming_both(
    cli: Any, install_dist: Callable[..., Any]
) -> None:
    """A plugin whose agent names a resources server it lacks ("countdwn") fails registration: `relax-gym
    plugins` says which server names what, and what the environment's servers are, in one line."""
    typo = """
from relax_gym_core.plugin import STATELESS, EnvironmentDefinition, hookimpl, resources_server, simple_agent


@hookimpl
def register_environments(registrar):
    registrar.add(EnvironmentDefinition(
        name="countdown", configs=("countdown",), agent="countdown_simple_agent", cleanup=STATELESS,
        servers=(
            resources_server("countdown", "countdown", "relax_gym_countdown.server:Countdown"),
            simple_agent("countdown_simple_agent", resources="countdwn", max_steps=1),
        ),
    ))
"""
    dist = install_dist(
        distribution="relax-gym-typo", entry_points={"typo": "{pkg}.plugin"}, modules={"plugin": typo}
    )
    result = cli("plugins", sites=(dist.site,))
    assert_clean_error(
        result,
        "plugin 'typo': environment 'countdown': server 'countdown_simple_agent' names resources server "
        "'countdwn', which is not one of its servers (countdown, countdown_simple_agent)",
    )
