"""The report's plots as PNG bytes, drawn with matplotlib's object API on the Agg canvas (no pyplot, no
display, no global state). matplotlib is the `report` extra and is imported only when a plot is drawn.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

COLOURS = ("#1f77b4", "#ff7f0e")  # run A, run B
SIZE = (6.0, 3.4)


def _figure() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError:
        from relax_gym_core.errors import ConfigError  # noqa: PLC0415

        raise ConfigError(
            "relax-gym report draws its plots with matplotlib: pip install 'relax-gym-core[report]'"
        ) from None
    figure = Figure(figsize=SIZE, dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def histogram(
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    xlabel: str,
    unit_bins: bool = False,
    whole: bool = False,
) -> bytes:
    """One histogram per run, bars side by side on shared bins (rewards: ten bins over [0, 1]; counts such
    as turns, `whole`: one bin per value)."""
    figure, axes = _figure()
    values = [value for run in series.values() for value in run]
    if unit_bins and values and min(values) >= 0.0 and max(values) <= 1.0:
        bins: Any = [index / 10 for index in range(11)]
    elif whole and values:
        bins = [value - 0.5 for value in range(int(min(values)), int(max(values)) + 2)]
        axes.xaxis.get_major_locator().set_params(integer=True)
    else:
        low, high = (min(values), max(values)) if values else (0.0, 1.0)
        bins = 10 if high > low else [low - 0.5, low + 0.5]
    labels = list(series)
    data = [list(series[label]) for label in labels]
    if any(data):
        axes.hist(data, bins=bins, label=labels, color=list(COLOURS[: len(labels)]))
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("trials")
    axes.yaxis.get_major_locator().set_params(integer=True)
    if len(labels) > 1:
        axes.legend()
    return _png(figure)


def curve(series: Mapping[str, Mapping[str, float]], *, title: str, xlabel: str, ylabel: str) -> bytes:
    """pass@k against k, one line per run."""
    figure, axes = _figure()
    for colour, (label, points) in zip(COLOURS, series.items(), strict=False):
        ks = sorted(points, key=int)
        axes.plot([int(k) for k in ks], [points[k] for k in ks], marker="o", label=label, color=colour)
    axes.set_ylim(0, 1.05)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.xaxis.get_major_locator().set_params(integer=True)
    if len(series) > 1:
        axes.legend()
    return _png(figure)


def bars(series: Mapping[str, Mapping[str, int]], *, title: str, xlabel: str) -> bytes:
    """Counts by category (failures by kind), one bar per run and category."""
    figure, axes = _figure()
    categories = sorted({name for counts in series.values() for name in counts})
    height = 0.8 / max(len(series), 1)
    for index, (label, counts) in enumerate(series.items()):
        positions = [position + index * height for position in range(len(categories))]
        axes.barh(
            positions,
            [counts.get(name, 0) for name in categories],
            height=height,
            label=label,
            color=COLOURS[index % len(COLOURS)],
        )
    axes.set_yticks([position + height * (len(series) - 1) / 2 for position in range(len(categories))])
    axes.set_yticklabels(categories)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    if len(series) > 1:
        axes.legend()
    return _png(figure)
