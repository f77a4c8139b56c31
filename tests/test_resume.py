"""Checkpoint and resume: a run stopped at any moment (an exception between reports, Ctrl-C,
SIGKILL of the driver) and resumed ends with the uninterrupted run's model bytes and the same
rows and events (wall-clock columns aside); the output directory always says how the run ended;
a second run into a live directory is refused; a new run never leaves an earlier run's files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import shutil
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import small_overrides, small_scenario

import raysim
from raysim.api import execute
from raysim.scenario import load_scenario
from raysim.resuming import load_resume
from raysim.errors import RunError, ScenarioError

STRAGGLERS = ["system.compute.kind=lognormal", "system.compute.slow_fraction=0.1", "system.compute.noise=0.2",
              "system.compute.seconds_per_sample=0.05", "system.dropout=0.05"]
CASES = {
    "sync_deadline": ["execution.rounds=8", "execution.clients_per_round=6", "execution.deadline=30",
                      "execution.over_selection=1.5"] + STRAGGLERS,
    "fedasync": STRAGGLERS + ["execution.mode=async", "execution.concurrency=6", "execution.max_updates=40",
                              "execution.staleness.kind=polynomial", "algorithm.server_lr=0.3", "eval.every=5"],
    "fedbuff": STRAGGLERS + ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=4",
                             "execution.concurrency=6", "execution.max_updates=48", "eval.every=3",
                             "algorithm.lr_decay=0.99"],  # each client's step decays from its own start
    "scaffold": ["algorithm.name=scaffold", "execution.rounds=8", "execution.clients_per_round=6", "eval.every=2",
                 "eval.personalized_steps=2", "eval.curvature=true",  # both evaluations in the checkpoint too,
                 "data.num_clients=12", "model.hidden=[8]"],  # on a small problem: the curvature's exact Hessian
    "byzantine_fedasync": STRAGGLERS + ["execution.mode=async", "execution.concurrency=6", "execution.max_updates=40",
                                        "system.byzantine.fraction=0.3", "system.byzantine.attack=alie",
                                        "system.byzantine.window=4", "eval.every=5"],
    "byzantine_buckets": ["execution.rounds=8", "execution.clients_per_round=6", "system.byzantine.fraction=0.2",
                          "system.byzantine.attack=gaussian", "algorithm.aggregator=centered_clipping",
                          "algorithm.bucket_size=2", "algorithm.client_momentum=0.9"],
    "custom_fednova_fedbuff": STRAGGLERS + [  # a custom algorithm whose server diagnostic (tau_eff) is a column
        "algorithm.name=examples.fednova:FedNova", "execution.mode=async", "execution.aggregation=fedbuff",
        "execution.buffer_size=4", "execution.concurrency=6", "execution.max_updates=48", "eval.every=3",
        "system.unreliable.local_steps.kind=uniform_int", "system.unreliable.local_steps.low=1",
        "system.unreliable.local_steps.high=6"],
    "central_dp_poisson_adaptive": ["execution.rounds=8", "execution.clients_per_round=6", "eval.every=2",
                                    "execution.sampling=poisson", "privacy.mechanism=central",
                                    "privacy.target_epsilon=4", "privacy.clip_norm=0.5",
                                    "privacy.adaptive_clip.target_quantile=0.5", "privacy.adaptive_clip.count_noise=1"],
    "dp_ftrl_restarts_fedbuff": STRAGGLERS + ["execution.mode=async", "execution.aggregation=fedbuff",
                                              "execution.buffer_size=4", "execution.concurrency=6",
                                              "execution.max_updates=48", "eval.every=3", "privacy.mechanism=dp_ftrl",
                                              "privacy.noise_multiplier=0.7", "privacy.tree_restart_every=5"],
    "secagg_dropouts": ["execution.rounds=8", "execution.clients_per_round=6", "execution.deadline=30",
                        "system.dropout=0.2", "communication.secure_aggregation.protocol=secagg",
                        "communication.secure_aggregation.threshold=5"] + STRAGGLERS[:-1],
    "qsgd_elias_ef_deadline": ["execution.rounds=8", "execution.clients_per_round=6", "execution.deadline=30",
                               "communication.uplink.kind=qsgd", "communication.uplink.coding=elias",
                               "communication.uplink.error_feedback=ef"] + STRAGGLERS,
    "oort_deadline": ["execution.rounds=8", "execution.clients_per_round=6", "execution.deadline=30",
                      "execution.selection.kind=oort", "execution.selection.pacer_step=2"] + STRAGGLERS,
    "importance": ["execution.rounds=8", "execution.clients_per_round=6", "execution.selection.kind=importance",
                   "eval.every=2"],
    "topk_ef_fedbuff": STRAGGLERS + ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=4",
                                     "execution.concurrency=6", "execution.max_updates=48", "eval.every=3",
                                     "communication.uplink.kind=topk", "communication.uplink.fraction=0.05",
                                     "communication.uplink.error_feedback=ef"],
    "ditto": ["algorithm.name=ditto", "algorithm.personal_steps=3", "execution.rounds=8",
              "execution.clients_per_round=6", "eval.every=2"],  # personal models kept and evaluated
    "ditto_fedbuff": STRAGGLERS + ["algorithm.name=ditto", "execution.mode=async", "execution.aggregation=fedbuff",
                                   "execution.buffer_size=4", "execution.concurrency=6", "execution.max_updates=48",
                                   "eval.every=3", "eval.personalized_steps=1"],
    "apfl": ["algorithm.name=apfl", "execution.rounds=8", "execution.clients_per_round=6",
             "eval.every=2"],  # v_k and α_k kept, the mixtures evaluated
    "pfedme_fedbuff": STRAGGLERS + ["algorithm.name=pfedme", "algorithm.inner_steps=2", "execution.mode=async",
                                    "execution.aggregation=fedbuff", "execution.buffer_size=4",
                                    "execution.concurrency=6", "execution.max_updates=48", "eval.every=3"],
    "fedrep_fedbuff": STRAGGLERS + ["algorithm.name=fedrep", "model.personal=output_layer",
                                    "model.personal_state=stateful", "algorithm.head_steps=2", "execution.mode=async",
                                    "execution.aggregation=fedbuff", "execution.buffer_size=4",
                                    "execution.concurrency=6", "execution.max_updates=48", "eval.every=3"],
    "fedper": ["algorithm.name=fedper", "model.personal=output_layer", "model.personal_state=stateful",
               "execution.rounds=8", "execution.clients_per_round=6", "eval.every=2", "eval.personalized_steps=1"],
    "fedbn": ["algorithm.name=fedbn", "model.personal=normalization", "model.personal_state=stateful",
              "data.kind=digits", "data.num_clients=12", "model.kind=bn_cnn", "algorithm.local_steps=2",
              "algorithm.batch_size=8", "execution.rounds=8", "execution.clients_per_round=4", "eval.every=2"],
    "local_only": ["algorithm.name=local_only", "execution.rounds=8", "execution.clients_per_round=6",
                   "eval.every=2", "eval.personalized_steps=1"],
    "l2gd_quadratic_on_demand": ["data.kind=quadratic", "data.num_clients=8", "data.n=60", "data.d_theta=6",
                                 "data.d_w=3", "model.kind=quadratic", "algorithm.name=l2gd", "algorithm.local_steps=3",
                                 "execution.rounds=8", "execution.clients_per_round=8", "data.on_demand=true",
                                 "data.cache_mb=0.002"],  # per-client models; statistics of 3 clients kept
}
WALL_COLUMNS = {"rounds.parquet": {"wall_time", "updates_per_second", "eval_seconds"},
                "events.parquet": {"compute_seconds", "actor", "node"}}


def _tables(run_dir) -> dict:
    """Both logs without their wall-clock columns, as Python lists."""
    out = {}
    for name, wall in WALL_COLUMNS.items():
        table = pq.read_table(f"{run_dir}/{name}")
        out[name] = table.select([c for c in table.column_names if c not in wall]).to_pylist()
    return out


def _summary(run_dir) -> dict:
    with open(f"{run_dir}/summary.json") as f:
        return json.load(f)


class StopAfter:
    """A progress callback that interrupts the run (as Ctrl-C would) at its ``n``-th report."""

    def __init__(self, n: int):
        self.n, self.seen = n, 0

    def __call__(self, report):
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The uninterrupted run of each case: its summary and tables."""
    tmp = tmp_path_factory.mktemp("reference")
    runs = {}
    for case in CASES:
        result = raysim.run(small_scenario(tmp, *CASES[case], f"output.dir={tmp}/{case}"))
        runs[case] = (result.summary, _tables(result.output_dir))
    return runs


@pytest.mark.parametrize("case", list(CASES))
def test_interrupted_then_resumed_equals_uninterrupted(tmp_path, references, case):
    cfg = small_scenario(tmp_path, *CASES[case], "output.checkpoint_every=2")
    with pytest.raises(KeyboardInterrupt):
        raysim.run(cfg, progress=StopAfter(2))
    run_dir = cfg.output.dir
    stopped = _summary(run_dir)
    assert stopped["status"] == "interrupted" and stopped["model_sha256"] is None
    assert 0 < stopped["server_steps"] < references[case][0]["server_steps"]
    assert os.path.exists(f"{run_dir}/checkpoint.pt") and not os.path.exists(f"{run_dir}/model.pt")
    # the logs on disk cover exactly the steps of the checkpoint
    assert len(pq.read_table(f"{run_dir}/rounds.parquet")) == stopped["rounds"]

    result = raysim.resume(run_dir)
    summary, tables = references[case]
    assert result.summary["status"] == "completed"
    assert result.summary["model_sha256"] == summary["model_sha256"]
    for key in ("rounds", "server_steps", "client_updates", "tasks", "final_test_accuracy", "virtual_time", "privacy"):
        assert result.summary[key] == summary[key], key
    assert _tables(run_dir) == tables
    assert not os.path.exists(f"{run_dir}/checkpoint.pt")  # nothing left to resume
    if "fednova" in case:
        assert all(row["tau_eff"] >= 1 for row in tables["rounds.parquet"])


def test_resume_refuses_keys_that_change_results_and_finished_runs(tmp_path):
    cfg = small_scenario(tmp_path, "output.checkpoint_every=1")
    with pytest.raises(KeyboardInterrupt):
        raysim.run(cfg, progress=StopAfter(1))
    with pytest.raises(ScenarioError, match=r"algorithm.lr = '0.5': expected a key that cannot change results"):
        raysim.resume(cfg.output.dir, ["algorithm.lr=0.5"])
    checkpoint = tmp_path / "out" / "checkpoint.pt"
    saved = checkpoint.read_bytes()
    torch.save({"format": 1, "value": np.float64(1.0)}, checkpoint)  # content that a weights-only load refuses
    with pytest.raises(ScenarioError) as refused:
        raysim.resume(cfg.output.dir)
    message = str(refused.value)
    assert message.startswith("run_dir = ") and "a readable checkpoint.pt: Weights only load failed" in message
    assert "\n" not in message and "\x1b" not in message  # one plain line, without torch's colour codes
    checkpoint.write_bytes(b"")  # a file cut to nothing: torch's error has no message
    with pytest.raises(ScenarioError, match="a readable checkpoint.pt: EOFError$"):
        raysim.resume(cfg.output.dir)
    checkpoint.write_bytes(saved)
    stale = load_resume(cfg.output.dir, [])  # read as `raysim resume` reads it, before it claims the directory
    before = _summary(cfg.output.dir)["checkpoints"]["count"]
    with pytest.raises(KeyboardInterrupt):  # stopped again: the count goes on from the checkpoint's
        raysim.resume(cfg.output.dir, progress=StopAfter(1))
    taken = _summary(cfg.output.dir)["checkpoints"]
    # a run that wrote into the directory between that read and the claim: the stale read is refused
    with pytest.raises(ScenarioError, match=r"^run_dir = .*: expected a directory no other run wrote into while "
                       r"this one was being resumed \(its checkpoint.pt has changed"):
        execute(stale[0], checkpoint=stale[1])
    assert _summary(cfg.output.dir)["checkpoints"] == taken and not os.path.exists(tmp_path / "out" / ".raysim.lock")
    assert taken["count"] >= before + 1 >= 2 and taken["bytes"] == checkpoint.stat().st_size
    # to the end without a checkpoint: the counts stay those of the checkpoint it resumed from (its
    # seconds from the summary written after it; without that summary, as after SIGKILL, they are missed)
    no_more = ["runtime.torch_threads=1", "output.checkpoint_every=0", "output.checkpoint_seconds=0"]
    killed = shutil.copytree(cfg.output.dir, tmp_path / "killed")
    os.remove(killed / "summary.json")
    resumed = raysim.resume(str(killed), no_more).summary["checkpoints"]
    assert (resumed["count"], resumed["bytes"]) == (taken["count"], taken["bytes"])
    assert resumed["seconds"] < taken["seconds"]
    assert raysim.resume(cfg.output.dir, [*no_more, "~runtime.torch_threads"]).summary["checkpoints"] == taken
    with pytest.raises(ScenarioError, match="this one has: nothing to resume"):
        raysim.resume(cfg.output.dir)
    with pytest.raises(ScenarioError, match=r"the output directory of a run \(there is no such directory\)"):
        raysim.resume(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ScenarioError, match=r"the output directory of a run \(it has no scenario.yaml\)"):
        raysim.resume(str(tmp_path / "empty"))


def test_a_failed_run_replaces_the_earlier_run_and_says_it_failed(tmp_path):
    first = raysim.run(small_scenario(tmp_path, "execution.rounds=4"))
    assert first.summary["status"] == "completed"
    assert {"model.pt", "summary.json", "rounds.parquet"} <= set(os.listdir(first.output_dir))
    with pytest.raises(RunError, match="diverged"):
        raysim.run(small_scenario(tmp_path, "algorithm.lr=1e12", "seed=3"), replace=True)
    files = set(os.listdir(first.output_dir))
    assert "model.pt" not in files  # the earlier run's model is gone, not presented as this run's
    summary = _summary(first.output_dir)
    assert summary["status"] == "failed" and "diverged" in summary["error"] and summary["seed"] == 3
    assert len(pq.read_table(f"{first.output_dir}/rounds.parquet")) == summary["rounds"] < 4


def _cli(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "raysim.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)


def _wait_for(path: str, proc: subprocess.Popen, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


LONG = {"sync_deadline": ["execution.rounds=60"], "fedbuff": ["execution.max_updates=400"],
        "scaffold": ["execution.rounds=60"], "fedasync": ["execution.max_updates=300"]}


@pytest.mark.parametrize("case", ["sync_deadline", "fedbuff"] + [
    pytest.param(case, marks=pytest.mark.slow) for case in ("fedasync", "scaffold")])
def test_sigkill_of_the_driver_then_resume_equals_uninterrupted(tmp_path, case):
    """The acceptance case end to end: ``raysim run`` in a process of its own, killed with SIGKILL
    after a checkpoint; then ``raysim resume`` (the dead run's lock is stale) ends as the run that
    was never stopped."""
    reference = raysim.run(small_scenario(tmp_path, *CASES[case], *LONG[case], f"output.dir={tmp_path}/reference"))
    overrides = small_overrides(tmp_path, *CASES[case], *LONG[case], "output.checkpoint_every=2")
    cfg = load_scenario(None, overrides)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("name: small\n")
    proc = _cli("run", str(scenario), *overrides, "--quiet")
    try:
        _wait_for(f"{cfg.output.dir}/checkpoint.pt", proc)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert not os.path.exists(f"{cfg.output.dir}/summary.json")  # the driver died: nothing claims it finished
    resumed = subprocess.run([sys.executable, "-m", "raysim.cli", "resume", cfg.output.dir, "--quiet"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _summary(cfg.output.dir)["model_sha256"] == reference.summary["model_sha256"]
    assert _tables(cfg.output.dir) == _tables(reference.output_dir)


def test_a_second_run_into_a_live_directory_is_refused_and_a_killed_runs_lock_is_released(tmp_path):
    overrides = small_overrides(tmp_path, "execution.rounds=100000")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("name: small\n")
    proc = _cli("run", str(scenario), *overrides, "--quiet")
    try:
        _wait_for(f"{tmp_path}/out/rounds.parquet", proc)
        second = subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(scenario), *overrides],
                                capture_output=True, text=True, timeout=120)
        assert proc.poll() is None  # the first run was alive all along
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert second.returncode == 2 and second.stdout == ""
    assert second.stderr.startswith(f"error: output.dir = '{tmp_path}/out': expected a directory no other live run")
    assert len(second.stderr.splitlines()) == 1
    # the killed run's guardian releases its lock (a lock left by a dead process would be stale: test_output)
    deadline = time.monotonic() + 15
    while os.path.exists(f"{tmp_path}/out/.raysim.lock") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"{tmp_path}/out/.raysim.lock")
    third = subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(scenario), *overrides[:-1],
                            "execution.rounds=2", "--quiet", "--replace"], capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert _summary(f"{tmp_path}/out")["status"] == "completed" and not os.path.exists(f"{tmp_path}/out/.raysim.lock")


def test_ctrl_c_as_the_run_completes_leaves_it_complete_and_says_so(tmp_path, monkeypatch, capsys):
    """A signal while the run writes its model and summary waits for them; the line then says the
    run completed (not that nothing can be resumed)."""
    from raysim.cli import main
    from raysim.engine.run import RunLoop

    complete = RunLoop._complete

    def signalled(self, final):
        os.kill(os.getpid(), signal.SIGINT)
        return complete(self, final)

    monkeypatch.setattr(RunLoop, "_complete", signalled)
    monkeypatch.setattr("raysim.lifecycle._stopped_by", [])  # the signal main() takes is this test's only
    monkeypatch.setattr("raysim.lifecycle.guarded", contextlib.nullcontext)  # it would end the test session's Ray
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert main(["run", "scenarios/quickstart.yaml", *small_overrides(tmp_path), "--quiet"]) == 130
    finally:  # main() leaves its handlers, which after a first signal ignore the next ones
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    out = tmp_path / "out"
    assert capsys.readouterr().err.strip() == f"interrupted after the run completed: its results are in {out}"
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert (out / "model.pt").exists() and not (out / "checkpoint.pt").exists()
