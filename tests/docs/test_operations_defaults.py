"""The README's operations figures are the code's: every row of "Operations: limits and timeouts", and
every variable the README gives a default in passing (`VAR` (N)), is read back from the settings the code
builds from an empty environment (and from its classes' own defaults, which must agree), and each
variable is shown to be the one the code reads by setting it. A row or mention this module cannot check
fails naming itself: a new limit gets its reader here, or its default is not pinned.

The limit tests elsewhere always set their variables; only this module pins what an operator who sets
nothing gets (a create cap raised from 4 MiB to 40 MiB passed every other test).
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from attrs import frozen
from starlette.types import Message, Receive, Scope, Send

from relax_gym_core.bridge.upstream import CONNECT_TIMEOUT_S
from relax_gym_core.client.http import MAX_RESPONSE_BYTES
from relax_gym_core.client.settings import ClientOptions
from relax_gym_core.client.trial_request import MAX_INPUT_BYTES
from relax_gym_core.gateway.config import GatewaySettings, Limits, ReplicaSettings
from relax_gym_core.gateway.limits import limit_bodies
from relax_gym_core.gateway.server import DEFAULT_LIMITS, FD_RESERVE, connection_cap
from relax_gym_core.protocol import BRIDGE_PREFIX
from relax_gym_core.protocol.types import REQUEST_ID_MAX_LEN
from relax_gym_core.replicas.pool import ReplicaPool

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"  # the operations table's page
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # defaults mentioned in passing, anywhere
TABLE_SECTION = "Operations: limits and timeouts"
MIB = 1 << 20


def section(title: str) -> str:
    text = OPERATIONS.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@frozen
class Row:
    what: str
    variable: str
    default: str
    why: str

    def __str__(self) -> str:
        return f"README row {self.what!r} ({self.variable})"


def table_rows() -> list[Row]:
    """The rows of the operations table, as written (backticks stripped from the variable)."""
    lines = [line for line in section(TABLE_SECTION).splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    assert header == ["What", "Variable", "Default", "Why this default"], header
    assert set(lines[1].replace("|", "").split()) == {"---"}, lines[1]
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"README table row with {len(cells)} cells: {line}"
        what, variable, default, why = cells
        rows.append(Row(what, variable.strip("`"), default, why))
    return rows


# ---- what the code reads ------------------------------------------------------------------------------
# variable -> how to read its value from settings built from an environment. Each is applied to the
# settings from an empty environment, to the settings classes' own defaults, and to an environment that
# sets the variable (so a renamed variable fails as surely as a changed default).


def _gateway(environ: Mapping[str, str]) -> GatewaySettings:
    return GatewaySettings.from_env((), environ)


def _limit(name: str) -> Callable[[Mapping[str, str]], Any]:
    return lambda environ: getattr(_gateway(environ).limits, name)


def _setting(name: str) -> Callable[[Mapping[str, str]], Any]:
    return lambda environ: getattr(_gateway(environ), name)


def _client(name: str) -> Callable[[Mapping[str, str]], Any]:
    return lambda environ: getattr(ClientOptions.from_env(environ), name)


def _replicas(name: str) -> Callable[[Mapping[str, str]], Any]:
    return lambda environ: getattr(ReplicaSettings.from_env(environ), name)


@frozen
class Reader:
    read: Callable[[Mapping[str, str]], Any]
    built_in: Callable[[], Any]  # the same value from the classes' own defaults (no environment at all)
    other: str  # a valid value that is not the default, to show the variable is the one read


def _limits_default(name: str) -> Callable[[], Any]:
    def read() -> Any:
        values = {getattr(limits, name) for limits in (Limits(), GatewaySettings(environments=()).limits)}
        values.add(getattr(DEFAULT_LIMITS, name))  # what `serve` falls back to without settings
        assert len(values) == 1, f"Limits defaults disagree for {name}: {values}"
        return values.pop()

    return read


READERS: dict[str, Reader] = {
    # the operations table
    "RELAX_GYM_MAX_MODEL_CALL_BYTES": Reader(
        _limit("max_model_call_bytes"), _limits_default("max_model_call_bytes"), "1000"
    ),
    "RELAX_GYM_MAX_CREATE_BYTES": Reader(
        _limit("max_create_bytes"), _limits_default("max_create_bytes"), "1001"
    ),
    "RELAX_GYM_MAX_BODY_BYTES": Reader(
        _limit("max_other_body_bytes"), _limits_default("max_other_body_bytes"), "1002"
    ),
    "RELAX_GYM_HEADER_TIMEOUT_S": Reader(
        _limit("header_timeout_s"), _limits_default("header_timeout_s"), "3.5"
    ),
    "RELAX_GYM_BODY_TIMEOUT_S": Reader(_limit("body_timeout_s"), _limits_default("body_timeout_s"), "4.5"),
    "RELAX_GYM_KEEPALIVE_TIMEOUT_S": Reader(
        _limit("keepalive_timeout_s"), _limits_default("keepalive_timeout_s"), "7"
    ),
    "RELAX_GYM_MAX_CONNECTIONS": Reader(_limit("max_connections"), _limits_default("max_connections"), "33"),
    "RELAX_GYM_SHUTDOWN_BUDGET_S": Reader(
        _limit("shutdown_budget_s"), _limits_default("shutdown_budget_s"), "12.5"
    ),
    "RELAX_GYM_UNKNOWN_KEYS": Reader(
        _setting("unknown_keys"), lambda: GatewaySettings(environments=()).unknown_keys, "refuse"
    ),
    "NEMO_GYM_CALLBACK_TIMEOUT_S": Reader(
        _setting("callback_timeout_s"), lambda: GatewaySettings(environments=()).callback_timeout_s, "42"
    ),
    "NEMO_GYM_CLEANUP_GRACE_S": Reader(
        _setting("cleanup_grace_s"), lambda: GatewaySettings(environments=()).cleanup_grace_s, "43"
    ),
    "RELAX_GYM_TRIAL_RETENTION_S": Reader(
        _setting("retention_s"), lambda: GatewaySettings(environments=()).retention_s, "44"
    ),
    "RELAX_GYM_TRAJECTORY_MAX_BYTES": Reader(
        _setting("trajectory_max_bytes"),
        lambda: GatewaySettings(environments=()).trajectory_max_bytes,
        "1000",
    ),
    # mentioned in passing elsewhere in the README
    "NEMO_GYM_LEASE_SCAN_INTERVAL_S": Reader(
        _setting("scan_interval_s"), lambda: GatewaySettings(environments=()).scan_interval_s, "0.75"
    ),
    "RELAX_GYM_RECOVERY_GIVE_UP_S": Reader(
        _setting("recovery_give_up_s"), lambda: GatewaySettings(environments=()).recovery_give_up_s, "45"
    ),
    "NEMO_GYM_STARTUP_TIMEOUT_S": Reader(
        _client("startup_timeout_s"), lambda: ClientOptions().startup_timeout_s, "46"
    ),
    "NEMO_GYM_REQUEST_TIMEOUT_S": Reader(
        _client("request_timeout_s"), lambda: ClientOptions().request_timeout_s, "47"
    ),
    "NEMO_GYM_ABORT_TIMEOUT_S": Reader(
        _client("abort_timeout_s"), lambda: ClientOptions().abort_timeout_s, "3"
    ),
    "NEMO_GYM_MAX_RETRIES": Reader(_client("max_retries"), lambda: ClientOptions().max_retries, "5"),
    "NEMO_GYM_POLL_INTERVAL_S": Reader(
        _client("poll_interval_s"), lambda: ClientOptions().poll_interval_s, "2.5"
    ),
    "NEMO_GYM_RETRY_BACKOFF_S": Reader(
        _client("retry_backoff_s"), lambda: ClientOptions().retry_backoff_s, "0.5"
    ),
    "RELAX_GYM_REPLICA_PROBE_INTERVAL_S": Reader(
        _replicas("probe_interval_s"), lambda: ReplicaSettings().probe_interval_s, "0.25"
    ),
    "RELAX_GYM_REPLICA_UNRESPONSIVE_S": Reader(
        _replicas("unresponsive_s"), lambda: ReplicaSettings().unresponsive_s, "61"
    ),
    "RELAX_GYM_REPLICA_RESTART_DELAY_S": Reader(
        _replicas("restart_delay_s"), lambda: ReplicaSettings().restart_delay_s, "2.5"
    ),
    "RELAX_GYM_REPLICA_RESTART_ATTEMPTS": Reader(
        _replicas("restart_attempts"), lambda: ReplicaSettings().restart_attempts, "4"
    ),
}


def as_documented(text: str) -> Any:
    """The value a README default states: its leading number (commas and underscores allowed), else a
    `code` word."""
    number = re.match(r"(\d[\d,_]*(?:\.\d+)?)", text)
    if number:
        digits = number.group(1).replace(",", "").replace("_", "")
        return float(digits) if "." in digits else int(digits)
    word = re.match(r"`([^`]+)`", text)
    assert word, f"no value in README default {text!r}"
    return word.group(1)


def check_reader(variable: str, documented: Any, where: str) -> None:
    reader = READERS.get(variable)
    assert reader is not None, f"{where}: this test has no reader for {variable}; add one to READERS"
    from_env = reader.read({})
    assert from_env == documented, (
        f"{where}: README says {documented!r}, the settings from an empty environment have {from_env!r}"
    )
    assert reader.built_in() == documented, (
        f"{where}: README says {documented!r}, the settings class defaults to {reader.built_in()!r}"
    )
    expected = as_documented(reader.other) if reader.other[0].isdigit() else reader.other
    assert reader.read({variable: reader.other}) == expected, (
        f"{where}: setting {variable}={reader.other} did not change the setting: the code reads another name"
    )


# ---- the table ----------------------------------------------------------------------------------------

ROWS = table_rows()


def test_the_table_has_the_rows_this_module_checks() -> None:
    variables = [row.variable for row in ROWS]
    assert len(variables) == len(set(variables)), f"a variable appears twice: {variables}"
    assert len(ROWS) >= 12, f"the operations table lost rows: {variables}"
    assert all(re.fullmatch(r"(RELAX_GYM|NEMO_GYM)_[A-Z0-9_]+", v) for v in variables), variables


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.variable)
def test_each_row_is_the_codes_default_under_the_codes_variable(row: Row) -> None:
    check_reader(row.variable, as_documented(row.default), str(row))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.variable)
def test_each_rows_details_hold(row: Row) -> None:
    """What the default and why columns say besides the figure: sizes in MiB, the retention count,
    whose default it is, how the cap is lowered."""
    in_mib = re.search(r"\((\d+) MiB\)", row.default)
    if in_mib:
        assert as_documented(row.default) == int(in_mib.group(1)) * MIB, f"{row}: MiB figure"
    newest = re.search(r"the newest ([\d,]+)", row.default)
    if newest:
        retained = int(newest.group(1).replace(",", ""))
        assert GatewaySettings(environments=()).max_retained == retained, f"{row}: records kept"
        assert GatewaySettings.from_env((), {}).max_retained == retained, f"{row}: records kept"
    if "uvicorn's default" in row.why:
        uvicorn_default = inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default
        assert as_documented(row.default) == uvicorn_default, (
            f"{row}: uvicorn's keep-alive is {uvicorn_default}"
        )
    lowered = re.search(r"half of \(file-descriptor limit \u2212 (\d+)\)", row.why)
    if lowered:
        reserve = int(lowered.group(1))
        assert reserve == FD_RESERVE, f"{row}: descriptors reserved"
        cap = as_documented(row.default)
        assert connection_cap(cap, 1024) == (1024 - reserve) // 2, f"{row}: lowered"
        assert connection_cap(cap, 1 << 20) == cap, f"{row}: not lowered with descriptors to spare"
    if row.variable == "RELAX_GYM_UNKNOWN_KEYS":
        assert "`refuse`" in row.why  # the other mode, which check_reader sets
    if row.variable == "RELAX_GYM_SHUTDOWN_BUDGET_S":
        # "open requests get min(5, budget / 5) seconds (whole seconds, at least 1)"
        assert "min(5, budget / 5) seconds (whole seconds, at least 1)" in section(TABLE_SECTION)
        budget = as_documented(row.default)
        assert Limits(shutdown_budget_s=budget).drain_s == min(5, max(1, int(budget / 5)))
        assert Limits(shutdown_budget_s=3).drain_s == 1
        assert Limits(shutdown_budget_s=100).drain_s == 5


# The body caps, as the middleware enforces them with the default settings: the README promises a 413
# naming the variable beyond the cap, and the cap itself accepted.
BODY_ROUTES = {
    "RELAX_GYM_MAX_MODEL_CALL_BYTES": ["/v1/chat/completions", f"{BRIDGE_PREFIX}/abc-0/v1/responses"],
    "RELAX_GYM_MAX_CREATE_BYTES": ["/v1/trials"],
    "RELAX_GYM_MAX_BODY_BYTES": ["/v1/trials/r1/renew", "/v1/trials/r1/abort"],
}


async def _status_of(path: str, content_length: int) -> tuple[int, bytes]:
    reached = []

    async def app(_scope: Scope, _receive: Receive, send: Send) -> None:
        reached.append(path)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"content-length", str(content_length).encode())],
    }
    await limit_bodies(GatewaySettings.from_env((), {}).limits)(app)(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


@pytest.mark.parametrize("row", [r for r in ROWS if r.variable in BODY_ROUTES], ids=lambda row: row.variable)
def test_each_body_cap_is_enforced_at_its_default(row: Row) -> None:
    cap = as_documented(row.default)
    for path in BODY_ROUTES[row.variable]:
        assert asyncio.run(_status_of(path, cap))[0] == 204, (
            f"{row}: {path} refused a body of exactly the cap"
        )
        status, body = asyncio.run(_status_of(path, cap + 1))
        assert status == 413, f"{row}: {path} accepted a body over the cap"
        assert row.variable.encode() in body, f"{row}: the 413 does not name the variable"


def test_the_body_caps_cover_every_body_row() -> None:
    body_rows = {row.variable for row in ROWS if row.what.startswith("Body of")}
    assert body_rows == set(BODY_ROUTES), body_rows


# ---- defaults given in passing, and the fixed limits --------------------------------------------------

MENTION = re.compile(r"`((?:RELAX_GYM|NEMO_GYM)_[A-Z0-9_]+)`\s*(?:\(|,\s+)(\d[\d,_]*(?:\.\d+)?)")


def mentions() -> list[tuple[str, str, str]]:
    """(variable, default, page:line) of every `VAR` (N) the README and the docs pages write."""
    found = []
    for page in PAGES:
        text = page.read_text()
        where = page.relative_to(ROOT)
        found += [
            (match.group(1), match.group(2), f"{where}:{text.count(chr(10), 0, match.start()) + 1}")
            for match in MENTION.finditer(text)
        ]
    return found


def test_the_readme_mentions_defaults_in_passing() -> None:
    found = {variable for variable, _, _ in mentions()}
    # A sanity floor: the pattern still matches how the README writes them.
    assert {
        "NEMO_GYM_STARTUP_TIMEOUT_S",
        "RELAX_GYM_REPLICA_UNRESPONSIVE_S",
        "NEMO_GYM_RETRY_BACKOFF_S",
    } <= found


@pytest.mark.parametrize(("variable", "default", "line"), mentions(), ids=str)
def test_every_default_the_readme_gives_in_passing_is_the_codes(
    variable: str, default: str, line: int
) -> None:
    check_reader(variable, as_documented(default), f"{line} ({variable} ({default}))")


def test_the_replica_pools_own_defaults_match_the_replica_settings() -> None:
    """`relax-gym up` passes ReplicaSettings to the pool; code that builds a pool itself gets the same."""
    parameters = inspect.signature(ReplicaPool).parameters
    settings = ReplicaSettings()
    assert parameters["probe_interval_s"].default == settings.probe_interval_s
    assert parameters["restart_delay_s"].default == settings.restart_delay_s
    assert parameters["max_restart_attempts"].default == settings.restart_attempts
    assert parameters["unresponsive_s"].default == settings.unresponsive_s


def test_the_fixed_limits_and_the_thin_clients_caps() -> None:
    text = " ".join(section(TABLE_SECTION).split())  # line breaks as spaces
    fixed = re.search(
        r"Fixed limits: a model call's upstream connection attempt (\d+) s; Messages streams and late "
        r"Chat/Responses answers send a keep-alive every (\d+) s; `request_id` at most (\d+) characters",
        text,
    )
    assert fixed, "the README's fixed limits sentence changed: update this test with it"
    connect_s, keepalive_s, request_id_len = (int(value) for value in fixed.groups())
    assert connect_s == CONNECT_TIMEOUT_S
    assert (
        keepalive_s
        == GatewaySettings(environments=()).keepalive_s
        == GatewaySettings.from_env((), {}).keepalive_s
    )
    assert request_id_len == REQUEST_ID_MAX_LEN
    response = re.search(r"It reads at most (\d+) MiB of any response", text)
    input_file = re.search(
        r"reads `RELAX_INPUT_JSON` only if it is a regular file of at most (\d+) MiB", text
    )
    assert response and input_file, "the README's thin-client caps changed: update this test with them"
    assert int(response.group(1)) * MIB == MAX_RESPONSE_BYTES
    assert int(input_file.group(1)) * MIB == MAX_INPUT_BYTES
