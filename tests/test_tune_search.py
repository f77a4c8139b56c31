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


def search_file(tmp_path: Path, section: dict, *overrides) -> str:
    """The small scenario as a file with a ``tune:`` section."""
    path = Path(scenario_file(tmp_path, *overrides))
    cfg = OmegaConf.load(path)
    cfg.tune = section
    path.write_text(OmegaConf.to_yaml(cfg))
    return str(path)


SECTION = {"search": {"algorithm.lr": "loguniform(0.01,0.5)", "algorithm.batch_size": [5, 10]},
           "metric": "test_loss", "mode": "min", "samples": 6, "asha": True, "grace_period": 3, "seed": 7,
           "out": "searches/small"}


def test_a_tune_section_gives_the_ranges_and_options_and_flags_replace_them(tmp_path):
    """A scenario file's tune: section is the search (the scenario is the file without it); a flag
    given replaces its option, and ``--search KEY=…`` that key's range (other keys stay)."""
    from raysim.sweep.search_plan import plan_search

    path = search_file(tmp_path, SECTION)
    search = plan_search(path)
    assert search.space == {"algorithm.lr": ("loguniform", [0.01, 0.5]), "algorithm.batch_size": ("choice", [5, 10])}
    assert (search.metric, search.mode, search.samples, search.algo, search.asha, search.grace_period, search.seed,
            search.out) == ("test_loss", "min", 6, "random", True, 3, 7, Path("searches/small"))
    assert "tune" not in search.scenario and search.cfg.algorithm.lr == 0.05  # the scenario, section left out
    flags = plan_search(path, ["execution.rounds=4"], ["algorithm.lr=0.1,0.2", "algorithm.local_epochs=1,2"],
                        metric="test_accuracy", mode="max", samples=2, asha=False, seed=1, out=str(tmp_path / "o"))
    assert flags.space == {"algorithm.lr": ("choice", [0.1, 0.2]), "algorithm.batch_size": ("choice", [5, 10]),
                           "algorithm.local_epochs": ("choice", [1, 2])}
    assert (flags.metric, flags.mode, flags.samples, flags.asha, flags.grace_period, flags.seed, flags.out) == \
        ("test_accuracy", "max", 2, False, 3, 1, tmp_path / "o")
    assert flags.cfg.execution.rounds == 4


@pytest.mark.parametrize("section, line", [
    ({**SECTION, "sample": 6}, "error: tune.sample = 6: expected a known key; allowed here: search, metric, mode, "
                               "samples, algo, asha, grace_period, seed, out"),
    ({**SECTION, "samples": "six"}, "error: tune.samples = 'six': expected a value of type int"),
    ({**SECTION, "asha": "yes"}, "error: tune.asha = 'yes': expected a value of type bool"),
    ({**SECTION, "algo": "bayes"}, "error: tune.algo = 'bayes': expected random or grid or optuna"),
    ({**SECTION, "search": {"algorithm.lr": "lognormal(1,2)"}},
     "error: tune.search.algorithm.lr = 'lognormal(1,2)': expected v1,v2,… or one of loguniform(…)"),
    ({**SECTION, "search": {"algorithm.lrx": [0.1]}}, "error: tune.search.algorithm.lrx = [0.1]: expected a key of "
                                                      "algorithm.name=fedavg (did you mean lr?)"),
    ({**SECTION, "search": ["algorithm.lr"]}, "error: tune.search = ['algorithm.lr']: expected a mapping of scenario "
                                              "keys to ranges"),
    ({**SECTION, "metric": "final_test_accuracy"}, "error: tune.metric = 'final_test_accuracy': expected a metric "
                                                   "logged per round with tune.asha (a summary figure"),
    ({**SECTION, "algo": "grid", "search": {"algorithm.lr": [0.1, 0.2]}},
     "error: tune.samples = 6: expected at most the grid's 2 points with tune.algo grid"),
])
def test_a_bad_tune_section_is_one_error_line_naming_its_key(tmp_path, capsys, section, line):
    code = main(["tune", search_file(tmp_path, section), "--out", str(tmp_path / "search")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(line) and err.count("\n") == 1, err
    assert not (tmp_path / "search").exists()


def test_validate_run_and_submit_of_a_search_file(tmp_path, capsys):
    """``raysim validate`` checks a search file as ``raysim tune`` would and says what it searches;
    ``raysim run`` of it points to ``raysim tune``; ``raysim submit`` makes it a job that runs
    ``raysim tune`` on the file (validated first: a bad section is refused before submitting)."""
    path = search_file(tmp_path, SECTION)
    assert main(["validate", path]) == 0
    assert capsys.readouterr().out == (f"ok: {path}: a search (random, ASHA) of 6 trials over algorithm.lr, "
                                       "algorithm.batch_size by test_loss (min) into searches/small\n")
    assert main(["run", path]) == 2
    assert capsys.readouterr().err.rstrip().endswith("; a tune: section is run by raysim tune FILE")
    assert main(["submit", path, "execution.rounds=3", "--dry-run"]) == 0
    assert capsys.readouterr().err.rstrip().endswith("the job would run: python -m raysim.cli tune "
                                                     "submitted/small.yaml execution.rounds=3")
    bad = search_file(tmp_path, {**SECTION, "samples": 0})
    assert main(["submit", bad, "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("error: tune.samples = 0: expected an integer >= 1")
