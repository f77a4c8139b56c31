"""Report plots from synthetic run directories: which PNGs are written, labels, timeline lanes, errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raysim.errors import ScenarioError
from raysim.metrics.report import PLOTS, _read_columns, assign_lanes, run_labels, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALWAYS = ["accuracy_vs_virtual_time.png", "accuracy_vs_wall_time.png", "participation_per_client.png"]


def make_run(path, name: str, virtual: bool, seed: int = 0, tasks: int = 400) -> str:
    """A run directory like the simulator's; ``virtual`` adds the virtual-time scheduler's columns."""
    rng = np.random.default_rng(seed)
    os.makedirs(path)
    rounds = 10
    accuracy = [None if r % 3 else 0.5 + (0.04 - 0.01 * seed) * r for r in range(rounds)]  # evaluated every 3rd round
    pq.write_table(pa.table({
        "round": np.arange(rounds), "virtual_time": np.arange(rounds) * 2.5,
        "wall_time": np.cumsum(rng.uniform(0.1, 0.3, rounds)),
        "train_loss": rng.uniform(0.1, 1.0, rounds),
        "test_loss": pa.array([None if a is None else 1 - a for a in accuracy], pa.float64()),
        "test_accuracy": pa.array(accuracy, pa.float64()),
    }), os.path.join(path, "rounds.parquet"))
    events = {
        "round": rng.integers(0, rounds, tasks), "client_id": rng.integers(0, 50, tasks),
        "actor": rng.integers(0, 4, tasks), "samples": rng.integers(10, 100, tasks),
        "train_loss": rng.uniform(0.1, 1.0, tasks), "compute_seconds": rng.uniform(0.01, 0.1, tasks),
    }
    if virtual:
        start = rng.uniform(0, 25, tasks)
        status = rng.choice(["applied", "applied", "late", "dropped", "failed", "stale"], tasks).tolist()
        status[0] = None
        events.update(virtual_start=start, virtual_end=start + rng.uniform(0.5, 3.0, tasks),
                      model_version=rng.integers(0, rounds, tasks), staleness=rng.integers(0, 5, tasks),
                      status=pa.array(status, pa.string()).dictionary_encode())
    pq.write_table(pa.table(events), os.path.join(path, "events.parquet"))
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"name": name, "rounds": rounds}, f)
    return str(path)


def assert_png(path: str) -> None:
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    assert os.path.getsize(path) > 5_000


def test_report_of_several_runs_writes_every_plot(tmp_path):
    runs = [make_run(tmp_path / "alpha_1", "alpha", virtual=True),
            make_run(tmp_path / "beta", "beta", virtual=False, seed=1),
            make_run(tmp_path / "alpha_2", "alpha", virtual=False, seed=2)]
    written = write_report(runs)
    assert written == [str(tmp_path / "report" / name) for name in PLOTS]
    for path in written:
        assert_png(path)


def test_plots_without_columns_in_any_run_are_skipped(tmp_path):
    run = make_run(tmp_path / "beta", "beta", virtual=False)
    written = write_report([run])
    assert [os.path.basename(p) for p in written] == ALWAYS
    assert all(os.path.dirname(p) == run for p in written)  # one run: written into the run directory
    assert not (tmp_path / "beta" / "timeline.png").exists()
    assert not (tmp_path / "beta" / "staleness_histogram.png").exists()


def test_explicit_out_dir_is_created(tmp_path):
    run = make_run(tmp_path / "alpha", "alpha", virtual=True)
    written = write_report([run], out_dir=str(tmp_path / "plots" / "x"))
    assert sorted(os.listdir(tmp_path / "plots" / "x")) == sorted(PLOTS)
    assert len(written) == len(PLOTS)


def test_labels_are_names_deduplicated_by_directory():
    assert run_labels(["alpha", "beta", "alpha"], ["r/alpha_1", "r/beta/", "r/alpha_2"]) == \
        ["alpha_1", "beta", "alpha_2"]
    assert run_labels([None, "x"], ["r/interrupted", "r/y"]) == ["interrupted", "x"]
    assert run_labels(["a", "a"], ["r1/run", "r2/run"]) == ["r1/run", "r2/run"]


def test_lanes_never_overlap_and_are_lowest_free():
    assert assign_lanes([0, 1, 2, 3], [2, 3, 4, 5]).tolist() == [0, 1, 0, 1]  # touching ends share a lane
    assert assign_lanes([5, 0, 1], [6, 10, 2]).tolist() == [1, 0, 1]  # input order kept
    rng = np.random.default_rng(0)
    starts = rng.uniform(0, 100, 500)
    ends = starts + rng.exponential(5, 500)
    lanes = assign_lanes(starts, ends)
    for lane in np.unique(lanes):
        order = np.argsort(starts[lanes == lane])
        s, e = starts[lanes == lane][order], ends[lanes == lane][order]
        assert np.all(s[1:] >= e[:-1])
    order = np.argsort(starts, kind="stable")
    for k, i in enumerate(order):  # the lowest lane not held by an earlier task still running
        earlier = order[:k]
        busy = set(lanes[earlier][ends[earlier] > starts[i]].tolist())
        assert lanes[i] == min(set(range(len(busy) + 1)) - busy)


def test_dictionary_status_nulls_stay_null(tmp_path):
    run = make_run(tmp_path / "alpha", "alpha", virtual=True)
    status = _read_columns(os.path.join(run, "events.parquet"), ("status",))["status"]
    assert status[0] is None and sum(s is None for s in status) == 1


@pytest.mark.parametrize("setup", ["missing", "empty"])
def test_bad_run_directory_is_a_scenario_error(tmp_path, setup):
    good = make_run(tmp_path / "good", "good", virtual=False)
    bad = tmp_path / "bad"
    if setup == "empty":
        bad.mkdir()
    with pytest.raises(ScenarioError) as err:
        write_report([good, str(bad)])
    assert str(err.value).startswith(f"report = {str(bad)!r}: expected a run directory")
    assert not (tmp_path / "report").exists()  # nothing written before the check
