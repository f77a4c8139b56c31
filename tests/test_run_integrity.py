"""Run directories that cannot lie or be destroyed (issue 41): a resume verifies the scenario, the
checkpoint and the logs it reads; a new run never replaces an earlier one unasked, never removes a
file it did not write, and its name and output.dir cannot point anywhere else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import small_overrides, small_scenario
from test_resume import StopAfter

import raysim
from raysim.errors import ScenarioError

REPO = Path(__file__).resolve().parents[1]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raysim.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.fixture
def stopped(tmp_path):
    """A run interrupted after its third step, with a checkpoint every step."""
    cfg = small_scenario(tmp_path, "output.checkpoint_every=1", "execution.rounds=6")
    with pytest.raises(KeyboardInterrupt):
        raysim.run(cfg, progress=StopAfter(3))
    return Path(cfg.output.dir)


def refused(run_dir: Path) -> str:
    with pytest.raises(ScenarioError) as info:
        raysim.resume(str(run_dir))
    message = str(info.value)
    assert message.startswith(f"run_dir = '{run_dir}': expected ") and "\n" not in message, message
    return message


@pytest.mark.parametrize("key, value", [("algorithm.lr", 0.5), ("seed", 7), ("execution.rounds", 9)])
def test_a_resume_refuses_a_scenario_edited_since_its_checkpoint(stopped, key, value):
    """It exited 0 with status completed and another model."""
    path = stopped / "scenario.yaml"
    scenario = yaml.safe_load(path.read_text())
    section, _, name = key.rpartition(".")
    (scenario[section] if section else scenario)[name] = value
    path.write_text(yaml.safe_dump(scenario))
    message = refused(stopped)
    assert "a run whose scenario.yaml is the one its checkpoint.pt was taken with (" in message
    assert f"{key} " in message and f", {json.dumps(value)} now" in message


def test_a_resume_refuses_a_flipped_byte_of_the_checkpoint(stopped):
    checkpoint = stopped / "checkpoint.pt"
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0x01
    checkpoint.write_bytes(bytes(data))
    assert "a readable checkpoint.pt: " in refused(stopped)


def test_a_resume_refuses_logs_that_lack_rows_the_checkpoint_counted(stopped):
    parts = sorted((stopped / "rounds.parquet").iterdir())
    assert len(parts) >= 2
    os.remove(parts[0])  # 118 of 150 rows on disk, while summary.json said 150
    message = refused(stopped)
    assert "a run whose logs hold what its checkpoint.pt counted: " in message and "(a part file is missing)" in message


def test_a_resume_refuses_a_truncated_events_part(stopped):
    part = sorted((stopped / "events.parquet").iterdir())[-1]
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    assert "is not a readable Parquet file" in refused(stopped)  # it ended in a traceback and no summary


def test_a_resume_removes_what_a_kill_mid_write_left(stopped):
    leftover = stopped / ".checkpoint.pt.0123456789ab.tmp"
    leftover.write_bytes(b"half a checkpoint")
    assert raysim.resume(str(stopped)).summary["status"] == "completed"
    assert not leftover.exists()


def test_resume_and_report_of_what_is_not_a_run_are_one_line(stopped, tmp_path):
    assert one_line(cli("resume", "/etc/passwd")) == ("error: run_dir = '/etc/passwd': expected the output "
                                                      "directory of a run (it is a file)")
    (stopped / "summary.json").write_text("{not json")
    assert one_line(cli("resume", str(stopped))).startswith(
        f"error: run_dir = '{stopped}': expected a run whose summary.json is readable (")
    part = sorted((stopped / "rounds.parquet").iterdir())[0]
    part.write_bytes(b"PAR1 not really")
    assert one_line(cli("report", str(stopped))).startswith("error: ")


def test_a_finished_run_is_not_replaced_unasked_and_a_users_file_survives_replacing(tmp_path):
    overrides = small_overrides(tmp_path, "execution.rounds=2")
    first = raysim.run(None, overrides)
    run_dir = Path(first.output_dir)
    (run_dir / "notes.txt").write_text("mine")
    done = cli("run", "scenarios/quickstart.yaml", *overrides)
    assert one_line(done) == (f"error: output.dir = '{run_dir}': expected a directory without an earlier run (it "
                              "holds one, status completed): run with --replace to replace that run's files, or choose "
                              "another name= or output.dir=")
    assert json.loads((run_dir / "summary.json").read_text())["model_sha256"] == first.summary["model_sha256"]
    again = cli("run", "scenarios/quickstart.yaml", *overrides, "--replace", "--quiet")
    assert again.returncode == 0, again.stderr
    assert (run_dir / "notes.txt").read_text() == "mine"


def test_results_raysim_did_not_record_are_never_removed(tmp_path):
    """name=.. made the working directory the output directory, and the run's clean-up deleted the
    user's own report.html, summary.json and rounds.parquet/."""
    (tmp_path / "out").mkdir()
    for name in ("report.html", "summary.json"):
        (tmp_path / "out" / name).write_text("the user's")
    done = cli("run", "scenarios/quickstart.yaml", *small_overrides(tmp_path), "--replace")
    assert one_line(done).startswith(f"error: output.dir = '{tmp_path / 'out'}': expected a directory without "
                                     "results raysim did not record writing (it holds report.html, summary.json")
    assert (tmp_path / "out" / "report.html").read_text() == "the user's"


@pytest.mark.parametrize("override, key", [("name=..", "name"), ("name=.", "name"), ("name=a/b", "name"),
                                           ("output.dir=mock:///x", "output.dir")])
def test_names_and_output_dirs_that_point_elsewhere_are_refused_before_ray_starts(override, key):
    line = one_line(cli("validate", "scenarios/quickstart.yaml", override))
    assert line.startswith(f"error: {key} = '{override.split('=', 1)[1]}': expected ")


def test_a_resumed_runs_summary_splits_its_wall_time(stopped):
    """A resumed run's wall time counted the interrupted part too, without saying so."""
    before = json.loads((stopped / "summary.json").read_text())
    summary = raysim.resume(str(stopped)).summary
    assert summary["resumed_at_step"] == 3 and 0 < summary["wall_seconds_before_resume"] <= before["wall_seconds"]
    import pyarrow.parquet as pq

    wall = pq.read_table(stopped / "rounds.parquet").column("wall_time").to_pylist()
    assert wall[3] > summary["wall_seconds_before_resume"] >= wall[2]  # the column goes on from the checkpoint
    fresh = raysim.run(None, small_overrides(stopped.parent / "fresh")).summary
    assert fresh["resumed_at_step"] is None and fresh["wall_seconds_before_resume"] is None
