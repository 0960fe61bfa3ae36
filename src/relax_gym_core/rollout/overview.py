"""The report's first table: every environment of every run in one row each, with readable column names, so a
reader compares environments without scrolling through their sections. A click on a column's name sorts the
rows by it (numbers as numbers, missing values last); the figures are summary.json's (rollout/summary.py).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from attrs import frozen


class SummarisedRun(Protocol):
    @property
    def label(self) -> str: ...
    @property
    def summary(self) -> dict[str, Any]: ...


type Figure = Callable[[Mapping[str, Any]], Any]


def _pass_at(k: str) -> Figure:
    return lambda stats: (stats.get("pass_at_k") or {}).get(k)


def _of(group: str, key: str) -> Figure:
    return lambda stats: (stats.get(group) or {}).get(key)


def _largest_k(stats: Mapping[str, Any]) -> Any:
    passes = stats.get("pass_at_k") or {}
    return passes[max(passes, key=int)] if passes else None


@frozen
class Column:
    title: str  # what a reader sees
    figure: Figure  # the value from one environment's summary
    digits: int = 3  # decimals of a float


COLUMNS: tuple[Column, ...] = (
    Column("trials", lambda stats: stats.get("trials")),
    Column("scored", lambda stats: stats.get("scored")),
    Column("mean reward", lambda stats: stats.get("mean_reward")),
    Column("pass@1", _pass_at("1")),
    Column("pass@k (all repeats)", _largest_k),
    Column("infrastructure failures", lambda stats: stats.get("infra_failures")),
    Column("latency p50 (s)", _of("latency_s", "p50"), 2),
    Column("latency p90 (s)", _of("latency_s", "p90"), 2),
    Column("answered calls (mean)", _of("answered_calls", "mean"), 1),
    Column("tokens (mean)", _of("tokens", "mean"), 0),
)

# Sorts the overview's rows by the clicked column: numbers by value, text by text, "n/a" last; a second
# click on the same column reverses it.
SCRIPT = """<script>
function sortBy(th) {
  const table = th.closest('table'), column = [...th.parentNode.children].indexOf(th);
  const dir = th.dataset.dir === 'asc' ? 'desc' : 'asc';
  for (const other of th.parentNode.children) delete other.dataset.dir;
  th.dataset.dir = dir;
  const key = row => {
    const v = row.children[column].dataset.v;
    return v === undefined ? null : (isNaN(+v) ? v : +v);
  };
  const rows = [...table.querySelectorAll('tr[data-env]')];
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === null || y === null) return x === y ? 0 : (x === null ? 1 : -1);
    const order = x < y ? -1 : x > y ? 1 : 0;
    return dir === 'asc' ? order : -order;
  });
  for (const row of rows) table.tBodies[0].appendChild(row);
}
</script>"""


def _cell(value: Any, digits: int) -> str:
    if value is None or isinstance(value, bool):
        return "<td class=n>n/a</td>"
    if isinstance(value, int | float):
        shown = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
        return f'<td class=n data-v="{value}">{shown}</td>'
    return f'<td data-v="{html.escape(str(value))}">{html.escape(str(value))}</td>'


def overview(runs: Sequence[SummarisedRun]) -> str:
    """The overview table (with its sorting script): a row per environment, per run when runs are compared."""
    compared = len(runs) > 1
    titles = ["environment", *(["run"] if compared else []), *(column.title for column in COLUMNS)]
    head = "".join(
        f'<th onclick="sortBy(this)" title="sort by {html.escape(title)}">{html.escape(title)}</th>'
        for title in titles
    )
    rows = []
    for run in runs:
        for environment, stats in sorted(run.summary["environments"].items()):
            cells = [_cell(environment, 0), *([_cell(run.label, 0)] if compared else [])]
            cells += [_cell(column.figure(stats), column.digits) for column in COLUMNS]
            rows.append(f'<tr data-env="{html.escape(environment)}">{"".join(cells)}</tr>')
    return (
        "<h2>Overview</h2><table id=overview><thead><tr>"
        f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{SCRIPT}"
    )
