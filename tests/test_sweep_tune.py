"""`raysim sweep --runner tune`: each point a Ray Tune trial in one Ray session, its process and its
ClientActors one placement group; the same models as runs of the points alone, skip-finished and
resuming as in the other modes, the node of each trial in the table, bad resources refused first."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import cli_in_own_session, init_session_ray

from raysim.api import execute
from raysim.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
TINY = ["data.num_clients=40", "execution.clients_per_round=12", "model.hidden=[16]", "eval.personalized_steps=0",
        "execution.rounds=2"]
# a trial of 1 + 2 bundles, the actors' with half a logical GPU each
RAY = {"runtime.backend": "ray", "runtime.num_actors": 2, "runtime.num_cpus": 4, "runtime.num_gpus": 2,
       "runtime.gpus_per_actor": 0.5}
SWEEP = f"""\
sweep:
  scenario: {QUICKSTART}
  grid:
    algorithm.lr: [0.05, 0.1]
    backend:
      local: {{runtime.backend: local}}
      ray: {{{", ".join(f"{k}: {v}" for k, v in RAY.items())}}}
"""
POINTS = [f"algorithm.lr={lr},backend={b},repeat=0" for lr in (0.05, 0.1) for b in ("local", "ray")]


def sweep_cli(*args, timeout=240) -> subprocess.CompletedProcess:
    """``raysim sweep … --runner tune`` in a process (and session) of its own: whatever of its Ray is left
    when it ends is killed, also when the test fails."""
    return cli_in_own_session("sweep", *args, "--runner", "tune", timeout=timeout)


def summary(point_dir: Path) -> dict:
    return json.loads((point_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def tune_sweep(tmp_path_factory):
    """The 2 × 2 sweep, first its local points alone (a sweep stopped after two points), then the
    whole grid into the same directory; the directory and both runs' stderr."""
    path = tmp_path_factory.mktemp("tune") / "sweep.yaml"
    path.write_text(SWEEP)
    out = path.parent / "out"
    first = sweep_cli(str(path), *TINY, "--grid", "backend=local", "--out", str(out))
    assert first.returncode == 0, first.stderr
    whole = sweep_cli(str(path), *TINY, "--out", str(out))
    assert whole.returncode == 0, whole.stderr
    return path, out, first.stderr, whole.stderr


def test_a_restarted_sweep_runs_only_the_points_not_completed(tune_sweep):
    _, out, first, whole = tune_sweep
    assert sorted(line.split()[1] for line in first.splitlines() if line.startswith("start ")) == POINTS[0::2]
    assert sorted(line.split()[1] for line in whole.splitlines() if line.startswith("start ")) == POINTS[1::2]
    assert sorted(line.split()[1].rstrip(":") for line in whole.splitlines() if line.startswith("skipped ")) == \
        POINTS[0::2]
    assert (out / ".tune").is_dir() and sorted(p.name for p in out.iterdir() if p.is_dir()) == [".tune", *POINTS]


def test_each_point_has_the_model_of_its_run_alone_and_its_node_in_the_table(tune_sweep, tmp_path):
    """A ray point's run alone is its scenario on the local backend: the same model whatever the
    backend (tests/test_ray.py), without a Ray in this process."""
    path, out, _, _ = tune_sweep
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [Path(r["output_dir"]).name for r in rows] == POINTS
    alone_runs = {}  # lr -> the summary of its run alone
    for row in rows:
        assert row["status"] == "completed" and row["mode"] == "tune" and len(row["node"]) == 56  # a node id
        lr, backend = row["algorithm.lr"], row["backend"]
        point = summary(Path(row["output_dir"]))
        assert point["backend"] == backend
        if backend == "ray":  # its two ClientActors, each with half a logical GPU of the trial's group
            assert point["num_actors"] == 2 and all(len(a["gpu_ids"]) == 1 for a in point["actors"])
        alone = alone_runs.get(lr) or execute(load_scenario(str(QUICKSTART), [
            *TINY, f"algorithm.lr={lr}", "runtime.backend=local", f"output.dir={tmp_path / str(lr)}"]))[0]
        alone_runs[lr] = alone
        assert point["model_sha256"] == alone["model_sha256"], row["output_dir"]


def test_a_second_call_skips_every_point_without_starting_ray(tune_sweep):
    path, out, _, _ = tune_sweep
    before = sorted(p.stat().st_mtime_ns for p in out.glob("*/summary.json"))
    experiments = sorted((out / ".tune").iterdir())  # one per sweep that ran trials
    again = sweep_cli(str(path), *TINY, "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("skipped ") == 4 and "start " not in again.stderr, again.stderr
    assert sorted(p.stat().st_mtime_ns for p in out.glob("*/summary.json")) == before
    assert sorted((out / ".tune").iterdir()) == experiments


def test_a_trial_that_cannot_fit_is_one_error_line_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    proc = sweep_cli(str(QUICKSTART), *TINY, "runtime.num_cpus=2", "runtime.num_actors=2", "--grid",
                     "algorithm.lr=0.05,0.1", "--out", str(out), timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        "error: runtime.num_actors = 2: expected at most 1 actors (1 node(s), 1 CPUs at runtime.cpus_per_actor=1), "
        "or 'auto'; the trial's own process holds 1 CPU of the largest node (at sweep point algorithm.lr=0.05,"
        "repeat=0)")
    assert not out.exists()


def test_the_sweep_section_chooses_the_runner_and_the_flag_overrides_it(tmp_path):
    from raysim.errors import ScenarioError
    from raysim.sweep import plan_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP + "  runner: tune\n")
    assert plan_sweep(str(path), overrides=TINY).runner == "tune"
    assert plan_sweep(str(path), overrides=TINY, runner="processes").runner == "processes"
    path.write_text(SWEEP + "  runner: threads\n")
    with pytest.raises(ScenarioError, match=r"^sweep.runner = 'threads': expected processes or tune$"):
        plan_sweep(str(path), overrides=TINY)


@pytest.fixture
def two_nodes():
    """A two-node cluster (2 CPUs each) that this test process joins; the test session's Ray is
    started again afterwards."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    session = ray.is_initialized()
    if session:
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR")
        yield cluster
    finally:  # shut everything down, also when the test fails
        ray.shutdown()
        cluster.shutdown()
        if session:
            init_session_ray()


@pytest.mark.slow
def test_trials_spread_over_the_nodes_without_oversubscribing_them(two_nodes, tmp_path):
    """Each trial holds a whole node (runtime.torch_threads=2: its bundle 0 is 2 CPUs): the two trials
    land on the two nodes, and Ray gives neither node a second trial while it holds one."""
    import ray

    from raysim.sweep import plan_sweep, run_sweep

    sweep = plan_sweep(str(QUICKSTART), ["algorithm.lr=0.05,0.1"],
                       [*TINY, "runtime.backend=local", "runtime.torch_threads=2"], out=str(tmp_path / "out"),
                       runner="tune")
    assert run_sweep(sweep, quiet=True) == 0
    rows = pq.read_table(tmp_path / "out" / "sweep.parquet").to_pylist()
    assert {r["node"] for r in rows} == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
