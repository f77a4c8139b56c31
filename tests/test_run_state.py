"""The run state: it saves and loads back bit for bit, and a run restored from a saved state goes on
exactly as the run that never stopped (rows, events, final model)."""

from __future__ import annotations

import math
import struct
from dataclasses import fields, is_dataclass, replace

import numpy as np
import pytest
import torch
from conftest import small_scenario
from raysim.algorithms import ServerState
from raysim.data import build_dataset
from raysim.engine.checkpoint import Checkpoint
from raysim.engine.run_state import RunState
from raysim.engine.runtime import LocalRuntime
from raysim.output import OutputDir
from raysim.scenario import scenario_object

STRAGGLERS = ["system.compute.kind=lognormal", "system.compute.slow_fraction=0.1", "system.compute.noise=0.2",
              "system.compute.seconds_per_sample=0.05", "system.dropout=0.05"]
SYNC = ["execution.rounds=4", "eval.every=2"]
FEDBUFF = STRAGGLERS + ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=4",
                        "execution.concurrency=6", "execution.max_updates=40", "eval.every=3"]
FEDASYNC = STRAGGLERS + ["execution.mode=async", "execution.concurrency=6", "execution.max_updates=25",
                         "execution.staleness.kind=polynomial", "algorithm.server_lr=0.3", "eval.every=5"]
WALL_COLUMNS = {"rounds": ("wall_time", "updates_per_second", "eval_seconds"),
                "events": ("compute_seconds", "actor", "node")}


def _scheduler(cfg):
    """A fresh Scheduler of ``cfg`` on a fresh in-process runtime."""
    scenario = scenario_object(cfg)
    runtime = LocalRuntime()
    return runtime.scheduler(scenario, runtime.load(scenario, build_dataset(cfg.data, cfg.seed)))


def _collect(reports: list) -> dict:
    """The rounds rows and event columns of ``advance`` reports, wall-clock columns left out."""
    rounds = [{k: v for k, v in row.items() if k not in WALL_COLUMNS["rounds"]} for r in reports for row in r["rounds"]]
    events = [r["events"] for r in reports if r["events"] is not None]
    columns = {k: np.concatenate([e[k] for e in events]) for k in events[0] if k not in WALL_COLUMNS["events"]}
    return {"rounds": rounds, "events": columns}


def _steps(scheduler, n: int) -> list:
    """Reports of ``n`` driver steps (no wall-time budget: one step per ``advance``)."""
    return [scheduler.advance(0.0) for _ in range(n)]


def _to_end(scheduler) -> list:
    """Reports of ``advance`` until the run is done (it must end without error)."""
    reports = []
    while not scheduler.done:
        reports.append(scheduler.advance(60.0))
        assert reports[-1]["error"] is None
    return reports


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _assert_identical(a, b, where="state"):
    """Same types, same structure, tensors of the same dtype, shape and bytes, floats of the same bits."""
    assert type(a) is type(b), where
    if is_dataclass(a):
        for f in fields(a):
            _assert_identical(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert torch.equal(_bytes(a), _bytes(b)), where
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), where
    else:
        assert a == b, where


def _saved(state: RunState, directory) -> OutputDir:
    """The output directory ``directory`` with ``state`` in its checkpoint.pt, as a run saves it."""
    out = OutputDir.open(str(directory), create=True)
    Checkpoint(state, {}, {}, 0.0).save(out)
    return out


def _round_trip(state: RunState, directory) -> RunState:
    loaded = Checkpoint.load(_saved(state, directory)).state
    _assert_identical(state, loaded)
    return loaded


def _mid_flight(scheduler, buffered: bool) -> list:
    """Reports of driver steps until the asynchronous driver holds what a restore must bring back:
    tasks in flight from several model versions, unsent tasks, a call of which some results were
    used and some are still needed, and (``buffered``) updates in the FedBuff buffer."""
    driver, reports = scheduler.loop, []
    while not scheduler.done:
        reports.append(scheduler.advance(0.0))
        partly_used = any(c.remaining < len(c.task.client_ids) for c in driver.calls.values())
        if (partly_used and driver.unsent and (driver.buffer or not buffered)
                and len({e.data.version for e in driver.queue.events()}) > 1):
            return reports
    pytest.fail("the run never reached the state to test")


# ------------------------------------------------------------------ save and load


def test_sync_fedavg_state_round_trips(tmp_path):
    scheduler = _scheduler(small_scenario(tmp_path, *SYNC))
    _steps(scheduler, 2)
    state = scheduler.run_state()
    assert state.version == 2 and state.counter == 2 and state.applied == 24 and state.loop == {}
    assert not math.isnan(state.last_eval["test_accuracy"])
    loaded = _round_trip(state, tmp_path)
    assert loaded.server.params.dtype == torch.float32


@pytest.mark.parametrize("algorithm", ["scaffold", "feddyn"])
def test_stateful_algorithm_state_round_trips(tmp_path, algorithm):
    scheduler = _scheduler(small_scenario(tmp_path, *SYNC, f"algorithm.name={algorithm}"))
    _steps(scheduler, 2)
    state = scheduler.run_state()
    assert len(state.client_state) > 12  # two rounds of 12 clients, some drawn twice
    kept = next(iter(state.client_state.values()))
    assert all(t.abs().sum() > 0 for t in kept.values())
    assert state.server.extra and all(t.abs().sum() > 0 for t in state.server.extra.values())
    _round_trip(state, tmp_path)


def test_async_fedbuff_state_round_trips_with_tasks_in_flight(tmp_path):
    scheduler = _scheduler(small_scenario(tmp_path, *FEDBUFF))
    _mid_flight(scheduler, buffered=True)
    state = scheduler.run_state()
    driver = state.loop
    assert driver["started"] and len(driver["in_flight"]) == 6 and driver["calls"]
    assert int(driver["busy"].sum()) == 6 and driver["busy"].dtype == torch.bool
    assert set(driver["payloads"]) == {r["version"] for r in driver["in_flight"]} | {
        v for task in driver["calls"].values() for v in task["versions"]}
    packed = driver["buffer"][0][0]
    assert packed["arrays"]["client_ids"].dtype == torch.int64 and packed["arrays"]["train_loss"].dtype == torch.float64
    _round_trip(state, tmp_path)


def test_loading_reads_plain_content_only(tmp_path):
    torch.save({"server": ServerState(torch.zeros(2))}, tmp_path / "checkpoint.pt")  # a class, not plain content
    with pytest.raises(Exception, match="weights_only"):
        Checkpoint.load(OutputDir.open(str(tmp_path)))


# ------------------------------------------------------------------ restore and continue


def _restored_run_is_the_same_run(tmp_path, cfg, reach) -> RunState:
    """Run ``cfg`` straight through; run it again, stopping where ``reach(scheduler)`` stops, save the
    run state to a file, restore it into a fresh scheduler and finish: the same rows, events and final
    model. The stopped scheduler, continued, finishes the same too. Returns the saved state."""
    reference = _scheduler(cfg)
    straight = _collect(_to_end(reference))
    first = _scheduler(cfg)
    head = reach(first)
    state = first.run_state()
    out = _saved(state, tmp_path)
    resumed = _scheduler(cfg)
    resumed.restore(Checkpoint.load(out).state)
    expected = reference.finish()["model_sha256"]
    for scheduler in (resumed, first):
        again = _collect(head + _to_end(scheduler))
        assert again["rounds"] == straight["rounds"]
        assert again["events"].keys() == straight["events"].keys()
        for k, column in straight["events"].items():
            np.testing.assert_array_equal(again["events"][k], column, err_msg=k)
        assert scheduler.finish()["model_sha256"] == expected
    return state


def test_sync_fedavg_restored_run_is_the_same_run(tmp_path):
    state = _restored_run_is_the_same_run(tmp_path, small_scenario(tmp_path, *SYNC), lambda s: _steps(s, 2))
    assert state.version == 2 and state.loop == {} and not state.done


@pytest.mark.parametrize("algorithm", ["scaffold", "feddyn"])
def test_stateful_restored_run_is_the_same_run_and_needs_the_client_states(tmp_path, algorithm):
    cfg = small_scenario(tmp_path, *SYNC, f"algorithm.name={algorithm}")
    state = _restored_run_is_the_same_run(tmp_path, cfg, lambda s: _steps(s, 2))
    complete, forgetful = _scheduler(cfg), _scheduler(cfg)
    complete.restore(state)
    forgetful.restore(replace(state, client_state={}))
    _to_end(complete)
    _to_end(forgetful)
    assert complete.finish()["model_sha256"] != forgetful.finish()["model_sha256"]


@pytest.mark.parametrize("algorithm", ["fedavg", "feddyn"])
def test_async_fedbuff_restored_run_is_the_same_run(tmp_path, algorithm):
    state = _restored_run_is_the_same_run(tmp_path, small_scenario(tmp_path, *FEDBUFF, f"algorithm.name={algorithm}"),
                                          lambda s: _mid_flight(s, buffered=True))
    assert 0 < len(state.loop["buffer"]) < 4 and state.loop["calls"] and state.applied < 40
    if algorithm == "feddyn":  # calls are re-sent with the client states they were sent with
        sent = [k for task in state.loop["calls"].values() for k in task["states"] if k is not None]
        assert state.client_state and sent


def test_async_fedasync_restored_run_is_the_same_run(tmp_path):
    state = _restored_run_is_the_same_run(tmp_path, small_scenario(tmp_path, *FEDASYNC),
                                          lambda s: _mid_flight(s, buffered=False))
    assert state.loop["calls"] and state.applied < 25


def test_advance_stops_at_the_checkpoint_version_also_inside_windows(tmp_path, monkeypatch):
    """``advance(..., stop_version)`` ends exactly at that server version (where the driver takes a
    checkpoint), although the asynchronous driver handles windows of completions at once."""
    from raysim.engine.asynchronous import AsyncUpdates

    windows, handle = [], AsyncUpdates._handle_window
    monkeypatch.setattr(AsyncUpdates, "_handle_window", lambda self, window: windows.append(len(window))
                        or handle(self, window))
    scheduler = _scheduler(small_scenario(tmp_path, *STRAGGLERS, "execution.mode=async", "execution.concurrency=30",
                                          "execution.max_updates=200", "data.num_clients=100"))
    versions = []
    while not scheduler.done:
        versions.append(scheduler.advance(60.0, stop_version=(len(versions) + 1) * 7)["version"])
    assert versions[:-1] == [7 * (i + 1) for i in range(len(versions) - 1)] and versions[-1] == 200
    assert sum(windows) > 100


@pytest.mark.parametrize("algorithm", ["fedavg", "fedavgm", "fedacg"])
@pytest.mark.parametrize("chunked", [False, True])
def test_server_steps_taken_together_are_the_one_at_a_time_states(tmp_path, monkeypatch, algorithm, chunked):
    """A window of FedAsync steps aggregates its updates at once (in chunks for large models); each
    state is the one :meth:`Algorithm.server_update` gives one step after the other."""
    from raysim.algorithms import base

    scheduler = _scheduler(small_scenario(tmp_path, *FEDASYNC, f"algorithm.name={algorithm}"))
    algo, state = scheduler.algorithm, scheduler.state
    assert algo.server_rule(state)[1].rowwise == (algorithm == "fedavg")  # FedAvg's steps are taken at once too
    size = algo.update_size()
    if chunked:
        monkeypatch.setattr(base, "AGGREGATED_AT_ONCE", 3 * size)  # chunks of three steps
    rows = torch.randn(7, size, generator=torch.Generator().manual_seed(0))
    steps = [(base.ClientUpdates(np.array([i]), np.array([10]), np.array([0.5]), rows[i:i + 1]), np.array([w]))
             for i, w in enumerate([1.0, 0.5, 0.25, 1 / 3, 0.2, 1.0, 0.7])]
    together = algo.server_updates(state, steps)
    assert len(together) == len(steps)
    for (updates, weights), got in zip(steps, together):
        state = algo.server_update(state, updates, weights)
        _assert_identical(got, state)
