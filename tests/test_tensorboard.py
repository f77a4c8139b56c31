"""output.tensorboard: event files written at the Parquet flushes hold rounds.parquet's values (also after a
resume), histograms of staleness and participation; a clear error line without the tensorboard package."""

from __future__ import annotations

import importlib.util

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import small_scenario
from test_bad_input import run_main

import raysim
from raysim.errors import ScenarioError

ASYNC = ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=4", "execution.concurrency=6",
         "execution.max_updates=48", "eval.every=3", "system.compute.kind=lognormal", "output.tensorboard=true"]


def _events(run_dir: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(f"{run_dir}/tensorboard", size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def _assert_scalars_equal_rounds(run_dir: str) -> None:
    acc = _events(run_dir)
    rounds = pq.read_table(f"{run_dir}/rounds.parquet").to_pydict()
    numeric = [c for c, v in rounds.items() if c not in ("round", "parameters")
               and any(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)]
    assert "rounds/test_accuracy" in acc.Tags()["scalars"]
    assert sorted(acc.Tags()["scalars"]) == sorted(f"rounds/{c}" for c in numeric)
    for column in numeric:
        expected = [(r, v) for r, v in zip(rounds["round"], rounds[column]) if v is not None and np.isfinite(v)]
        got = [(e.step, e.value) for e in acc.Scalars(f"rounds/{column}")]
        assert [s for s, _ in got] == [s for s, _ in expected], column
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6), column


needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="tensorboard is not installed (pip install tensorboard)")


@needs_tensorboard
def test_scalars_equal_rounds_and_histograms_cover_the_run(tmp_path):
    result = raysim.run(small_scenario(tmp_path, *ASYNC))
    run_dir = result.output_dir
    _assert_scalars_equal_rounds(run_dir)
    acc = _events(run_dir)
    assert set(acc.Tags()["histograms"]) == {"staleness", "participation_per_client"}
    last = acc.Histograms("participation_per_client")[-1]
    events = pq.read_table(f"{run_dir}/events.parquet").to_pydict()
    applied = sum(s == "applied" for s in events["status"])
    assert last.histogram_value.sum == applied == result.summary["client_updates"]
    assert last.histogram_value.num == max(events["client_id"]) + 1  # one value per client seen
    assert sum(h.histogram_value.num for h in acc.Histograms("staleness")) == applied


@needs_tensorboard
def test_a_resumed_run_shows_every_step_once(tmp_path):
    from test_resume import StopAfter

    cfg = small_scenario(tmp_path, *ASYNC, "output.checkpoint_every=3")
    with pytest.raises(KeyboardInterrupt):
        raysim.run(cfg, progress=StopAfter(2))
    raysim.resume(cfg.output.dir)
    _assert_scalars_equal_rounds(cfg.output.dir)


def test_without_the_package_the_key_is_one_error_line(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ScenarioError):
        small_scenario(tmp_path, "output.tensorboard=true")
    assert run_main(capsys, "validate", "scenarios/quickstart.yaml", "output.tensorboard=true") == (
        "error: output.tensorboard = True: expected false, or the tensorboard package installed "
        "(pip install tensorboard)")
    small_scenario(tmp_path)  # off by default


def test_a_remote_output_dir_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match="output.tensorboard = True: expected false with output.dir a URI"):
        small_scenario(tmp_path, "output.dir=s3://bucket/run", "output.tensorboard=true")


@needs_tensorboard
def test_rows_written_again_after_a_stop_replace_the_old_steps(tmp_path):
    """As after a driver killed between a flush and the next checkpoint: a writer going on after the first
    rows (purge_step) writes the later ones again, and each step shows once."""
    from raysim.output.directory import OutputDir
    from raysim.output.tensorboard import COLUMNS, TensorBoardLog, read_rows

    run_dir = raysim.run(small_scenario(tmp_path, *ASYNC)).output_dir
    out = OutputDir.open(run_dir, create=False)
    total = {name: pq.read_table(f"{run_dir}/{name}").num_rows for name in COLUMNS}
    kept = {"rounds.parquet": 3, "events.parquet": 0}
    writer = TensorBoardLog(out, kept)
    writer.write({name: read_rows(out, name, kept[name], total[name], columns) for name, columns in COLUMNS.items()})
    writer.writer.close()
    _assert_scalars_equal_rounds(run_dir)
