"""Plots of one or more finished (or interrupted) runs, read from their output directories.

:func:`write_report` reads each run's ``rounds.parquet``, ``events.parquet`` (optional) and
``summary.json`` (optional: an interrupted run has none) and writes the PNGs listed in
:data:`PLOTS`. A plot is written only when at least one run has data for it: a plot whose
columns are missing (or all null) in every run is skipped, so runs without the virtual-time
scheduler get no staleness histogram and no timeline.

Figures are built with :class:`matplotlib.figure.Figure` (Agg rendering, no pyplot state).
"""

from __future__ import annotations

import heapq
import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from raysim.errors import ScenarioError
from raysim.metrics.output import PLOTS
from raysim.metrics.parquet_log import log_files

MAX_TIMELINE_TASKS = 300
STATUS_COLORS = {"applied": "tab:green", "late": "tab:orange", "stale": "tab:purple",
                 "dropped": "tab:gray", "failed": "tab:red", "retried": "tab:brown"}
_ROUND_COLUMNS = ("virtual_time", "wall_time", "test_accuracy")
_EVENT_COLUMNS = ("client_id", "staleness", "status", "virtual_start", "virtual_end")
_FIGSIZE, DPI = (8.0, 5.0), 100


@dataclass
class _Run:
    """The columns the plots need from one run directory (absent columns are left out)."""

    label: str
    rounds: dict[str, np.ndarray]
    events: dict[str, np.ndarray]


def write_report(run_dirs: list[str], out_dir: str | None = None) -> list[str]:
    """Write the PNGs of :data:`PLOTS` that have data for ``run_dirs``; return their paths.

    ``out_dir`` defaults to the run directory for one run and to ``<parent of first run>/report``
    for several. Raises :class:`ScenarioError` for a missing directory or one without
    ``rounds.parquet``, before anything is written.
    """
    if not run_dirs:
        raise ScenarioError("report", run_dirs, "at least one run directory")
    for path in run_dirs:
        if not os.path.exists(os.path.join(path, "rounds.parquet")):
            raise ScenarioError("report", path, "a run directory with rounds.parquet and summary.json")
    labels = run_labels([_summary_name(d) for d in run_dirs], run_dirs)
    runs = [_Run(label, _read_columns(os.path.join(d, "rounds.parquet"), _ROUND_COLUMNS),
                 _read_columns(os.path.join(d, "events.parquet"), _EVENT_COLUMNS))
            for label, d in zip(labels, run_dirs)]
    if out_dir is None:
        first = os.path.abspath(run_dirs[0])
        out_dir = first if len(run_dirs) == 1 else os.path.join(os.path.dirname(first), "report")
    os.makedirs(out_dir, exist_ok=True)

    builders = {
        "accuracy_vs_virtual_time.png": lambda: _accuracy_figure(
            runs, "virtual_time", "Test accuracy vs virtual time", "virtual time (virtual s)"),
        "accuracy_vs_wall_time.png": lambda: _accuracy_figure(
            runs, "wall_time", "Test accuracy vs wall time", "wall time since training start (s)"),
        "staleness_histogram.png": lambda: _staleness_figure(runs),
        "participation_per_client.png": lambda: _participation_figure(runs),
        "timeline.png": lambda: _timeline_figure(runs),
    }
    written = []
    for name in PLOTS:  # every plot a run's directory may hold (clear_run_files removes them)
        fig = builders[name]()
        if fig is None:
            continue
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)  # a bare Figure is not registered with pyplot: nothing to close
        written.append(path)
    return written


def run_labels(names: list[str | None], run_dirs: list[str]) -> list[str]:
    """Legend labels: each run's name, or its directory name where the name is missing or shared.

    Where directory names collide too, the path as given is used.
    """
    bases = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    labels = [name if name else base for name, base in zip(names, bases)]
    labels = [base if labels.count(label) > 1 else label for label, base in zip(labels, bases)]
    return [d if labels.count(label) > 1 else label for label, d in zip(labels, run_dirs)]


def assign_lanes(starts, ends) -> np.ndarray:
    """Gantt lanes: each task (start, end) gets the lowest lane free at its start.

    Tasks are placed in order of start; a lane is free again once its last task has ended
    (a task may start exactly when the previous one in its lane ends). Returns one lane
    index per task, in input order.
    """
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    lanes = np.zeros(len(starts), dtype=int)
    busy: list[tuple[float, int]] = []  # (end, lane) of lanes in use
    free: list[int] = []
    count = 0
    for i in np.argsort(starts, kind="stable"):
        while busy and busy[0][0] <= starts[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lanes[i] = heapq.heappop(free)
        else:
            lanes[i], count = count, count + 1
        heapq.heappush(busy, (ends[i], int(lanes[i])))
    return lanes


def _summary_name(run_dir: str) -> str | None:
    """The run's ``name`` from summary.json, or None when the run has no summary (interrupted)."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f).get("name")


def _read_columns(path: str, wanted: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The ``wanted`` columns present in the Parquet file or log directory (none if it does not
    exist) as arrays; nulls become NaN (numbers) or None (strings)."""
    files = log_files(pafs.LocalFileSystem(), os.path.abspath(path))
    if not files:
        return {}
    present = [c for c in wanted if c in pq.read_schema(files[0]).names]
    table = pq.read_table(files, columns=present)
    out = {}
    for name in present:
        column = table.column(name)
        if pa.types.is_dictionary(column.type):  # to_numpy misplaces nulls of dictionary arrays
            column = column.cast(column.type.value_type)
        out[name] = column.to_numpy()
    return out


def _applied(events: dict[str, np.ndarray]) -> np.ndarray:
    """Mask of applied updates: status == "applied", or every event when there is no status column."""
    n = len(next(iter(events.values()))) if events else 0
    if "status" not in events:
        return np.ones(n, dtype=bool)
    return events["status"] == "applied"


def _overlaid_histograms(ax, series: list[tuple[str, np.ndarray]]) -> None:
    """One translucent, outlined histogram of integer values per (label, values), one bin per integer."""
    low = min(int(v.min()) for _, v in series)
    high = max(int(v.max()) for _, v in series)
    bins = np.arange(low, high + 2) - 0.5
    for k, (label, values) in enumerate(series):
        ax.hist(values, bins=bins, histtype="stepfilled", alpha=0.3, color=f"C{k}")
        ax.hist(values, bins=bins, histtype="step", linewidth=1.5, color=f"C{k}", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()


def new_figure(title: str, xlabel: str, ylabel: str):
    """A bare matplotlib Figure and its axes in the reports' size and style (save at :data:`DPI`)."""
    fig = Figure(figsize=_FIGSIZE)
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _accuracy_figure(runs: list[_Run], time_column: str, title: str, xlabel: str) -> Figure | None:
    """Test accuracy (evaluated rounds only) against ``time_column``, every run overlaid."""
    series = []
    for run in runs:
        if time_column in run.rounds and "test_accuracy" in run.rounds:
            x, y = run.rounds[time_column].astype(float), run.rounds["test_accuracy"].astype(float)
            keep = np.isfinite(x) & np.isfinite(y)
            if keep.any():
                series.append((run.label, x[keep], y[keep]))
    if not series:
        return None
    fig, ax = new_figure(title, xlabel, "test accuracy (fraction correct)")
    for label, x, y in series:
        ax.plot(x, y, marker="o", markersize=3, label=label)
    ax.legend()
    return fig


def _staleness_figure(runs: list[_Run]) -> Figure | None:
    """Staleness of applied updates, one translucent histogram per run."""
    series = []
    for run in runs:
        if "staleness" in run.events:
            values = run.events["staleness"][_applied(run.events)].astype(float)
            values = values[np.isfinite(values)]
            if values.size:
                series.append((run.label, values.astype(int)))
    if not series:
        return None
    fig, ax = new_figure("Staleness of applied updates", "staleness (model versions behind)", "applied updates")
    _overlaid_histograms(ax, series)
    return fig


def _participation_figure(runs: list[_Run]) -> Figure | None:
    """How many clients contributed k applied updates, per run.

    The population is taken as ``max(client_id) + 1`` over all of the run's events (ids are
    0-based), so clients never applied count as zero; clients above the largest id seen are
    unknown to the report and left out.
    """
    series = []
    for run in runs:
        ids = run.events.get("client_id")
        if ids is None or ids.size == 0:
            continue
        ids = ids.astype(int)
        counts = np.bincount(ids[_applied(run.events)], minlength=int(ids.max()) + 1)
        series.append((run.label, counts))
    if not series:
        return None
    fig, ax = new_figure("Participation per client", "applied updates per client (count)", "clients")
    _overlaid_histograms(ax, [(f"{label} ({counts.size} clients)", counts) for label, counts in series])
    return fig


def _timeline_figure(runs: list[_Run]) -> Figure | None:
    """One Gantt panel per run with virtual times: the first tasks by virtual start, one lane
    per concurrently running task, coloured by status."""
    panels = []
    for run in runs:
        if "virtual_start" not in run.events or "virtual_end" not in run.events:
            continue
        start = run.events["virtual_start"].astype(float)
        end = run.events["virtual_end"].astype(float)
        status = run.events.get("status", np.full(start.size, None, dtype=object))
        keep = np.flatnonzero(np.isfinite(start) & np.isfinite(end))
        keep = keep[np.argsort(start[keep], kind="stable")][:MAX_TIMELINE_TASKS]
        if keep.size:
            panels.append((run.label, start[keep], end[keep], status[keep]))
    if not panels:
        return None
    fig = Figure(figsize=(_FIGSIZE[0], max(_FIGSIZE[1], 3.0 * len(panels))))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (label, start, end, status) in zip(axes, panels):
        lanes = assign_lanes(start, end)
        names = ["unknown" if s is None else str(s) for s in status]
        colors = [STATUS_COLORS.get(s, "tab:blue") for s in names]
        ax.barh(lanes, end - start, left=start, height=0.8, color=colors)
        ax.set(title=f"{label}: first {start.size} tasks by virtual start",
               xlabel="virtual time (virtual s)", ylabel="lane (concurrent task)")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(handles=[Patch(color=STATUS_COLORS.get(s, "tab:blue"), label=s)
                           for s in sorted(set(names))], title="status", fontsize="small",
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("Client tasks on the virtual clock")
    return fig


def time_to_accuracy_table(run_dirs: list[str], target: float) -> str:
    """A Markdown table: per run, virtual and wall time to reach ``target`` test accuracy
    (first evaluation at or above it), final accuracy, and task counts by status."""
    names = [_summary_name(d) for d in run_dirs]
    lines = [f"| run | virtual time to {target:g} accuracy | wall s to it | final accuracy | final virtual time "
             "| applied | late | dropped | failed | stale |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, run_dir in zip(run_labels(names, run_dirs), run_dirs):
        rounds = _read_columns(os.path.join(run_dir, "rounds.parquet"),
                               ("virtual_time", "wall_time", "test_accuracy"))
        acc = rounds["test_accuracy"].astype(float)
        hit = np.flatnonzero(np.nan_to_num(acc, nan=-1.0) >= target)
        reached = (f"{rounds['virtual_time'][hit[0]]:,.0f}", f"{rounds['wall_time'][hit[0]]:.1f}") if len(hit) \
            else ("not reached", "—")
        final = acc[np.isfinite(acc)][-1] if np.isfinite(acc).any() else float("nan")
        with open(os.path.join(run_dir, "summary.json")) as f:
            tasks = json.load(f).get("tasks", {})
        counts = " | ".join(str(tasks.get(k, 0)) for k in ("applied", "late", "dropped", "failed", "stale"))
        lines.append(f"| {label} | {reached[0]} | {reached[1]} | {final:.4f} | "
                     f"{rounds['virtual_time'][-1]:,.0f} | {counts} |")
    return "\n".join(lines)
