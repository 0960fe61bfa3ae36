"""`relax-gym report DIR [DIR2]`: one self-contained HTML file (plots embedded as PNG data, also written
beside it) from a rollout directory, or two side by side with per-row differences (a base and a trained
checkpoint on the same data). No server is needed to view it.

The numbers are summary.json's (recomputed with the same function when a run was cut before writing
one); the plots and trial lists come from trials.jsonl.
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import os
import secrets
import shutil
import statistics
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from relax_gym_core.errors import ConversionError
from relax_gym_core.jsonl import atomic_output
from relax_gym_core.rollout import plots
from relax_gym_core.rollout.overview import overview
from relax_gym_core.rollout.store import RUN_FILE, SUMMARY_FILE, load_trajectories, load_trials, read_run
from relax_gym_core.rollout.summary import is_scored, summarize
from relax_gym_core.rollout.trial_view import trial_page

SLOWEST = 10
MAX_LISTED = 200
STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:72em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}
img{max-width:100%;margin:0.3em 0}.plots{display:grid;grid-template-columns:1fr 1fr;gap:0.5em}
.up{color:#087a1f}.down{color:#b00020}code{font-size:90%}
#overview th{cursor:pointer}#overview th[data-dir=asc]::after{content:" \\25B2"}
#overview th[data-dir=desc]::after{content:" \\25BC"}
"""


@frozen
class Run:
    label: str
    directory: Path
    info: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]


def load_run(directory: Path, label: str) -> Run:
    if not directory.is_dir():
        raise ConversionError(f"{directory}: no such rollout directory")
    held = read_run(directory)
    if held is None:
        raise ConversionError(f"{directory}: not a rollout directory (no {RUN_FILE})")
    found, _ = load_trials(directory, repair=False)
    records = sorted(found.values(), key=lambda record: (record["row"], record["repeat"]))
    try:
        summary = json.loads((directory / SUMMARY_FILE).read_text())
    except FileNotFoundError:
        summary = summarize(
            records,
            run={"run_id": held.run_id, "data": held.data, "policy": held.policy, "model": held.model},
            repeats=max((record["repeat"] for record in records), default=1),
            pass_threshold=1.0,
            planned=len(records),
            complete=False,
        )
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{directory / SUMMARY_FILE}: unreadable ({exc})") from None
    return Run(
        label,
        directory,
        {"run_id": held.run_id, "policy": held.policy, "model": held.model},
        records,
        summary,
    )


def check_same_data(first: Run, second: Run) -> None:
    digests = {record["row"]: record["row_digest"] for record in first.records}
    common = 0
    for record in second.records:
        digest = digests.get(record["row"])
        if digest is None:
            continue
        if digest != record["row_digest"]:
            raise ConversionError(
                f"{first.directory} and {second.directory} ran different data "
                f"(line {record['row']} differs): "
                "only runs of the same data compare row by row"
            )
        common += 1
    if not common:
        raise ConversionError(f"{first.directory} and {second.directory} have no row in common to compare")


# ---- HTML pieces ----------------------------------------------------------------------------------------


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape(str(value))


def _cell(value: Any, field: str | None = None, run: int | None = None) -> str:
    attributes = ""
    if field is not None:
        attributes += f' data-field="{html.escape(field)}"'
    if run is not None:
        attributes += f' data-run="{run}"'
    numeric = isinstance(value, int | float) or value is None
    return f"<td{' class=n' if numeric else ''}{attributes}>{fmt(value)}</td>"


def _table(headers: Sequence[str], rows: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(header)}</th>" for header in headers)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _metrics(stats: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(field, value) of one environment's summary, in display order; field names are summary.json paths."""
    found: list[tuple[str, Any]] = [
        (key, stats.get(key))
        for key in ("trials", "rows", "scored", "infra_failures", "mean_reward", "reward_stdev")
    ]
    found += [(f"pass_at_k.{k}", value) for k, value in stats.get("pass_at_k", {}).items()]
    for group in ("latency_s", "model_calls", "answered_calls", "tokens"):
        for key in ("mean", "p50", "p90", "p99", "max"):
            found.append((f"{group}.{key}", (stats.get(group) or {}).get(key)))
    found += [
        (f"failures_by_kind.{kind}", count) for kind, count in stats.get("failures_by_kind", {}).items()
    ]
    return found


def _summary_table(environment: str, runs: Sequence[Run]) -> str:
    stats = [run.summary["environments"].get(environment) or {} for run in runs]
    fields = list(dict.fromkeys(field for one in stats for field, _ in _metrics(one)))
    values = [dict(_metrics(one)) for one in stats]
    rows = []
    for field in fields:
        cells = [
            _cell(value.get(field), f"{environment}.{field}", index) for index, value in enumerate(values)
        ]
        if len(runs) == 2:
            a, b = values[0].get(field), values[1].get(field)
            delta = b - a if isinstance(a, int | float) and isinstance(b, int | float) else None
            cells.append(_cell(delta))
        rows.append(f"<tr><td><code>{html.escape(field)}</code></td>{''.join(cells)}</tr>")
    headers = ["figure", *[run.label for run in runs], *(["B - A"] if len(runs) == 2 else [])]
    return _table(headers, rows)


def page_name(record: Mapping[str, Any]) -> str:
    """The trial page of a (row, repeat): one page shows it in every run of the report."""
    return f"{record.get('row')}-{record.get('repeat')}.html"


def _open(record: Mapping[str, Any], pages: str | None) -> str:
    if pages is None:
        return "<td></td>"
    href = html.escape(f"{pages}/trials/{page_name(record)}", quote=True)
    return f"<td><a href='{href}'>open</a></td>"


def _trial_row(run: Run, record: Mapping[str, Any], *, error: bool, pages: str | None = None) -> str:
    timings = record.get("timings") or {}
    cells = [
        _open(record, pages),
        _cell(run.label),
        _cell(record.get("row")),
        _cell(record.get("repeat")),
        _cell(record.get("environment")),
        _cell(record.get("status")),
        _cell(record.get("reward")),
        _cell(timings.get("total_s")),
        _cell(record.get("model_calls")),
    ]
    if error:
        cells += [
            _cell(record.get("failure_kind")),
            _cell(record.get("error")),
            _cell(record.get("request_id")),
        ]
    return f"<tr>{''.join(cells)}</tr>"


TRIAL_HEADERS = ["", "run", "row", "repeat", "environment", "status", "reward", "seconds", "model calls"]
MAX_PAGED = 2_000  # trials listed (with a page each) under "Trials"; the tables above list theirs anyway
FILTER = """<p>Show: <button onclick="only('')">all</button> <button onclick="only('failed')">failed</button>
<button onclick="only('zero')">reward 0</button> <button onclick="only('slow')">slowest</button></p>
<script>function only(k){for(const r of document.querySelectorAll('#trials tr[data-k]'))
r.style.display=(!k||r.dataset.k.split(' ').includes(k))?'':'none'}</script>"""


def _seconds(record: Mapping[str, Any]) -> float:
    value = (record.get("timings") or {}).get("total_s")
    return float(value) if isinstance(value, int | float) else 0.0


def paged(runs: Sequence[Run]) -> dict[str, list[dict[str, Any]]]:
    """The trials that get a page, by run label: the slowest, the failed, and the first MAX_PAGED."""
    chosen: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        slow = sorted(run.records, key=_seconds, reverse=True)[:SLOWEST]
        failed = [record for record in run.records if not is_scored(record)][:MAX_LISTED]
        keep = {id(record): record for record in (*run.records[:MAX_PAGED], *slow, *failed)}
        chosen[run.label] = list(keep.values())
    return chosen


def _trial_lists(runs: Sequence[Run], pages: str | None) -> str:
    slow = [
        _trial_row(run, record, error=False, pages=pages)
        for run in runs
        for record in sorted(run.records, key=_seconds, reverse=True)[:SLOWEST]
    ]
    failed = [
        _trial_row(run, record, error=True, pages=pages)
        for run in runs
        for record in [record for record in run.records if not is_scored(record)][:MAX_LISTED]
    ]
    parts = [f"<h2>The {SLOWEST} slowest trials</h2>", _table(TRIAL_HEADERS, slow)]
    parts.append(
        f"<h2 id=failed>Failed trials ({sum(not is_scored(r) for run in runs for r in run.records)})</h2>"
    )
    if failed:
        parts.append(_table([*TRIAL_HEADERS, "failure kind", "error", "request id"], failed))
    else:
        parts.append("<p>None: every trial ended with a reward.</p>")
    if pages is not None:
        parts.append(_all_trials(runs, pages))
    return "".join(parts)


def _all_trials(runs: Sequence[Run], pages: str) -> str:
    """Every trial (up to MAX_PAGED a run), each linked to its page, with filters."""
    rows = []
    for run in runs:
        cut = sorted(_seconds(r) for r in run.records)[-max(1, len(run.records) // 10)] if run.records else 0
        for record in run.records[:MAX_PAGED]:
            tags = ["failed"] if not is_scored(record) else ["zero"] if record.get("reward") == 0 else []
            tags += ["slow"] if run.records and _seconds(record) >= cut else []
            row = _trial_row(run, record, error=False, pages=pages)
            rows.append(row.replace("<tr>", f"<tr data-k='{' '.join(tags)}'>", 1))
    more = sum(max(0, len(run.records) - MAX_PAGED) for run in runs)
    note = f"<p>The first {MAX_PAGED:,} of each run are listed ({more:,} more not).</p>" if more else ""
    return f"<h2 id=trials>Trials</h2>{FILTER}{note}" + _table(TRIAL_HEADERS, rows).replace(
        "<table>", "<table id=trials>", 1
    )


def _row_means(run: Run) -> dict[int, tuple[str, float]]:
    rewards: dict[int, list[float]] = defaultdict(list)
    environments: dict[int, str] = {}
    for record in run.records:
        if is_scored(record):
            rewards[record["row"]].append(float(record["reward"]))
            environments[record["row"]] = str(record["environment"])
    return {row: (environments[row], statistics.fmean(values)) for row, values in rewards.items()}


def _row_differences(first: Run, second: Run) -> str:
    a, b = _row_means(first), _row_means(second)
    common = sorted(set(a) & set(b), key=lambda row: (b[row][1] - a[row][1], row))
    better = sum(1 for row in common if b[row][1] > a[row][1])
    worse = sum(1 for row in common if b[row][1] < a[row][1])
    rows = []
    for row in common:
        delta = b[row][1] - a[row][1]
        style = " class=up" if delta > 0 else " class=down" if delta < 0 else ""
        rows.append(
            f"<tr{style}>{_cell(row)}{_cell(a[row][0])}{_cell(a[row][1], f'row.{row}', 0)}"
            f"{_cell(b[row][1], f'row.{row}', 1)}{_cell(delta)}</tr>"
        )
    intro = (
        f"<p>{len(common)} rows scored in both runs: "
        f"<span class=up data-field=rows.better>{better}</span> better "
        f"in B, <span class=down data-field=rows.worse>{worse}</span> worse, {len(common) - better - worse} "
        "the same (mean reward over each row's scored repeats).</p>"
    )
    headers = [
        "row (line)",
        "environment",
        f"mean reward {first.label}",
        f"mean reward {second.label}",
        "B - A",
    ]
    return (
        "<h2>Per-row differences</h2>"
        + intro
        + _table(
            headers,
            rows[:MAX_LISTED]
            if len(rows) <= MAX_LISTED
            else rows[: MAX_LISTED // 2] + rows[-MAX_LISTED // 2 :],
        )
    )


# ---- plots and the document -----------------------------------------------------------------------------


@frozen
class Plot:
    environment: str | None  # None: about every environment
    stem: str  # its file name, without .png
    caption: str
    png: bytes

    def img(self) -> str:
        data = base64.b64encode(self.png).decode()
        caption = html.escape(self.caption)
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{caption}" '
            f'data-plot="{html.escape(self.stem)}">'
            f"<figcaption>{caption}</figcaption></figure>"
        )


def _plots(runs: Sequence[Run]) -> Iterator[Plot]:
    environments = sorted({name for run in runs for name in run.summary["environments"]})
    for environment in environments:
        chosen = [(run, [r for r in run.records if r.get("environment") == environment]) for run in runs]
        rewards = {
            run.label: [float(r["reward"]) for r in records if is_scored(r)] for run, records in chosen
        }
        yield Plot(
            environment,
            f"reward-{environment}",
            f"{environment}: reward distribution (scored trials)",
            plots.histogram(rewards, title=f"{environment}: rewards", xlabel="reward", unit_bins=True),
        )
        passes = {
            run.label: (run.summary["environments"].get(environment) or {}).get("pass_at_k", {})
            for run in runs
        }
        yield Plot(
            environment,
            f"pass-at-k-{environment}",
            f"{environment}: pass@k",
            plots.curve(passes, title=f"{environment}: pass@k", xlabel="k", ylabel="pass@k"),
        )
        turns = {
            run.label: [float(r["model_calls"]) for r in records if isinstance(r.get("model_calls"), int)]
            for run, records in chosen
        }
        yield Plot(
            environment,
            f"turns-{environment}",
            f"{environment}: turns (model calls per trial)",
            plots.histogram(turns, title=f"{environment}: turns", xlabel="model calls per trial", whole=True),
        )
        latency = {
            run.label: [
                float(r["timings"]["total_s"])
                for r in records
                if isinstance((r.get("timings") or {}).get("total_s"), int | float)
            ]
            for run, records in chosen
        }
        yield Plot(
            environment,
            f"latency-{environment}",
            f"{environment}: trial latency",
            plots.histogram(latency, title=f"{environment}: latency", xlabel="seconds per trial"),
        )
    failures = {run.label: run.summary["overall"].get("failures_by_kind", {}) for run in runs}
    if any(failures.values()):
        yield Plot(
            None,
            "failures",
            "infrastructure failures by kind",
            plots.bars(failures, title="failures by kind", xlabel="trials"),
        )


def _runs_table(runs: Sequence[Run]) -> str:
    rows = []
    for index, run in enumerate(runs):
        summary = run.summary
        rows.append(
            f"<tr>{_cell(run.label)}{_cell(str(run.directory))}{_cell(run.info['run_id'])}"
            f"{_cell(run.info['policy'])}{_cell(run.info['model'])}{_cell(summary['run'].get('data'))}"
            f"{_cell(summary['run'].get('repeats'), 'run.repeats', index)}"
            f"{_cell(summary.get('finished'), 'finished', index)}"
            f"{_cell(summary.get('planned'), 'planned', index)}"
            f"{_cell(summary.get('complete'), 'complete', index)}</tr>"
        )
    headers = [
        "run",
        "directory",
        "run id",
        "policy",
        "model",
        "data",
        "repeats",
        "finished",
        "planned",
        "complete",
    ]
    return _table(headers, rows)


def render(runs: Sequence[Run], images: Sequence[Plot], pages: str | None = None) -> str:
    """The report page; `pages` is the folder of the trial pages, beside it (None: no trial pages)."""
    environments = sorted({name for run in runs for name in run.summary["environments"]})
    body = [
        f"<h1>relax-gym rollout report: {' vs '.join(html.escape(run.label) for run in runs)}</h1>",
        _runs_table(runs),
    ]
    body.append(
        "<p>Infrastructure failures (no reward: failed, aborted, lost) are counted apart and never enter the "
        "mean "
        "reward; pass@k counts scored repeats only.</p>"
    )
    body.append(overview(runs))
    for environment in environments:
        body.append(f"<h2>{html.escape(environment)}</h2>")
        body.append(_summary_table(environment, runs))
        figures = "".join(plot.img() for plot in images if plot.environment == environment)
        body.append(f"<div class=plots>{figures}</div>")
    overall = "".join(plot.img() for plot in images if plot.environment is None)
    if overall:
        body.append(f"<h2>Failures by kind</h2>{overall}")
    if len(runs) == 2:
        body.append(_row_differences(runs[0], runs[1]))
    body.append(_trial_lists(runs, pages))
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>relax-gym rollout report</title>"
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )


@contextlib.contextmanager
def _replaced_directory(target: Path) -> Iterator[Path]:
    """A fresh directory that takes `target`'s place when the block ends normally (else is removed)."""
    temp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    temp.mkdir(parents=True)
    try:
        yield temp
        if target.exists():
            old = target.with_name(f".{target.name}.{secrets.token_hex(6)}.old")
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(temp, target)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def report(directories: Sequence[str], *, output: str | None = None) -> str:
    """What `relax-gym report` does and prints."""
    if len(directories) > 2:
        raise ConversionError("relax-gym report takes one rollout directory, or two to compare")
    labels = ["A", "B"] if len(directories) == 2 else ["run"]
    runs = [load_run(Path(directory), label) for directory, label in zip(directories, labels, strict=False)]
    if len(runs) == 2:
        check_same_data(runs[0], runs[1])
    target = (
        Path(output) if output else runs[0].directory / ("compare.html" if len(runs) == 2 else "report.html")
    )
    images = list(_plots(runs))
    files = target.stem + "_files"
    document = render(runs, images, pages=files)
    chosen = paged(runs)
    try:
        with _replaced_directory(target.with_name(files)) as folder:
            for plot in images:
                (folder / f"{plot.stem}.png").write_bytes(plot.png)
            written = _write_pages(folder / "trials", runs, chosen, back=f"../../{target.name}")
            with atomic_output(target) as sink:
                sink.write(document.encode())
    except OSError as exc:
        raise ConversionError(f"cannot write {target}: {exc.strerror or exc}") from None
    return f"wrote {target} ({len(images)} plots and {written} trial pages, in {files}/)"


def _write_pages(
    folder: Path, runs: Sequence[Run], chosen: Mapping[str, list[dict[str, Any]]], *, back: str
) -> int:
    """One page per (row, repeat) chosen in any run, showing it in every run (side by side for two)."""
    folder.mkdir()
    keys = {(r["row"], r["repeat"]) for records in chosen.values() for r in records}
    by_key = [{(r["row"], r["repeat"]): r for r in run.records} for run in runs]
    wanted = [{str(by[k]["request_id"]) for k in keys if k in by} for by in by_key]
    documents = [load_trajectories(run.directory, ids) for run, ids in zip(runs, wanted, strict=True)]
    for row, repeat in sorted(keys):
        sides = []
        for run, by, found in zip(runs, by_key, documents, strict=True):
            record = by.get((row, repeat))
            document = found.get(str(record["request_id"])) if record is not None else None
            sides.append((run.label, record, document))
        title = f"row {row}, repeat {repeat}"
        page = trial_page(title, sides, back=back)
        (folder / page_name({"row": row, "repeat": repeat})).write_text(page)
    return len(keys)
