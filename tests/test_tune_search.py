"""`raysim tune`: a search over scenario keys as Ray Tune trials, ASHA fed by per-round metrics; a
stopped trial's directory is a normal run with status stopped; search.parquet, best.yaml, the same
trials for the same seed, and bad input refused in one line before any trial starts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import cli_in_own_session, small_overrides
from omegaconf import OmegaConf

import raysim
from raysim.cli import main
from raysim.scenario import load_scenario

SEARCH = ["--search", "algorithm.lr=loguniform(0.001,1.0)", "--metric", "test_accuracy"]


def scenario_file(tmp_path: Path, *overrides) -> str:
    """The small scenario (tests/conftest.py) as a file, ``overrides`` applied, output.dir left out."""
    cfg = OmegaConf.from_dotlist([o for o in small_overrides(tmp_path, *overrides) if not o.startswith("output.dir")])
    path = tmp_path / "small.yaml"
    path.write_text(OmegaConf.to_yaml(cfg))
    return str(path)


def tune_cli(*args, timeout=300) -> subprocess.CompletedProcess:
    """``raysim tune …`` in a process (and session) of its own: whatever of its Ray is left when it
    ends is killed, also when the test fails."""
    return cli_in_own_session("tune", *args, timeout=timeout)


def test_random_search_with_asha_stops_trials_and_writes_the_best_scenario(tmp_path):
    """The acceptance search: 8 random trials on algorithm.lr, ASHA (grace 2, factor 2) over 8
    rounds evaluated every round: some trials stop early, at a round the table and their summary
    give, with the rows up to it readable and a checkpoint; best.yaml is the best completed
    trial's scenario (output.dir aside) and runs to its model; the same command again samples the same trials and runs
    none of them again (completed and stopped directories count as finished)."""
    scenario = scenario_file(tmp_path, "execution.rounds=8")
    args = [scenario, *SEARCH, "--samples", "8", "--asha", "--grace-period", "2", "--seed", "3",
            "--out", str(tmp_path / "search")]
    first = tune_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    table = pq.read_table(tmp_path / "search" / "search.parquet").to_pylist()
    assert len(table) == 8 and {r["status"] for r in table} <= {"completed", "stopped"}
    stopped = [r for r in table if r["status"] == "stopped"]
    assert stopped and all(2 <= r["stopped_at_round"] < 8 for r in stopped)
    for row in stopped:
        run = Path(row["output_dir"])
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "stopped" and summary["stopped_at_round"] == row["stopped_at_round"]
        assert summary["rounds"] == row["stopped_at_round"] == pq.read_table(run / "rounds.parquet").num_rows
        assert (run / "checkpoint.pt").is_file()  # raysim resume can go on with it
        assert f"stopped   {run.name} at round {row['stopped_at_round']}" in first.stderr
    completed = [r for r in table if r["status"] == "completed"]
    best = max(completed, key=lambda r: r["test_accuracy_last"])
    loaded = load_scenario(str(tmp_path / "search" / "best.yaml"))
    trial = load_scenario(str(Path(best["output_dir"]) / "scenario.yaml"))
    assert loaded.output.dir == str(tmp_path / "search" / "best")
    loaded.output.dir = trial.output.dir
    assert loaded == trial and loaded.algorithm.lr == best["algorithm.lr"]
    rerun_best = raysim.run(str(tmp_path / "search" / "best.yaml"))  # as raysim run best.yaml runs it
    trial_summary = json.loads((Path(best["output_dir"]) / "summary.json").read_text())
    assert rerun_best.summary["model_sha256"] == trial_summary["model_sha256"]

    written = {r["trial"]: os.stat(Path(r["output_dir"]) / "summary.json").st_mtime_ns for r in table}
    again = tune_cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = pq.read_table(tmp_path / "search" / "search.parquet").to_pylist()
    assert [(r["trial"], r["algorithm.lr"]) for r in rerun] == [(r["trial"], r["algorithm.lr"]) for r in table]
    assert {r["trial"]: os.stat(Path(r["output_dir"]) / "summary.json").st_mtime_ns for r in rerun} == written


@pytest.mark.slow
def test_optuna_search_runs(tmp_path):
    """An optuna (TPE, seeded) search of 3 trials on the final accuracy runs them all to the end."""
    scenario = scenario_file(tmp_path, "execution.rounds=2")
    proc = tune_cli(scenario, "--search", "algorithm.lr=uniform(0.01,0.5)", "--metric", "final_test_accuracy",
                    "--samples", "3", "--algo", "optuna", "--seed", "1", "--out", str(tmp_path / "search"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pq.read_table(tmp_path / "search" / "search.parquet").to_pylist()
    assert len(table) == 3 and all(r["status"] == "completed" for r in table)
    assert len({r["algorithm.lr"] for r in table}) == 3 and (tmp_path / "search" / "best.yaml").is_file()


@pytest.mark.parametrize("options, overrides, line", [
    (["--search", "algorithm.lrx=uniform(0.1,0.2)"], [], "error: --search algorithm.lrx = 'uniform(0.1,0.2)'"),
    (["--search", "algorithm.lr=lognormal(0.1,0.2)"], [], "error: --search algorithm.lr = 'lognormal(0.1,0.2)': "
                                                          "expected v1,v2,… or one of loguniform(…)"),
    (["--search", "algorithm.lr=loguniform(0,1)"], [], "error: --search algorithm.lr = 'loguniform(0,1)': expected loguniform(a,b) with positive "
                                                           "numbers a < b"),
    (["--search", "algorithm.lr=uniform(0.1,0.2)", "--metric", "accuracy"], [], "error: --metric = 'accuracy'"),
    (["--search", "algorithm.lr=uniform(0.1,0.2)", "--asha"], ["eval.every=0"],
     "error: --metric = 'test_accuracy': expected a metric logged per round with --asha (eval.every is 0"),
    (["--search", "algorithm.lr=uniform(0.1,0.2)", "--metric", "final_test_accuracy", "--asha"], [],
     "error: --metric = 'final_test_accuracy': expected a metric logged per round with --asha (a summary figure"),
    (["--search", "algorithm.lr=0.1,0.2", "--algo", "grid", "--samples", "3"], [],
     "error: --samples = 3: expected at most the grid's 2 points with --algo grid"),
    (["--search", "algorithm.lr=uniform(0.1,0.2)", "--algo", "grid"], [],
     "error: --search algorithm.lr = 'uniform(0.1,0.2)': expected v1,v2,… (or choice(…)) with --algo grid"),
    (["--search", "algorithm.lr=0.1,0.2"], ["runtime.torch_threads=64"],
     "error: runtime.torch_threads = 64: expected at most the CPUs"),
])
def test_bad_input_is_one_error_line_before_any_trial(tmp_path, capsys, options, overrides, line):
    """Each bad input: exit 2, one ``error:`` line naming the flag or key, nothing written."""
    code = main(["tune", scenario_file(tmp_path), *overrides, *options, "--out", str(tmp_path / "search")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(line) and err.count("\n") == 1, err
    assert not (tmp_path / "search").exists()
