"""A sweep's results: what a point's run left in its directory, its row of sweep.parquet, the table.

A point's directory holds its run's files and ``sweep_point.json`` (:data:`MEASURED`), written
once the point has run: exit status, wall seconds and peak RSS as the sweep measured them, the
mode that ran it (for a Tune trial, also the id of the Ray node it ran on) and the code version. A
point is done when its summary says ``completed``, its ``scenario.yaml`` is the point's scenario
and that file says the sweep saw it exit with 0.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from omegaconf import OmegaConf

from raysim.errors import ScenarioError
from raysim.schema import dotted_items

MEASURED = "sweep_point.json"
METRICS = ("wall_seconds", "startup_seconds", "steady_updates_per_second", "median_round_seconds",
           "steady_seconds", "peak_rss_bytes", "final_test_accuracy", "virtual_time")
MIN_STEADY_SECONDS = 2.0  # a steady rate measured over less wall time than this is mostly noise
_TYPES = {"repeat": pa.int64(), "status": pa.string(), **{m: pa.float64() for m in METRICS},
          "peak_rss_bytes": pa.int64(), "mode": pa.string(), "node": pa.string(), "output_dir": pa.string(),
          "raysim_version": pa.string(), "git_commit": pa.string()}


def code_version() -> dict:
    """``raysim_version`` (``raysim.__version__``) and ``git_commit`` (HEAD of the git checkout
    the package lies in, with ``-dirty`` when its tracked files have changes; None when it lies in
    none or git is missing)."""
    import raysim

    try:
        head = subprocess.run(["git", "describe", "--always", "--abbrev=40", "--dirty", "--exclude=*"],
                              cwd=Path(raysim.__file__).parent, capture_output=True, text=True, timeout=10)
        commit = head.stdout.strip() if head.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"raysim_version": raysim.__version__, "git_commit": commit or None}


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def save_measured(point, measured: dict) -> None:
    """Write a point's :data:`MEASURED` file (whole, under a temporary name first)."""
    tmp = point.dir / f".{MEASURED}.tmp"
    tmp.write_text(json.dumps(measured, indent=2) + "\n")
    os.replace(tmp, point.dir / MEASURED)


def forget_measured(point) -> None:
    """Remove a point's :data:`MEASURED` file before it runs (again)."""
    (point.dir / MEASURED).unlink(missing_ok=True)


def started(say, point) -> None:
    """Before a point runs (again): forget what the sweep measured of it, make its directory, say so."""
    forget_measured(point)
    point.dir.mkdir(parents=True, exist_ok=True)
    say(f"start   {point.dir.name}")  # its directory's name: what the user finds on disk


def finished(say, point, measured: dict) -> None:
    """Once a point has run: save what the sweep ``measured`` (with the code version), say how it went."""
    save_measured(point, {**measured, **code_version()})
    row = point_row(point)
    ups = row["steady_updates_per_second"]
    say(f"{'done' if row['status'] == 'completed' else row['status']:7s} {point.dir.name}: {row['status']}, "
        f"{row['wall_seconds']:.1f} s wall, {'-' if ups is None else f'{ups:.1f}'} updates/s")


def is_done(point, finished=("completed",)) -> bool:
    """Whether the point's directory holds its run, ended with a status of ``finished`` (a search
    counts ``stopped`` too: :mod:`raysim.sweep.search`). ScenarioError when it holds a run of
    another scenario (output.dir aside, and runtime.num_cpus when the scenario leaves it to the sweep):
    one directory never mixes two runs."""
    stored = point.dir / "scenario.yaml"
    if not stored.is_file():
        return False
    from raysim.scenario import load_scenario, to_yaml

    def comparable(cfg) -> dict:
        return _comparable(OmegaConf.to_container(OmegaConf.create(to_yaml(cfg))), point.cfg.runtime.num_cpus)

    ours = comparable(point.cfg)
    try:
        written = OmegaConf.load(stored)
    except Exception:  # not YAML…
        theirs = {"scenario.yaml": "unreadable"}
    else:
        try:  # written as this raysim writes it (an older one may have kept keys that the run ignores)
            theirs = comparable(load_scenario(written))
        except Exception:  # not a mapping, or not a scenario of this raysim: compared as written
            theirs = _comparable(OmegaConf.to_container(written), point.cfg.runtime.num_cpus)
    if theirs != ours:
        key = next(k for k in sorted(set(theirs) | set(ours)) if theirs.get(k, "unset") != ours.get(k, "unset"))
        raise ScenarioError("sweep point", str(point.dir), f"a directory of this point's runs only; it holds a run "
                            f"of another scenario ({key}: {theirs.get(key, 'unset')!r} there, "
                            f"{ours.get(key, 'unset')!r} here): remove it or choose another --out")
    return _status(point) in finished


def _status(point) -> str:
    """The summary's status of the point's run if the sweep saw that run exit with 0, else 'failed'."""
    if (_json(point.dir / MEASURED) or {}).get("returncode") != 0:
        return "failed"
    return (_json(point.dir / "summary.json") or {}).get("status", "failed")


def _comparable(scenario, num_cpus) -> dict:
    """A scenario as {dotted key: value}, without output.dir and, when ``num_cpus`` is None (the
    sweep may choose it), runtime.num_cpus."""
    if not isinstance(scenario, dict):
        return {"scenario.yaml": "not a mapping"}
    flat = dict(dotted_items(scenario))
    flat.pop("output.dir", None)
    if num_cpus is None:
        flat.pop("runtime.num_cpus", None)
    return flat


def point_row(point) -> dict:
    """The point's row of sweep.parquet (the figures of a run that did not complete are null)."""
    from raysim.measure import steady

    measured = _json(point.dir / MEASURED) or {}
    summary = _json(point.dir / "summary.json") or {}
    status = _status(point)
    row = {**point.values, "repeat": point.repeat, "status": status, **{m: None for m in METRICS},
           "wall_seconds": measured.get("wall_seconds"), "peak_rss_bytes": measured.get("peak_rss_bytes"),
           "mode": measured.get("mode"), "node": measured.get("node"), "output_dir": str(point.dir),
           "raysim_version": measured.get("raysim_version"), "git_commit": measured.get("git_commit")}
    if status != "completed":
        return row
    path = point.dir / "rounds.parquet"
    logged = [c for c in ("wall_time", "eval_seconds") if c in pq.ParquetDataset(path).schema.names]
    rounds = pq.read_table(path, columns=logged).to_pydict()
    wall = rounds["wall_time"]
    evaluating = rounds.get("eval_seconds", [0.0] * len(wall))  # a run written before raysim logged it
    ups = summary["steady_updates_per_second"]
    steps = [b - a - e for a, b, e in zip([0.0] + wall[:-1], wall, evaluating)]  # evaluation left out
    if point.cfg.execution.mode == "sync":  # a round's wall since the previous row
        per_round = steady(steps, point.cfg.execution.clients_per_round)[1]
    else:
        per_round = 1.0 / ups if ups else None
    row.update(startup_seconds=summary["wall_seconds"] - (wall[-1] - wall[0]), steady_updates_per_second=ups,
               median_round_seconds=per_round, steady_seconds=sum(steps[1:]),
               final_test_accuracy=summary["final_test_accuracy"], virtual_time=summary["virtual_time"])
    return row


def too_short(rows: list[dict]) -> list[dict]:
    """The completed rows whose steady rate was measured over less than :data:`MIN_STEADY_SECONDS`
    of rounds after the first: their updates per second (and a parallel efficiency from them) are noise."""
    return [row for row in rows if row["status"] == "completed" and row["steady_seconds"] is not None
            and row["steady_seconds"] < MIN_STEADY_SECONDS]


def value_text(value) -> str:
    """A value as ``key=value`` override text (YAML flow style, read back to the same value)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
    return text.removesuffix("...").strip()


def write_table(rows: list[dict], grid_keys, path: Path) -> None:
    """sweep.parquet: one row per point and repeat; a grid column whose values have no common
    Arrow type (e.g. 2 and 'auto') holds them as YAML text."""
    columns = {}
    for name in [*grid_keys, *_TYPES]:
        values = [row[name] for row in rows]
        try:
            columns[name] = pa.array(values, type=_TYPES.get(name))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            columns[name] = pa.array([None if v is None else value_text(v) for v in values], pa.string())
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.table(columns), tmp)
    os.replace(tmp, path)
