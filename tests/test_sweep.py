"""`raysim sweep`: a grid of full runs, resumable, validated before anything runs, the same results
in every mode; the YAML sweep: section; `raysim submit` of a sweep file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

import raysim
from raysim.cli import main
from raysim.scenario import load_scenario
from raysim.sweep.plan import parse_grid_options, split_values
from raysim.sweep.results import code_version

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "scenarios" / "quickstart.yaml")
# a run of a few tenths of a second once torch is loaded
TINY = ["runtime.backend=local", "data.num_clients=40", "execution.clients_per_round=12", "model.hidden=[16]",
        "eval.personalized_steps=0"]
GRID = ["--grid", "execution.rounds=1,2", "--grid", "algorithm.lr=0.05,0.1"]
POINTS = {f"execution.rounds={r},algorithm.lr={lr},repeat=0" for r in (1, 2) for lr in (0.05, 0.1)}


def sweep(*args) -> int:
    return main(["sweep", QUICKSTART, *TINY, *args])


def summary(point_dir: Path) -> dict:
    return json.loads((point_dir / "summary.json").read_text())


def table(out: Path) -> list[dict]:
    return pq.read_table(out / "sweep.parquet").to_pylist()


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory):
    """A 2×2 grid, each point in its own `raysim run` process."""
    out = tmp_path_factory.mktemp("sweep") / "grid"
    assert sweep(*GRID, "--out", str(out), "--plot", "final_test_accuracy:algorithm.lr") == 0
    return out


def test_a_grid_runs_every_point_and_writes_the_table_and_plots(grid_sweep):
    assert {p.name for p in grid_sweep.iterdir() if p.is_dir()} == POINTS
    rows = table(grid_sweep)
    assert [(r["execution.rounds"], r["algorithm.lr"], r["repeat"]) for r in rows] == \
        [(1, 0.05, 0), (1, 0.1, 0), (2, 0.05, 0), (2, 0.1, 0)]
    for row in rows:
        assert row["status"] == "completed" and row["mode"] == "isolated"
        assert row["wall_seconds"] > row["startup_seconds"] > 0 and row["peak_rss_bytes"] > 50 * 2 ** 20
        assert row["median_round_seconds"] > 0 and 0 <= row["final_test_accuracy"] <= 1
        assert row["raysim_version"] and Path(row["output_dir"]).name in POINTS
        point = summary(Path(row["output_dir"]))
        assert row["virtual_time"] == point["virtual_time"]
        assert row["steady_updates_per_second"] == point["steady_updates_per_second"]  # null with one round
    assert (grid_sweep / "final_test_accuracy_vs_algorithm.lr.png").stat().st_size > 0


def test_a_second_call_skips_the_completed_points(grid_sweep, capsys):
    summaries = sorted(grid_sweep.glob("*/summary.json"))
    before = [p.stat().st_mtime_ns for p in summaries]
    assert sweep(*GRID, "--out", str(grid_sweep)) == 0
    err = capsys.readouterr().err
    assert err.count("skipped ") == 4 and "start " not in err, err
    assert "warning: 4 of 4 points measured their steady rate over less than 2 s of rounds" in err  # 1-2 rounds
    assert [p.stat().st_mtime_ns for p in summaries] == before
    assert len(table(grid_sweep)) == 4


def test_a_point_written_with_every_key_is_still_its_completed_run(tmp_path, capsys):
    """Older versions wrote scenario.yaml with keys the run ignores (another kind's parameters);
    such a point is still recognised as done."""
    args = ("--grid", "execution.rounds=1", "--in-process", "--out", str(tmp_path))
    assert sweep(*args) == 0
    [stored] = tmp_path.glob("*/scenario.yaml")
    every_key = load_scenario(OmegaConf.load(stored))
    assert "mu" not in OmegaConf.load(stored).system.compute and "mu" in every_key.system.compute
    stored.write_text(OmegaConf.to_yaml(every_key))
    capsys.readouterr()
    assert sweep(*args) == 0
    assert capsys.readouterr().err.count("skipped ") == 1


def test_a_completed_run_the_sweep_saw_fail_runs_again(tmp_path, capsys):
    """A run that completed in a point's directory after the sweep's own attempt failed (e.g. that
    of a point left running by a killed sweep, which refused the next attempt) is not the sweep's:
    the point runs again, and its row agrees with the skip."""
    args = ("--grid", "execution.rounds=1", "--in-process", "--out", str(tmp_path))
    assert sweep(*args) == 0
    [measured] = tmp_path.glob("*/sweep_point.json")
    measured.write_text(json.dumps(dict(json.loads(measured.read_text()), returncode=2)))
    capsys.readouterr()
    assert sweep(*args) == 0
    err = capsys.readouterr().err
    assert "skipped " not in err and err.count("start ") == 1, err
    assert [r["status"] for r in table(tmp_path)] == ["completed"]


def test_a_directory_holding_another_scenario_is_an_error(grid_sweep, capsys):
    files = sorted(p for p in grid_sweep.rglob("*") if p.is_file())
    before = [p.stat().st_mtime_ns for p in files]
    assert sweep(*GRID, "--out", str(grid_sweep), "seed=3") == 2
    line = one_error_line(capsys.readouterr().err)
    assert "another scenario (seed: 0 there, 3 here)" in line and "execution.rounds=1,algorithm.lr=0.05" in line
    assert [p.stat().st_mtime_ns for p in files] == before


def test_in_process_gives_the_same_model(grid_sweep, tmp_path):
    assert sweep("--grid", "execution.rounds=2", "algorithm.lr=0.1", "--in-process", "--out", str(tmp_path)) == 0
    [row] = table(tmp_path)
    assert row["mode"] == "in-process" and row["status"] == "completed"
    isolated = grid_sweep / "execution.rounds=2,algorithm.lr=0.1,repeat=0"
    assert summary(Path(row["output_dir"]))["model_sha256"] == summary(isolated)["model_sha256"]


def test_ray_points_in_process_share_warm_actors_and_give_each_lone_runs_model(tmp_path):
    """--in-process starts Ray in the process that runs the sweep, and its points take over the same
    two ClientActors (the same processes), each loading its own run: every point's model is the one
    a lone run of it makes (the local backend's: results do not depend on the backend), whatever
    algorithm ran in those actors before."""
    out = tmp_path / "ray"
    ray_keys = ["runtime.backend=ray", "runtime.num_cpus=2", "runtime.num_actors=2", "algorithm.lr=0.1",
                "execution.rounds=2"]
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "sweep", QUICKSTART, *TINY, *ray_keys, "--grid",
                           "algorithm.name=scaffold,fedavg,fedprox", "--in-process", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = table(out)
    assert [r["algorithm.name"] for r in rows] == ["scaffold", "fedavg", "fedprox"]
    pids = []
    for row in rows:
        point = summary(Path(row["output_dir"]))
        assert point["backend"] == "ray" and row["mode"] == "in-process"
        lone = raysim.run(QUICKSTART, [*TINY, *ray_keys[3:], "runtime.backend=local", f"output.dir={tmp_path / 'lone'}",
                                       f"algorithm.name={row['algorithm.name']}"], replace=True)
        assert point["model_sha256"] == lone.summary["model_sha256"], row["algorithm.name"]
        pids.append(sorted(actor["pid"] for actor in point["actors"]))
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]


@pytest.mark.parametrize("args, expected", [
    (["--grid", "data.foo=1,2"], "error: grid key data.foo = 1: expected a known key"),
    (["--grid", "foo.bar=1,2"], "error: grid key foo.bar = 1: expected a known key; allowed here: name, seed, data"),
    (["--grid", "execution.rounds=1,abc"], "error: grid key execution.rounds = 'abc': expected a value of type int"),
    (["--grid", "execution.rounds="], "error: grid key execution.rounds = '': expected one or more values"),
    ([], "error: --grid = []: expected at least one grid key"),
    (["--grid", "execution.rounds=1", "--grid", "execution.rounds=2"], "error: --grid = 'execution.rounds=2': "
                                                                       "expected each grid key once"),
    (["--grid", "execution.rounds=1", "--repeat", "0"], "error: --repeat = 0: expected an integer >= 1"),
    (["--grid", "execution.rounds=1", "--parallel", "0"], "error: --parallel = 0: expected an integer >= 1"),
    (["--grid", "seed=1,2", "--repeat", "2"], "error: --repeat = 2: expected 1 when seed is a grid key"),
    (["--grid", "seed=1,2", "output.dir=x"], "error: output.dir = 'x': expected no override in a sweep"),
    (["--grid", "algorithm.lr=0.1,0.10"], "error: grid key algorithm.lr = [0.1, 0.1]: expected distinct values "
                                          "(0.1 is given twice)"),
    (["--grid", "algorithm.lr=1,1.0"], "error: grid key algorithm.lr = [1, 1.0]: expected distinct values "
                                       "(1 and 1.0 are both read as 1.0)"),
], ids=["unknown-key", "unknown-section", "wrong-type", "empty-values", "no-grid", "duplicate-key", "repeat-0",
        "parallel-0", "seed-repeat", "output-dir-override", "duplicate-value", "values-read-alike"])
def test_bad_input_is_one_line_before_anything_is_created(tmp_path, capsys, args, expected):
    out = tmp_path / "out"
    assert sweep(*args, "--out", str(out)) == 2
    assert one_error_line(capsys.readouterr().err).startswith(expected)
    assert not out.exists()


def test_the_code_version_is_the_commit_and_says_when_files_changed():
    import raysim

    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=Path(raysim.__file__).parent, capture_output=True, text=True,
                              check=True).stdout.strip()

    changed = git("status", "--porcelain", "--untracked-files=no")
    assert code_version()["git_commit"] == git("rev-parse", "HEAD") + ("-dirty" if changed else "")


def test_grid_values_split_at_top_level_commas():
    assert split_values("[64,64],[8],'a,b',{x: 1, y: 2}") == ["[64,64]", "[8]", "'a,b'", "{x: 1, y: 2}"]
    assert parse_grid_options(["model.hidden=[64,64],[8]", "algorithm.lr=0.1,1e-3", "runtime.address=null"]) == \
        {"model.hidden": [[64, 64], [8]], "algorithm.lr": [0.1, 0.001], "runtime.address": [None]}


def test_repeats_vary_the_seed(tmp_path):
    assert sweep("--grid", "execution.rounds=1", "seed=5", "--repeat", "2", "--in-process", "--out",
                 str(tmp_path)) == 0
    rows = table(tmp_path)
    assert [r["repeat"] for r in rows] == [0, 1]
    seeds = [summary(Path(r["output_dir"]))["seed"] for r in rows]
    assert seeds == [5, 6]
    assert [f"seed: {s}" in (Path(r["output_dir"]) / "scenario.yaml").read_text() for r, s in zip(rows, seeds)] == \
        [True, True]


def test_a_failed_point_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    assert sweep("--grid", "algorithm.lr=0.05,1e30", "execution.rounds=1", "--in-process", "--out",
                 str(tmp_path)) == 1
    assert [r["status"] for r in table(tmp_path)] == ["completed", "failed"]
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: 1 of 2 sweep points did not complete")


SWEEP_FILE = """\
name: tiny
data: {kind: gaussian_mixture, num_clients: 40}
model: {kind: mlp, hidden: [16]}
algorithm: {name: fedavg, lr: 0.05}
execution: {mode: sync, rounds: 1, clients_per_round: 12}
runtime: {backend: local}
sweep:
  grid: {algorithm.lr: [0.05, 0.1], model.hidden: [[16], [8]]}
  repeat: 2
  out: OUT
  plots: ["wall_seconds:algorithm.lr"]
"""


def test_a_sweep_section_and_the_flags_that_override_it(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(SWEEP_FILE.replace("OUT", str(tmp_path / "from_file")))
    assert main(["sweep", str(path), "--in-process", "--quiet"]) == 0
    rows = table(tmp_path / "from_file")
    assert [(r["algorithm.lr"], r["model.hidden"], r["repeat"]) for r in rows] == \
        [(lr, h, r) for lr in (0.05, 0.1) for h in ([16], [8]) for r in (0, 1)]
    assert (tmp_path / "from_file" / "wall_seconds_vs_algorithm.lr.png").exists()
    # a --grid key replaces that key's values; --repeat and --out replace the section's
    capsys.readouterr()
    assert main(["sweep", str(path), "--grid", "algorithm.lr=0.2", "--grid", "model.hidden=[16, 8],[8]", "--repeat",
                 "1", "--out", str(tmp_path / "from_flags"), "--in-process"]) == 0
    assert [(r["algorithm.lr"], r["model.hidden"], r["repeat"]) for r in table(tmp_path / "from_flags")] == \
        [(0.2, [16, 8], 0), (0.2, [8], 0)]
    started = [line.split()[1] for line in capsys.readouterr().err.splitlines() if line.startswith("start ")]
    assert started == ["algorithm.lr=0.2,model.hidden=[16,8],repeat=0", "algorithm.lr=0.2,model.hidden=[8],repeat=0"]
    assert all((tmp_path / "from_flags" / name).is_dir() for name in started)  # the console names the directories


@pytest.mark.parametrize("section, line", [
    ("{grid: {}}", "error: sweep.grid = {}: expected at least one grid key"),
    ("{grid: {seed: [0, 1]}, repeat: 2}", "error: sweep.repeat = 2: expected 1 when seed is a grid key")])
def test_an_error_in_the_sweep_section_names_its_key(tmp_path, capsys, section, line):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"name: tiny\nsweep: {section}\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(line)


@pytest.mark.parametrize("text, line", [
    (None, "expected an existing YAML file"),
    ("name: t\nsweep: grid: {}\n", "expected valid YAML (line 2, column 12: mapping values are not allowed here)")])
def test_a_scenario_file_that_cannot_be_read_is_its_own_error(tmp_path, capsys, text, line):
    path = tmp_path / "sweep.yaml"
    if text is not None:
        path.write_text(text)
    assert main(["sweep", str(path), "--grid", "algorithm.lr=0.1", "--out", str(tmp_path / "out")]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: scenario = {str(path)!r}: {line}"


def test_submit_of_a_sweep_file_submits_the_sweep(tmp_path, monkeypatch):
    import actors.jobs

    path = tmp_path / "tiny.yaml"
    path.write_text(SWEEP_FILE.replace("OUT", "results/sweeps/tiny"))
    submitted = []
    monkeypatch.setattr(actors.jobs, "submit", lambda address, command, *rest: submitted.append(command) or 0)
    assert main(["submit", str(path), "execution.rounds=2", "--address", "http://head:8265"]) == 0
    assert submitted == [["sweep", "submitted/tiny.yaml", "execution.rounds=2"]]  # shipped beside the code


def test_a_second_live_sweep_into_the_same_directory_is_refused(tmp_path, capsys):
    from raysim.output import OutputDir

    out = tmp_path / "out"
    held = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a lock written by another live process, as a running sweep holds it
        lock = OutputDir.open(str(out), create=True)
        lock.claim("sweep")
        record = dict(lock._lock, pid=held.pid, process_started=__import__("psutil").Process(held.pid).create_time())
        lock.release()
        from raysim.output.directory import LOCK

        (out / LOCK).write_text(json.dumps(record))
        assert sweep("--grid", "execution.rounds=1", "--out", str(out)) == 2
        assert one_error_line(capsys.readouterr().err).startswith(f"error: --out = '{out}': expected a directory "
                                                                  f"no other live sweep is writing to (pid {held.pid} ")
        assert not (out / "sweep.parquet").exists()
    finally:
        held.kill()
        held.wait()


def test_validate_of_a_sweep_file_checks_every_point(tmp_path, capsys):
    path = tmp_path / "sweep.yaml"
    path.write_text(Path(QUICKSTART).read_text() + "sweep:\n  grid:\n    execution.rounds: [1, 2]\n"
                    "    data.num_clients: [40, 30]\n")
    assert main(["validate", str(path)]) == 0
    assert "a sweep of 4 runs over execution.rounds, data.num_clients" in capsys.readouterr().out
    assert main(["validate", str(path), "execution.clients_per_round=35"]) == 2  # 35 > the 30 clients of a point
    assert "at sweep point" in capsys.readouterr().err


def test_a_sweep_killed_outright_stops_its_running_point(tmp_path):
    import psutil

    out = tmp_path / "out"
    sweeper = subprocess.Popen([sys.executable, "-m", "raysim.cli", "sweep", QUICKSTART, *TINY,
                                "execution.rounds=1000000", "--grid", "algorithm.lr=0.05", "--out", str(out)],
                               stderr=subprocess.DEVNULL)
    point_dir, point = out / "algorithm.lr=0.05,repeat=0", None
    try:
        deadline = time.monotonic() + 120
        while not (point_dir / "rounds.parquet").exists():  # the point's run is under way
            assert sweeper.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        point = next(p for p in psutil.Process(sweeper.pid).children() if "run" in p.cmdline())
        sweeper.kill()
        point.wait(timeout=60)  # ended by the SIGTERM the kernel sends when its sweep dies: it stopped as on Ctrl-C
    finally:
        sweeper.kill()
        sweeper.wait()
        if point is not None and point.is_running():
            point.kill()
    assert summary(point_dir)["status"] == "interrupted"
    assert not (point_dir / ".raysim.lock").exists()


STUDY_SCENARIO = """\
name: {name}
data: {{kind: gaussian_mixture, num_clients: 40}}
model: {{kind: mlp, hidden: [16]}}
algorithm: {{name: fedavg, lr: 0.05}}
execution: {{mode: sync, rounds: 1, clients_per_round: 12}}
runtime: {{backend: local}}
eval: {{every: 2}}
"""
STUDY = """\
sweep:
  scenario: a.yaml
  grid:
    - ref:
        clean: {~eval.every: null}
    - scenario: [a.yaml, b.yaml]
      opt:
        slow: {algorithm.lr: 0.05}
        fast: {algorithm.lr: 0.1, execution.rounds: 2}
      seed: [3]
"""


def study(tmp_path, text=STUDY) -> str:
    """A sweep file holding only its sweep: section over two scenario files beside it."""
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(STUDY_SCENARIO.format(name=name))
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return str(path)


def test_a_list_of_grids_with_labelled_sets_and_scenario_files_plans_their_union(tmp_path):
    from raysim.sweep import plan_sweep

    sweep = plan_sweep(study(tmp_path))
    assert [p.name for p in sweep.points] == ["ref=clean,repeat=0"] + [
        f"scenario={s}.yaml,opt={o},seed=3,repeat=0" for s in "ab" for o in ("slow", "fast")]
    assert sweep.grid == {"ref": ["clean"], "scenario": ["a.yaml", "b.yaml"], "opt": ["slow", "fast"], "seed": [3]}
    assert sweep.out == Path("results/sweeps/study")  # the sweep file's name: it holds no scenario of its own
    ref, *rest = sweep.points
    assert ref.values == {"ref": "clean"} and ref.source == str(tmp_path / "a.yaml")
    assert ref.cfg == load_scenario(str(tmp_path / "a.yaml"), ["~eval.every", f"output.dir={ref.dir}"])
    assert ref.cfg.eval.every != 2  # unset: the default applies
    assert [(p.cfg.name, p.values["opt"], p.cfg.algorithm.lr, p.cfg.execution.rounds, p.cfg.seed) for p in rest] == \
        [("a", "slow", 0.05, 1, 3), ("a", "fast", 0.1, 2, 3), ("b", "slow", 0.05, 1, 3), ("b", "fast", 0.1, 2, 3)]


def test_a_label_on_the_command_line_keeps_its_points(tmp_path):
    from raysim.sweep import plan_sweep

    sweep = plan_sweep(study(tmp_path), ["opt=fast", "scenario=b.yaml"])  # the grid without opt drops out
    assert [p.name for p in sweep.points] == ["scenario=b.yaml,opt=fast,seed=3,repeat=0"]
    sweep = plan_sweep(study(tmp_path), ["seed=4,5"])  # a plain key joins the grid without it
    assert [p.name for p in sweep.points][:2] == ["ref=clean,seed=4,repeat=0", "ref=clean,seed=5,repeat=0"]
    assert len(sweep.points) == 10


def test_a_study_runs_skips_what_it_ran_and_tables_every_axis(tmp_path, capsys):
    path = study(tmp_path)
    out = tmp_path / "out"
    assert main(["sweep", path, "--grid", "opt=slow", "--in-process", "--out", str(out)]) == 0
    rows = table(out)
    assert [(r["scenario"], r["opt"], r["seed"], r["status"]) for r in rows] == \
        [("a.yaml", "slow", 3, "completed"), ("b.yaml", "slow", 3, "completed")]
    assert [summary(Path(r["output_dir"]))["name"] for r in rows] == ["a", "b"]
    capsys.readouterr()
    # a plain key joins the grid without it: ref's point runs with b.yaml too
    assert main(["sweep", path, "--grid", "scenario=b.yaml", "--in-process", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("skipped ") == 1 and err.count("start ") == 2, err
    rows = table(out)
    assert [(r["ref"], r["scenario"], r["opt"], r["seed"]) for r in rows] == \
        [("clean", "b.yaml", None, None), (None, "b.yaml", "slow", 3), (None, "b.yaml", "fast", 3)]


@pytest.mark.parametrize("edit, args, line", [
    (("seed: [3]", "seed: [3]\n      extra: {x: {seed: 1}}"), [],
     "error: grid key extra: seed = [1]: expected a key that one axis of a grid sets (seed sets it too)"),
    (("{~eval.every: null}", "{~eval.every: 3}"), [],
     "error: grid key ~eval.every = 3: expected null (~KEY unsets KEY"),
    (("[a.yaml, b.yaml]", "[a.yaml, c.yaml]"), [],
     "error: grid key scenario = 'c.yaml': expected an existing scenario file (relative to "),
    (("  scenario: a.yaml\n", ""), [],
     "error: sweep.grid = 'ref=clean': expected a scenario for every point (sweep.scenario or a grid key scenario)"),
    (("sweep:", "name: x\nsweep:"), [],
     "error: sweep.scenario = 'a.yaml': expected scenario files in a sweep file that holds only its sweep: section"),
    (("      seed: [3]\n", ""), ["--grid", "~eval.every=null", "--grid", "opt=slow,fast"], None),
    (("    - ref:", "    - ref: {clean: {}}\n    - ref:"), [],
     "error: sweep.grid = 'ref=clean': expected grids whose points differ (this point is in two of them)"),
    (("      opt:", "      opt: 3\n      x:"), [], "error: sweep.grid[1].opt = 3: expected a non-empty list of values, "
                                                   "or a mapping of labels"),
    (("        clean: {~eval.every: null}", "        clean: [1]"), [],
     "error: sweep.grid[0].ref.clean = [1]: expected a mapping of scenario keys to values"),
    (("    - ref:", "    - 3\n    - ref:"), [], "error: sweep.grid[0] = 3: expected a mapping of scenario keys"),
    ((), ["--grid", "opt=medium"], "error: --grid opt = 'medium': expected a label of the grid's opt: slow, fast"),
], ids=["key-of-two-axes", "unset-with-value", "missing-file", "no-scenario", "scenario-beside-keys", "labels-twice",
        "point-in-two-grids", "axis-not-a-list", "set-not-a-mapping", "grid-not-a-mapping", "unknown-label"])
def test_a_bad_study_is_one_line_naming_its_key(tmp_path, capsys, edit, args, line):
    text = STUDY.replace(*edit) if edit else STUDY
    if line is None:  # the same value of a key given twice on the command line, as labels: a set given twice
        text, line = STUDY.replace("fast: {", "slow2: {"), "error: grid key opt = ['slow', 'slow2', 'slow']"
        args = ["--grid", "opt=slow,slow2,slow"]
    out = tmp_path / "out"
    assert main(["sweep", study(tmp_path, text), *args, "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(line)
    assert not out.exists()
