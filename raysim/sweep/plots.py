"""Plots of a sweep: a metric of the completed points against a grid key, one line per combination
of the other grid keys (mean over repeats, with their range as error bars), drawn in the style of
:mod:`raysim.report.figures` (a bare Figure, Agg rendering)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator

from raysim.measure import MIB
from raysim.report.figures import DPI, new_figure
from raysim.sweep.results import MIN_STEADY_SECONDS, too_short, value_text

LABELS = {  # metric -> (axis label, scale)
    "steady_updates_per_second": ("steady updates per second", 1.0),
    "parallel_efficiency": ("parallel efficiency (speed-up / actors)", 1.0),
    "median_round_seconds": ("median round time (wall s)", 1.0),
    "peak_rss_bytes": ("peak RSS of the process tree (MiB)", 1.0 / MIB),
    "wall_seconds": ("wall time of the point (s)", 1.0),
    "startup_seconds": ("start-up to the first server step (s)", 1.0),
    "final_test_accuracy": ("final test accuracy", 1.0),
    "virtual_time": ("virtual time at the end (virtual s)", 1.0),
}
STEADY = ("steady_updates_per_second", "parallel_efficiency")  # measured over a run's steady window
BUILT_IN = {"runtime.num_actors": ("steady_updates_per_second", "parallel_efficiency"),
            "data.num_clients": ("median_round_seconds", "peak_rss_bytes")}
"""Plots drawn whenever their grid key is a grid key."""


def write_plots(rows: list[dict], grid: dict, requests: list, out_dir: Path) -> list[str]:
    """Write ``<metric>_vs_<key>.png`` for the built-in plots whose key is a grid key and for each
    requested (metric, key); a plot without data (no completed point) is skipped. Returns the paths."""
    wanted = [(metric, key) for key, metrics in BUILT_IN.items() if key in grid for metric in metrics]
    wanted += [r for r in requests if r not in wanted]
    written = []
    for metric, key in wanted:
        fig = _plot(rows, [k for k in grid if k != key], metric, key)
        if fig is None:
            continue
        path = Path(out_dir) / f"{metric}_vs_{key}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
        written.append(str(path))
    return written


def _lines(rows: list[dict], others: list, metric: str, key: str) -> dict:
    """{line label: {x: [values over repeats]}} of the completed rows with a value."""
    lines = {}
    for row in rows:
        if row["status"] == "completed" and row[metric] is not None:
            label = ", ".join(f"{k}={value_text(row[k])}" for k in others)
            lines.setdefault(label, {}).setdefault(value_text(row[key]), []).append(row[metric])
    return lines


def _plot(rows: list[dict], others: list, metric: str, key: str):
    """One figure of ``metric`` against grid key ``key``; None without data. ``parallel_efficiency``:
    per line, the steady rate's speed-up over its 1-actor point (or its fewest actors) divided by
    the actors' ratio."""
    lines = _lines(rows, others, "steady_updates_per_second" if metric == "parallel_efficiency" else metric, key)
    xs = list(dict.fromkeys(x for points in lines.values() for x in points))  # grid order
    values = {x: next(row[key] for row in rows if value_text(row[key]) == x) for x in xs}
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values())
    if metric == "parallel_efficiency":
        lines = {label: _efficiency(points, values) for label, points in lines.items()} if numeric else {}
    if not any(lines.values()):
        return None
    label, scale = LABELS.get(metric, (metric, 1.0))
    fig, ax = new_figure(f"{label} vs {key}", key, label)
    if metric in STEADY and too_short(rows):
        ax.set_title(f"{label} vs {key}\n(steady window under {MIN_STEADY_SECONDS:g} s at some points: noise; "
                     f"run more rounds)", color="tab:red")
    for name, points in lines.items():
        order = sorted(points, key=lambda x: values[x]) if numeric else [x for x in xs if x in points]
        at = [values[x] if numeric else xs.index(x) for x in order]
        ys = [np.array(points[x], dtype=float) * scale for x in order]
        mean = np.array([y.mean() for y in ys])
        spread = [mean - [y.min() for y in ys], [y.max() for y in ys] - mean]
        ax.errorbar(at, mean, yerr=spread if any(len(y) > 1 for y in ys) else None, marker="o", capsize=3,
                    label=name or None)
    if numeric:
        low, high = min(values.values()), max(values.values())
        if low > 0 and high / low >= 100:  # the values span decades
            ax.set_xscale("log")
        elif all(isinstance(v, int) for v in values.values()):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.set_xticks(range(len(xs)), xs)
    ax.set_ylim(bottom=0)  # every metric is >= 0: a zero baseline keeps small differences small
    if any(lines):
        ax.legend(fontsize="small")
    return fig


def _efficiency(points: dict, values: dict) -> dict:
    """{x: [efficiency]} from {x: [steady rates]}: mean rate over the base's, divided by x over the base's x."""
    base = min(points, key=lambda x: (values[x] != 1, values[x]))
    rate = np.mean(points[base])
    return {x: [float(np.mean(r) / rate / (values[x] / values[base]))] for x, r in points.items()
            if values[x] > 0 and rate > 0}
