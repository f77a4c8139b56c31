"""Plots of one or more finished (or interrupted) runs, read from their output directories.

:func:`write_report` reads each run's ``rounds.parquet``, ``events.parquet`` (optional),
``summary.json`` and ``scenario.yaml`` (optional: an interrupted run may lack them) from any
``output.dir`` (a path or a URI pyarrow understands) and writes the PNGs listed in :data:`PLOTS`
and ``report.html`` (:mod:`raysim.report.html`). A plot is written only when at least one run has
data for it: a plot whose columns are missing (or all null) in every run is skipped, so runs
without the virtual-time scheduler get no staleness histogram and no timeline.

An axis whose positive values span more than :data:`SPAN` (max / min) is logarithmic (symlog
where zeros or negatives occur); errors and norms (:data:`LOG_COLUMNS`) always are. Figures are
built with :class:`matplotlib.figure.Figure` (Agg rendering, no pyplot state).
"""

from __future__ import annotations

import heapq
import io
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import yaml
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from raysim.errors import ScenarioError, first_line
from raysim.output.directory import (DIAGNOSTICS, PLOTS, REPORT_HTML, SERVER_DIAGNOSTIC, OutputDir, applied,
                                     table_arrays)
from raysim.report.html import number_text, report_html, seconds_text

MAX_TIMELINE_TASKS = 300
SPAN = 100.0  # an axis whose positive values span more than this factor is logarithmic
MAX_MARKERS = 60  # series with more points are drawn without markers
_MARKERS = "osD^vPX*"  # one per overlaid run (_run_style)
STATUS_COLORS = {"applied": "tab:green", "late": "tab:orange", "stale": "tab:purple",
                 "dropped": "tab:gray", "failed": "tab:red", "retried": "tab:brown", "diverged": "black",
                 "aborted": "tab:olive"}
X_AXES = {"round": "server step (round, or async model version)", "virtual_time": "virtual time (virtual s)",
          "wall_time": "wall time since training start (s)",
          "epsilon": "ε spent (differential privacy, at the run's δ)",
          "total_bytes_up": "bytes uploaded so far, all clients"}
TIME_AXES = ("round", "virtual_time", "wall_time")  # accuracy and loss are drawn against each
# errors and norms: log y whatever their span
LOG_COLUMNS = ("rel_error", "grad_norm_sq", "loss_gap", "deployed_loss_gap")
PERSONALIZED = ("personalized_accuracy", "personalized_accuracy_mean", "personalized_accuracy_ci95")
_ROUND_COLUMNS = (*X_AXES, "train_loss", "test_loss", "test_accuracy", *PERSONALIZED, *DIAGNOSTICS)
_EVENT_COLUMNS = ("round", "client_id", "staleness", "status", "virtual_start", "virtual_end", "byzantine")
_STYLES = {"train_loss": {"linestyle": "-", "alpha": 0.5, "linewidth": 0.8},  # per step, noisy: drawn light
           "test_loss": {"linestyle": "--", "linewidth": 1.8}, "personalized_accuracy": {"linestyle": "-"},
           "personalized_accuracy_mean": {"linestyle": "--"}, "test_accuracy": {"linestyle": ":"}}
_FIGSIZE, DPI = (8.0, 5.0), 100


@dataclass
class SavedRun:
    """What the report needs from one run directory (absent columns are left out)."""

    label: str
    rounds: dict[str, np.ndarray]
    events: dict[str, np.ndarray]
    summary: dict | None  # summary.json (None: the run has none, e.g. killed)
    scenario: dict | None  # scenario.yaml, the resolved scenario
    own_diagnostics: tuple = ()  # the rounds columns the algorithm's server_diagnostics added

    def series(self, x: str, y: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows where both ``x`` and ``y`` are finite, or None if there are none."""
        if x not in self.rounds or y not in self.rounds:
            return None
        xs, ys = self.rounds[x].astype(float), self.rounds[y].astype(float)
        keep = np.isfinite(xs) & np.isfinite(ys)
        return (xs[keep], ys[keep]) if keep.any() else None

    def reach(self, target: float) -> int | None:
        """Index of the first evaluation at or above ``target`` test accuracy, or None."""
        acc = self.rounds.get("test_accuracy")
        hit = [] if acc is None else np.flatnonzero(np.nan_to_num(acc.astype(float), nan=-np.inf) >= target)
        return int(hit[0]) if len(hit) else None


def write_report(run_dirs: list[str], out_dir: str | None = None, target: float | None = None) -> list[str]:
    """Write the PNGs of :data:`PLOTS` that have data for ``run_dirs`` and ``report.html``; return
    their paths.

    ``out_dir`` defaults to the run directory for one run and to ``<parent of first run>/report``
    for several. ``target`` (a test accuracy) is drawn on the accuracy plots, each run's time to
    reach it in the legend. Raises :class:`ScenarioError` for a missing directory or one without
    ``rounds.parquet``, before anything is written.
    """
    runs = load_runs(run_dirs)
    if out_dir is None:
        first = run_dirs[0].rstrip("/")
        out_dir = first if len(run_dirs) == 1 else f"{first.rsplit('/', 1)[0] if '/' in first else '.'}/report"
    out = OutputDir.open(out_dir)
    builders = {
        **{f"accuracy_vs_{x}.png": (lambda x=x: _lines_figure(runs, x, ("test_accuracy",), "Test accuracy",
                                                              "test accuracy (fraction correct)", target))
           for x in (*TIME_AXES, "epsilon")},
        "accuracy_vs_bytes_up.png": lambda: _lines_figure(runs, "total_bytes_up", ("test_accuracy",), "Test accuracy",
                                                          "test accuracy (fraction correct)", target),
        **{f"loss_vs_{x}.png": (lambda x=x: _lines_figure(runs, x, ("train_loss", "test_loss"), "Loss", "loss"))
           for x in TIME_AXES},
        "epsilon_vs_round.png": lambda: _lines_figure(runs, "round", ("epsilon",), "Privacy spent", X_AXES["epsilon"]),
        "personalized_accuracy_vs_round.png": lambda: _personalized_figure(runs),
        "diagnostics_vs_round.png": lambda: _diagnostics_figure(runs),
        "staleness_histogram.png": lambda: _staleness_figure(runs),
        "participation_per_client.png": lambda: _participation_figure(runs),
        "byzantine_share_vs_round.png": lambda: _byzantine_figure(runs),
        "timeline.png": lambda: _timeline_figure(runs),
    }
    images = {}
    for name in PLOTS:  # every plot a run's directory may hold (clear_run_files removes them)
        fig = builders[name]()
        if fig is None:
            out.remove(name)  # an earlier report's plot would no longer match these runs
            continue
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=DPI)  # a bare Figure is not registered with pyplot
        images[name] = buffer.getvalue()
        out.write_bytes(name, images[name])
    out.write_text(REPORT_HTML, report_html(runs, images, target))
    out.record_written([*PLOTS, REPORT_HTML])  # in a run's directory: replaced with that run
    return [out.path(name) for name in [*images, REPORT_HTML]]


def load_runs(run_dirs: list[str]) -> list[SavedRun]:
    """The runs of ``run_dirs`` (paths or URIs), labelled by :func:`run_labels`; ScenarioError for a
    directory without ``rounds.parquet``."""
    if not run_dirs:
        raise ScenarioError("report", run_dirs, "at least one run directory")
    outs = [OutputDir.open(d, create=False) for d in run_dirs]
    for path, out in zip(run_dirs, outs):
        if out.fs.get_file_info(out.path("rounds.parquet")).type == pafs.FileType.NotFound:
            raise ScenarioError("report", path, "a run directory (one with rounds.parquet)")
    summaries = [_read_text(out, "summary.json", json.loads) for out in outs]
    summaries = [s if isinstance(s, dict) else None for s in summaries]  # unreadable: as if missing
    labels = run_labels([s and s.get("name") for s in summaries], run_dirs)
    runs = []
    for path, label, out, summary in zip(run_dirs, labels, outs, summaries):
        try:
            own = own_diagnostics(out)
            runs.append(SavedRun(label, read_columns(out, "rounds.parquet", _ROUND_COLUMNS + own),
                                 read_columns(out, "events.parquet", _EVENT_COLUMNS), summary,
                                 _read_text(out, "scenario.yaml", yaml.safe_load), own))
        except (OSError, pa.ArrowException) as exc:  # a damaged part
            raise ScenarioError("report", path,
                                f"a run directory whose logs are readable ({first_line(exc)})") from None
    return runs


def own_diagnostics(out: OutputDir) -> tuple[str, ...]:
    """The rounds.parquet columns of ``out`` that an algorithm's ``server_diagnostics`` added
    (their field metadata says so)."""
    try:
        return tuple(f.name for f in out.read_schema("rounds.parquet") if f.metadata == SERVER_DIAGNOSTIC)
    except FileNotFoundError:
        return ()


def run_labels(names: list[str | None], run_dirs: list[str]) -> list[str]:
    """Legend labels: each run's name, or its directory name where the name is missing or shared.

    Where directory names collide too, the path as given is used.
    """
    bases = [d.rstrip("/").rsplit("/", 1)[-1] for d in run_dirs]
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


def _read_text(out: OutputDir, name: str, parse):
    """``parse`` of text file ``name``, or None when it is missing or unreadable."""
    try:
        return parse(out.read_bytes(name).decode())
    except (FileNotFoundError, ValueError, yaml.YAMLError):
        return None


def read_columns(out: OutputDir, name: str, wanted: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The ``wanted`` columns present in table ``name`` of ``out`` (a Parquet file or log directory;
    none if it does not exist) as arrays; nulls become NaN (numbers) or None (strings)."""
    try:
        return table_arrays(out.read_table(name, wanted))
    except FileNotFoundError:
        return {}


def auto_scale(ax, axis: str, values: list[np.ndarray], span: float = SPAN) -> None:
    """Make ``axis`` ("x" or "y") of ``ax`` logarithmic when the nonzero magnitudes of ``values``
    span more than ``span`` (symlog when some value is <= 0)."""
    v = np.concatenate([np.ravel(np.asarray(x, dtype=float)) for x in values]) if values else np.array([])
    v = v[np.isfinite(v)]
    magnitudes = np.abs(v[v != 0])
    if magnitudes.size == 0 or magnitudes.max() <= span * magnitudes.min():
        return
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    if (v > 0).all():
        setter("log")
    else:
        setter("symlog", linthresh=float(magnitudes.min()))


def new_figure(title: str, xlabel: str, ylabel: str):
    """A bare matplotlib Figure and its axes in the reports' size and style (save at :data:`DPI`)."""
    fig = Figure(figsize=_FIGSIZE)
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _run_style(k: int, n: int) -> dict:
    """Colour, marker and width of run ``k`` of ``n`` overlaid runs: each has its own colour and
    marker (a marker hidden under another's shape still shows its corners), and earlier runs are
    drawn wider, so a run whose line coincides with a later run's still shows around it."""
    widen = 1.0 + (n - 1 - k) / (n - 1) if n > 1 else 1.0  # 2.0 for the first run down to 1.0 for the last
    return {"color": f"C{k % 10}", "marker": _MARKERS[k % len(_MARKERS)], "widen": widen}


def _plot(ax, x, y, color: str, marker: str = "o", widen: float = 1.0, linewidth: float = 1.5, **kwargs) -> None:
    """A line, with markers when it has few points."""
    ax.plot(x, y, color=color, marker=marker if len(x) <= MAX_MARKERS else None, markersize=4 * widen,
            linewidth=linewidth * widen, **kwargs)


def _reach_text(run: SavedRun, x: str, target: float) -> str:
    """Where ``run`` first reached ``target`` on axis ``x``, for a legend."""
    i = run.reach(target)
    if i is None or not np.isfinite(run.rounds[x][i]):
        return f"{target:g} not reached"
    value = run.rounds[x][i]
    where = {"round": f"step {value:,.0f}", "virtual_time": f"{seconds_text(value)} virtual s",
             "wall_time": f"{value:.1f} s", "epsilon": f"ε = {value:.3g}", "total_bytes_up": f"{value:.3g} bytes up"}
    return f"{target:g} at {where[x]}"


def _lines_figure(runs: list[SavedRun], x: str, columns: tuple[str, ...], title: str, ylabel: str,
                  target: float | None = None) -> Figure | None:
    """``columns`` (finite rows) against ``x``, every run overlaid: one colour per run, one line
    style per column; ``target`` as a horizontal line with each run's time to reach it."""
    lines = [(k, run, column, s) for k, run in enumerate(runs) for column in columns
             if (s := run.series(x, column)) is not None]
    if not lines:
        return None
    fig, ax = new_figure(f"{title} vs {x.replace('_', ' ')}", X_AXES[x], ylabel)
    for k, run, column, (xs, ys) in lines:
        _plot(ax, xs, ys, **_run_style(k, len(runs)), **(_STYLES[column] if len(columns) > 1 else {}))
    auto_scale(ax, "x", [s[0] for *_, s in lines])
    auto_scale(ax, "y", [s[1] for *_, s in lines])
    handles = [Line2D([], [], color=f"C{k % 10}", marker=_MARKERS[k % len(_MARKERS)], markersize=4,
                      label=run.label + (f" ({_reach_text(run, x, target)})" if target is not None else ""))
               for k, run in dict((k, run) for k, run, _, _ in lines).items()]  # one entry per run, in order
    if target is not None:
        handles.append(ax.axhline(target, color="black", linewidth=1, linestyle="-.", label=f"target {target:g}"))
    if len(columns) > 1:  # which line style is which column, in the same legend (two legends can overlap)
        handles += [Line2D([], [], color="black", label=c, **_STYLES[c]) for c in columns
                    if any(c == cc for _, _, cc, _ in lines)]
    ax.legend(handles=handles, fontsize="small", loc="best")
    return fig


def _personalized_figure(runs: list[SavedRun]) -> Figure | None:
    """Personalized accuracy (pooled, and the mean over clients with its 95% band) against server
    steps, the global model's test accuracy dotted beside it."""
    if not any(run.series("round", "personalized_accuracy") for run in runs):
        return None
    fig = _lines_figure(runs, "round", ("personalized_accuracy", "personalized_accuracy_mean", "test_accuracy"),
                        "Personalized accuracy", "accuracy (fraction correct)")
    ax = fig.axes[0]
    for k, run in enumerate(runs):
        mean, ci = run.series("round", "personalized_accuracy_mean"), run.series("round", "personalized_accuracy_ci95")
        if mean is not None and ci is not None and len(mean[0]) == len(ci[0]):
            ax.fill_between(mean[0], mean[1] - ci[1], mean[1] + ci[1], color=f"C{k % 10}", alpha=0.15)
    return fig


def _diagnostics_figure(runs: list[SavedRun]) -> Figure | None:
    """One panel per diagnostics column some run logged, against server steps, runs overlaid;
    errors and norms on a log scale."""
    columns = list(DIAGNOSTICS) + list(dict.fromkeys(c for run in runs for c in run.own_diagnostics))
    panels = [(c, [(k, run, s) for k, run in enumerate(runs) if (s := run.series("round", c)) is not None])
              for c in columns]
    panels = [(c, lines) for c, lines in panels if lines]
    if not panels:
        return None
    fig = Figure(figsize=(_FIGSIZE[0], 1.0 + 2.6 * len(panels)))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (column, lines) in zip(axes, panels):
        for k, run, (xs, ys) in lines:
            _plot(ax, xs, ys, **_run_style(k, len(runs)), label=run.label)
        ax.set(ylabel=column, title=f"{column}: {DIAGNOSTICS.get(column, 'reported by the algorithm')}")
        ax.grid(alpha=0.3)
        auto_scale(ax, "y", [s[1] for *_, s in lines], span=1.0 if column in LOG_COLUMNS else SPAN)
        ax.legend(fontsize="small")
    auto_scale(axes[-1], "x", [s[0] for _, lines in panels for *_, s in lines])
    axes[-1].set_xlabel(X_AXES["round"])
    fig.suptitle("Diagnostics")
    return fig


def _panel_histograms(title: str, xlabel: str, ylabel: str, panels: list[tuple[str, np.ndarray]]) -> Figure:
    """One histogram of non-negative integers per (title, values) panel, shared axes: one bin per
    integer up to a range of 100, else a bin for 0 and about 60 log-spaced ones (symlog x)."""
    low = min(int(v.min()) for _, v in panels)
    high = max(int(v.max()) for _, v in panels)
    wide = high - low > 100
    bins = (np.unique(np.concatenate([[0], np.floor(np.geomspace(1, high + 1, 60)), [high + 1]])) if wide
            else np.arange(low, high + 2)) - 0.5
    fig = Figure(figsize=(_FIGSIZE[0], 1.2 + 2.0 * len(panels)))
    axes = fig.subplots(len(panels), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    counts = []
    for k, (ax, (panel, values)) in enumerate(zip(axes, panels)):
        n, *_ = ax.hist(values, bins=bins, color=f"C{k % 10}", alpha=0.7, edgecolor="black", linewidth=0.4)
        counts.append(n)
        ax.set_title(panel, fontsize="medium")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # one value (sync: 0): one tick
    if wide:
        axes[-1].set_xscale("symlog", linthresh=1.0)
    auto_scale(axes[-1], "y", [c[c > 0] for c in counts])
    axes[-1].set_xlabel(xlabel)
    fig.suptitle(title)
    return fig


def _staleness_figure(runs: list[SavedRun]) -> Figure | None:
    """Staleness of applied updates, one panel per run."""
    panels = []
    for run in runs:
        if "staleness" in run.events:
            values = run.events["staleness"][applied(run.events)].astype(float)
            values = values[np.isfinite(values)].astype(int)
            if values.size:
                panels.append((f"{run.label}: {values.size:,} applied, median {np.median(values):g}, "
                               f"max {values.max()}", values))
    if not panels:
        return None
    return _panel_histograms("Staleness of applied updates", "staleness (model versions behind)",
                             "applied updates", panels)


def _participation_figure(runs: list[SavedRun]) -> Figure | None:
    """How many clients contributed k applied updates, one panel per run.

    The population is the run's registered clients (``summary.json``'s ``system.num_clients``), so
    clients never applied count as zero; a run without a summary (interrupted early) takes
    ``max(client_id) + 1`` over its events, and clients above that id are left out.
    """
    panels = []
    for run in runs:
        ids = run.events.get("client_id")
        if ids is None or ids.size == 0:
            continue
        ids = ids.astype(int)
        registered = ((run.summary or {}).get("system") or {}).get("num_clients") or int(ids.max()) + 1
        counts = np.bincount(ids[applied(run.events)], minlength=registered)
        panels.append((f"{run.label}: {counts.size:,} clients, {int((counts == 0).sum()):,} never applied, "
                       f"max {counts.max()}", counts))
    if not panels:
        return None
    return _panel_histograms("Participation per client", "applied updates per client (count)", "clients", panels)


def _byzantine_figure(runs: list[SavedRun]) -> Figure | None:
    """Share of each server step's applied updates that came from Byzantine clients, runs overlaid."""
    lines = []
    for k, run in enumerate(runs):
        byz = run.events.get("byzantine")
        if byz is None or "round" not in run.events or not np.nan_to_num(byz.astype(float)).any():
            continue
        mask = applied(run.events)
        steps, index = np.unique(run.events["round"][mask].astype(int), return_inverse=True)
        share = np.bincount(index, weights=np.nan_to_num(byz[mask].astype(float))) / np.bincount(index)
        lines.append((k, run.label, steps, share))
    if not lines:
        return None
    fig, ax = new_figure("Applied updates from Byzantine clients", X_AXES["round"],
                         "Byzantine share of applied updates")
    for k, label, steps, share in lines:
        _plot(ax, steps, share, **_run_style(k, len(runs)), label=label)
    auto_scale(ax, "x", [steps for _, _, steps, _ in lines])
    ax.legend(fontsize="small")
    return fig


def _timeline_figure(runs: list[SavedRun]) -> Figure | None:
    """One Gantt panel per run with virtual times, on a shared virtual-time range: the tasks that
    start before the earliest run's :data:`MAX_TIMELINE_TASKS`-th start, one lane per concurrently
    running task, coloured by status, outlined so back-to-back tasks stay apart."""
    tasks = []
    for run in runs:
        if "virtual_start" not in run.events or "virtual_end" not in run.events:
            continue
        start = run.events["virtual_start"].astype(float)
        end = run.events["virtual_end"].astype(float)
        status = run.events.get("status", np.full(start.size, None, dtype=object))
        keep = np.flatnonzero(np.isfinite(start) & np.isfinite(end))
        keep = keep[np.argsort(start[keep], kind="stable")]
        if keep.size:
            tasks.append((run.label, start[keep], end[keep], status[keep]))
    if not tasks:
        return None
    horizon = min(start[min(MAX_TIMELINE_TASKS, start.size) - 1] for _, start, _, _ in tasks)
    fig = Figure(figsize=(_FIGSIZE[0] + 1.5, 1.2 + 2.4 * len(tasks)))
    axes = fig.subplots(len(tasks), 1, sharex=True, squeeze=False)[:, 0]
    seen = set()
    for ax, (label, start, end, status) in zip(axes, tasks):
        shown = start <= horizon
        start, end, status = start[shown], end[shown], status[shown]
        names = ["unknown" if s is None else str(s) for s in status]
        seen.update(names)
        ax.barh(assign_lanes(start, end), end - start, left=start, height=0.8, edgecolor="black", linewidth=0.4,
                color=[STATUS_COLORS.get(s, "tab:blue") for s in names])
        ax.set_title(f"{label}: {start.size} tasks starting by virtual s {seconds_text(horizon)}", fontsize="medium")
        ax.set_ylabel("lane")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel("virtual time (virtual s)")
    axes[0].legend(handles=[Patch(facecolor=STATUS_COLORS.get(s, "tab:blue"), edgecolor="black", label=s)
                            for s in sorted(seen)], title="status", fontsize="small", loc="upper left",
                   bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("Client tasks on the virtual clock")
    return fig


def time_to_accuracy_table(run_dirs: list[str], target: float) -> str:
    """A Markdown table: per run, virtual and wall time to reach ``target`` test accuracy
    (first evaluation at or above it), final accuracy, and task counts by status."""
    lines = [f"| run | virtual time to {target:g} accuracy | wall s to it | final accuracy | final virtual time "
             "| applied | late | dropped | failed | stale |", "|---|---|---|---|---|---|---|---|---|---|"]
    for run in load_runs(run_dirs):
        hit = run.reach(target)
        reached = (seconds_text(run.rounds['virtual_time'][hit]), f"{run.rounds['wall_time'][hit]:.1f}") \
            if hit is not None else ("not reached", "—")
        acc = run.series("round", "test_accuracy")
        final = acc[1][-1] if acc is not None else None
        tasks = (run.summary or {}).get("tasks", {})
        counts = " | ".join(str(tasks.get(k, 0)) for k in ("applied", "late", "dropped", "failed", "stale"))
        lines.append(f"| {run.label} | {reached[0]} | {reached[1]} | {number_text(final, '.4f')} | "
                     f"{seconds_text(run.rounds['virtual_time'][-1])} | {counts} |")
    return "\n".join(lines)
