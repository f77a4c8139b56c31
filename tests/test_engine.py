"""A whole run on the in-process runtime: outputs, evaluation, divergence, interruption."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import small_scenario

from raysim.bench import SCENARIOS, STAGE_BENCHES, STAGE_ROUNDS
from raysim.engine.run import Tally
from raysim.engine.runtime import LocalRuntime
from raysim.engine.payloads import MAX_HANDLES
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.system import SystemModel
from raysim.errors import DivergenceError


def _run(cfg):
    return run_scenario(prepare(cfg), LocalRuntime())


def test_outputs_have_the_promised_columns_and_rows(tmp_path):
    cfg = small_scenario(tmp_path, "eval.every=2", "execution.rounds=4")
    summary = _run(cfg)
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} >= {"scenario.yaml", "rounds.parquet", "events.parquet",
                                               "summary.json", "model.pt"}
    rounds = pq.read_table(out / "rounds.parquet").to_pydict()
    for col in ["round", "virtual_time", "wall_time", "train_loss", "test_loss", "test_accuracy", "clients", "samples"]:
        assert col in rounds
    assert rounds["round"] == [1, 2, 3, 4]
    assert rounds["clients"] == [12] * 4
    assert rounds["test_accuracy"][0] is None and rounds["test_accuracy"][1] is not None  # eval.every=2
    events = pq.read_table(out / "events.parquet").to_pydict()
    for col in ["round", "client_id", "actor", "samples", "train_loss", "compute_seconds"]:
        assert col in events
    assert len(events["client_id"]) == 4 * 12 == summary["client_updates"]
    system = SystemModel(cfg.system, 40, cfg.seed)
    for r in range(4):  # the sampled clients (dispatch counter r; everyone is always available), by id
        ids = [c for rr, c in zip(events["round"], events["client_id"]) if rr == r + 1]
        assert ids == system.sample_available(0.0, r, 12).tolist()
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["model_sha256"] == summary["model_sha256"] and len(summary["model_sha256"]) == 64
    assert 0 <= on_disk["final_test_accuracy"] <= 1 and on_disk["wall_seconds"] > 0
    state = torch.load(out / "model.pt")
    assert set(state) == {"1.weight", "1.bias", "3.weight", "3.bias"}
    resolved = (out / "scenario.yaml").read_text()
    assert "num_clients: 40" in resolved and f"dir: {tmp_path}/out" in resolved


@pytest.mark.parametrize("steps", [["execution.rounds=6"],
                                   ["execution.mode=async", "execution.concurrency=4", "execution.max_updates=6"]])
def test_evaluation_time_is_logged_apart_from_the_training_rate(tmp_path, steps):
    cfg = small_scenario(tmp_path, "eval.every=2", *steps)
    summary = _run(cfg)
    rounds = pq.read_table(tmp_path / "out" / "rounds.parquet").to_pydict()
    assert len(rounds["round"]) == 6
    wall, evaluating = np.array(rounds["wall_time"]), np.array(rounds["eval_seconds"])
    assert (evaluating > 0).all()  # diagnostics at least
    assert evaluating[1::2].sum() > evaluating[0::2].sum()  # the evaluation steps: 2, 4, 6
    training = np.array(rounds["clients"]) / np.array(rounds["updates_per_second"])
    assert (training[1:] + evaluating[1:] <= np.diff(wall) + 1e-9).all()  # each step's wall holds both
    steady = sum(rounds["clients"][1:]) / (wall[-1] - wall[0] - evaluating[1:].sum())
    assert summary["steady_updates_per_second"] == pytest.approx(steady, rel=1e-9)


def test_steady_rate_leaves_out_warm_up_and_evaluation():
    tally = Tally()
    tally.add({"events": None, "rounds": [
        {"wall_time": 5.0, "clients": 10, "eval_seconds": 4.0},  # the first step: warm-up, left out
        {"wall_time": 6.0, "clients": 10, "eval_seconds": 0.0},
        {"wall_time": 10.0, "clients": 10, "eval_seconds": 3.0}]})  # a final evaluation of 3 s
    assert tally.steady_rate() == 20 / 2.0


def test_training_improves_accuracy(tmp_path):
    first = _run(small_scenario(tmp_path / "first", "execution.rounds=1", "algorithm.lr=0.05"))
    longer = _run(small_scenario(tmp_path / "longer", "execution.rounds=15", "algorithm.lr=0.05", "eval.every=0"))
    assert longer["final_test_accuracy"] > first["final_test_accuracy"] + 0.1


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = _run(small_scenario(tmp_path / "a"))
    b = _run(small_scenario(tmp_path / "b"))
    c = _run(small_scenario(tmp_path / "c", "seed=1"))
    assert a["model_sha256"] == b["model_sha256"] != c["model_sha256"]


def test_clients_per_task_does_not_change_the_math(tmp_path):
    a = _run(small_scenario(tmp_path / "a", "runtime.clients_per_task=1"))
    b = _run(small_scenario(tmp_path / "b", "runtime.clients_per_task=12"))
    assert abs(a["final_test_accuracy"] - b["final_test_accuracy"]) < 0.02
    ta = torch.load(tmp_path / "a/out/model.pt")
    tb = torch.load(tmp_path / "b/out/model.pt")
    for k in ta:
        torch.testing.assert_close(ta[k], tb[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides, size", [
    (["execution.clients_per_round=100"], 25), (["execution.clients_per_round=1000"], 25),
    (["execution.clients_per_round=10"], 3), (["runtime.clients_per_task=7"], 7),
    (["execution.mode=async", "execution.max_updates=10", "execution.concurrency=100"], 13),
    (["execution.mode=async", "execution.max_updates=10", "execution.concurrency=10000"], 100),
    (["execution.mode=async", "execution.max_updates=10", "execution.concurrency=10000",
      "runtime.clients_per_task=25"], 25)])
def test_auto_task_size_is_a_share_of_the_round_or_of_the_concurrency(tmp_path, overrides, size):
    """'auto': a quarter of a synchronous round, at most 25 (four tasks or more for the actors);
    an eighth of the asynchronous concurrency, at most 100 (its calls are many)."""
    from raysim.scenario.schema import clients_per_task

    cfg = small_scenario(tmp_path, "data.num_clients=20000", "runtime.clients_per_task=auto", *overrides)
    assert clients_per_task(cfg) == size


def test_broadcast_model_versions_kept_are_bounded_by_those_in_use(tmp_path):
    """Broadcast versions that no unsent task refers to are forgotten once the kept ones reach
    MAX_HANDLES or twice those in use at the last clear-out (fewer than a task's 100 here): never
    one an unsent task needs, and never hundreds."""
    from raysim.data import build_dataset
    from raysim.scenario import scenario_object

    cfg = small_scenario(tmp_path, "data.num_clients=400", "model.kind=logreg", "execution.mode=async",
                         "execution.concurrency=300", "execution.max_updates=600", "runtime.clients_per_task=100",
                         "eval.every=0")
    scenario, runtime = scenario_object(cfg), LocalRuntime()
    scheduler = runtime.scheduler(scenario, runtime.load(scenario, build_dataset(cfg.data, cfg.seed)))
    most = 0
    while not scheduler.done:
        scheduler.advance(0.0)
        assert scheduler.loop.versions_in_use() <= scheduler.payloads.versions()
        most = max(most, len(scheduler.payloads.versions()))
    assert MAX_HANDLES < most <= 2 * 99


def test_personalized_evaluation_fine_tunes_before_testing(tmp_path):
    summary = _run(small_scenario(tmp_path, "eval.personalized_steps=5", "eval.personalized_lr=0.05",
                                  "execution.rounds=2"))
    rounds = pq.read_table(tmp_path / "out/rounds.parquet").to_pydict()
    assert all(0 <= a <= 1 for a in rounds["personalized_accuracy"])
    assert summary["final_personalized_accuracy"] == rounds["personalized_accuracy"][-1]
    # clients here have label skew: adapting to local data beats the global model
    assert summary["final_personalized_accuracy"] > summary["final_test_accuracy"]


def test_divergence_names_round_and_client_and_keeps_metrics(tmp_path):
    cfg = small_scenario(tmp_path, "algorithm.lr=1e30", "execution.rounds=5")
    with pytest.raises(DivergenceError, match=r"round \d+: client \d+ diverged .*algorithm.lr"):
        _run(cfg)
    rounds = pq.read_table(tmp_path / "out/rounds.parquet")
    events = pq.read_table(tmp_path / "out/events.parquet")
    assert events.num_rows == 12 * (rounds.num_rows + 1)  # the diverged round's events are kept
    assert "diverged" in events.column("status").to_pylist()


def test_cli_divergence_exits_1_with_one_clear_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml", "--quiet",
                           "runtime.backend=local", "algorithm.lr=1e30", f"output.dir={tmp_path}/run"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "error: round 1: client" in proc.stderr and "diverged" in proc.stderr
    assert pq.read_table(tmp_path / "run/events.parquet").num_rows == 20


def test_interrupted_run_keeps_readable_metrics(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml", "--quiet",
                             "runtime.backend=local", "execution.rounds=100000", "output.flush_seconds=0",
                             f"output.dir={tmp_path}/run"], stderr=subprocess.PIPE, text=True)
    rounds_file = tmp_path / "run/rounds.parquet"
    deadline = time.time() + 120
    while not rounds_file.exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"interrupted: metrics and a checkpoint are in {tmp_path}/run; "
                                            f"continue with: raysim resume {tmp_path}/run")
    rounds = pq.read_table(rounds_file).to_pydict()
    events = pq.read_table(tmp_path / "run/events.parquet")
    assert len(rounds["round"]) >= 1 and rounds["round"] == list(range(1, len(rounds["round"]) + 1))
    assert events.num_rows >= 20 * len(rounds["round"])


def test_the_line_after_ctrl_c_offers_only_this_runs_checkpoint(tmp_path):
    from raysim.cli import _stopped_line
    from raysim.scenario import to_yaml

    cfg = small_scenario(tmp_path)
    run = tmp_path / "out"
    run.mkdir()
    nothing = f"interrupted before the run's first checkpoint: nothing to resume in {run}"
    resume = f"interrupted: metrics and a checkpoint are in {run}; continue with: raysim resume {run}"
    assert _stopped_line(cfg, resuming=False) == nothing
    (run / "checkpoint.pt").write_bytes(b"a checkpoint")
    (run / "scenario.yaml").write_text(to_yaml(small_scenario(tmp_path, "seed=1")))
    assert _stopped_line(cfg, resuming=False) == nothing + " (the checkpoint.pt there is an earlier run's)"
    assert _stopped_line(cfg, resuming=True) == resume  # its own checkpoint, whatever the runtime keys
    (run / "scenario.yaml").write_text(to_yaml(cfg))  # this run's, or an earlier one of the same scenario
    assert _stopped_line(cfg, resuming=False) == resume


def test_digits_with_cnn_trains(tmp_path):
    summary = _run(small_scenario(tmp_path, "data.kind=digits", "data.num_clients=10", "model.kind=cnn",
                                  "model.channels=[8]", "execution.clients_per_round=10",
                                  "execution.rounds=8", "algorithm.lr=0.1", "eval.every=0"))
    assert summary["final_test_accuracy"] > 0.6


def test_parquet_data_runs(tmp_path):
    import pyarrow as pa

    rng = np.random.default_rng(0)
    n = 600
    client = rng.integers(0, 6, n)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    pq.write_table(pa.table({"client_id": client, "f0": x[:, 0], "f1": x[:, 1], "f2": x[:, 2], "f3": x[:, 3],
                             "label": y}), tmp_path / "data.parquet")
    summary = _run(small_scenario(tmp_path, "data.kind=parquet", f"data.path={tmp_path}/data.parquet",
                                  "execution.clients_per_round=6", "execution.rounds=10", "model.kind=logreg",
                                  "algorithm.lr=0.5", "eval.every=0"))
    assert summary["final_test_accuracy"] > 0.9


def test_parquet_with_too_few_clients_is_an_input_error(tmp_path):
    import pyarrow as pa

    from raysim.errors import ScenarioError

    pq.write_table(pa.table({"client_id": [0, 0, 1, 1], "f0": [0.0, 1.0, 2.0, 3.0], "label": [0, 1, 0, 1]}),
                   tmp_path / "d.parquet")
    cfg = small_scenario(tmp_path, "data.kind=parquet", f"data.path={tmp_path}/d.parquet",
                         "execution.clients_per_round=5")
    with pytest.raises(ScenarioError, match=r"execution.clients_per_round = 5: expected an integer in \[1, 2\]"):
        prepare(cfg)


def test_bench_reference_loop_trains_the_same_algorithm(tmp_path):
    """The bare loop of `raysim bench` is FedAvg on the same data: it reaches raysim's accuracy."""
    from raysim.bench.bare_loop import bare_fedavg

    cfg = small_scenario(tmp_path, "execution.rounds=15", "eval.every=0")
    ours = _run(cfg)
    bare = bare_fedavg(cfg)
    assert len(bare["round_seconds"]) == 15
    assert abs(bare["final_test_accuracy"] - ours["final_test_accuracy"]) < 0.05
    assert bare["final_test_accuracy"] > 0.4


BASELINE_CLI = """
import json, sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
out = Path(sys.argv[-1].split("=", 1)[1])
out.mkdir(parents=True)
pq.write_table(pa.table({"clients": [10] * 4, "updates_per_second": [5.0, 20.0, 40.0, 10.0]}), out / "rounds.parquet")
summary = {"mode": "sync", "final_test_accuracy": 0.5, "num_actors": 1, "cli": __file__, "scenario": sys.argv[2]}
(out / "summary.json").write_text(json.dumps(summary))
"""


def test_bench_baseline_side_runs_the_other_checkouts_raysim_on_its_own_scenario(tmp_path):
    """`raysim bench --baseline DIR`: that side imports DIR's raysim, not the installed one, and
    runs DIR's copy of the workload's scenario file; its figures are read as raysim's are."""
    from raysim.bench import run_raysim

    checkout = tmp_path / "checkout"
    (checkout / "scenarios" / "bench").mkdir(parents=True)
    (checkout / "raysim").mkdir()
    (checkout / "raysim" / "__init__.py").write_text("")
    (checkout / "raysim" / "cli.py").write_text(BASELINE_CLI)
    figures = run_raysim("w1", tmp_path / "out", checkout)
    summary = json.loads((tmp_path / "out" / "w1" / "baseline" / "summary.json").read_text())
    assert summary["cli"] == str(checkout / "raysim" / "cli.py")
    assert summary["scenario"] == str(checkout / "scenarios" / "bench" / "w1.yaml")
    assert figures["updates_per_second"] == 20.0  # the median round after the first: 0.5 s of 0.25, 0.5 and 1 s
    assert figures["final_test_accuracy"] == 0.5


@pytest.mark.parametrize("extra, allowed", [
    ([], "a raysim checkout, with raysim/cli.py and scenarios/bench/ (git worktree add DIR COMMIT makes one)"),
    (["--scale"], "no --durability, --aggregators, --scale, --sweep, --privacy, --compression or --personalization "
                   "with it (it runs beside W1, W2 and --async)"),
    (["--sweep"], "no --durability, --aggregators, --scale, --sweep, --privacy, --compression or --personalization "
                  "with it (it runs beside W1, W2 and --async)")])
def test_bench_baseline_that_cannot_run_is_one_error_line(tmp_path, capsys, extra, allowed):
    from raysim.cli import main

    assert main(["bench", "--baseline", str(tmp_path), "--out", str(tmp_path / "out"), *extra]) == 2
    assert capsys.readouterr().err.strip() == f"error: --baseline = {str(tmp_path)!r}: expected {allowed}"
    assert not (tmp_path / "out").exists()


def test_bench_scale_with_too_few_clients_is_one_error_line(tmp_path, capsys):
    from raysim.cli import main

    assert main(["bench", "--scale", "--clients", "500", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr() == ("", "error: --clients = 500: expected an integer > 1,000 (W1's own population)\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, line", [
    (["--repeat", "0"], "error: --repeat = 0: expected an integer >= 1"),
    (["--durability", "--events", "0"], "error: --events = 0: expected an integer >= 1")])
def test_bench_counts_below_one_are_one_error_line(tmp_path, capsys, extra, line):
    from raysim.cli import main

    assert main(["bench", "--out", str(tmp_path / "out"), *extra]) == 2
    assert capsys.readouterr() == ("", line + "\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bench, variant", [(bench, variant) for bench, variants in STAGE_BENCHES.items()
                                             for variant in variants])
def test_every_stage_bench_variant_is_a_valid_w1_scenario(tmp_path, capsys, bench, variant):
    from raysim.cli import main

    overrides = [*STAGE_ROUNDS, *STAGE_BENCHES[bench][variant], f"output.dir={tmp_path}/out"]
    assert main(["validate", str(SCENARIOS / "w1.yaml"), *overrides]) == 0, capsys.readouterr().err
