"""Virtual time: round policies, asynchronous FedAsync/FedBuff, stop conditions, outputs, reports."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import small_scenario

from raysim.cli import main
from raysim.scenario import load_scenario
from raysim.engine.asynchronous import staleness_weight
from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.engine.sync import round_policy
from raysim.errors import NoClientAvailable, ScenarioError

STRAGGLERS = ["system.compute.kind=lognormal", "system.compute.sigma=1.0", "system.compute.slow_fraction=0.1",
              "system.compute.seconds_per_sample=0.05"]


def _run(cfg):
    return run_scenario(prepare(cfg), LocalRuntime())


def _events(tmp_path):
    return pq.read_table(tmp_path / "out/events.parquet").to_pydict()


def _rounds(tmp_path):
    return pq.read_table(tmp_path / "out/rounds.parquet").to_pydict()


def test_round_policy_wait_all_deadline_over_selection():
    d = np.array([5.0, 1.0, 3.0, 9.0])
    ids = np.arange(4)
    none = np.zeros(4, bool)
    kept, late, dropped, end = round_policy(d, none, np.full(4, np.nan), ids, 4, None)
    assert kept.all() and end == 9.0
    kept, late, dropped, end = round_policy(d, none, np.full(4, np.nan), ids, 4, 4.0)
    assert kept.tolist() == [False, True, True, False] and late.tolist() == [True, False, False, True]
    assert end == 4.0  # the server waited until the deadline
    kept, late, dropped, end = round_policy(d, none, np.full(4, np.nan), ids, 2, None)  # over-selection: keep 2
    assert kept.tolist() == [False, True, True, False] and dropped.tolist() == [True, False, False, True]
    assert end == 3.0  # the 2nd arrival
    failed = np.array([False, False, False, True])
    kept, late, dropped, end = round_policy(d, failed, np.array([np.nan, np.nan, np.nan, 7.0]), ids, 4, None)
    assert kept.tolist() == [True, True, True, False] and end == 7.0  # learnt of the failure at 7


def test_staleness_weights():
    from omegaconf import OmegaConf

    from raysim.scenario import StalenessConfig

    poly = OmegaConf.structured(StalenessConfig(kind="polynomial", a=0.5))
    hinge = OmegaConf.structured(StalenessConfig(kind="hinge", a=2.0, b=3.0))
    assert staleness_weight(OmegaConf.structured(StalenessConfig()), 7) == 1.0
    assert staleness_weight(poly, 3) == pytest.approx(0.5)
    assert staleness_weight(hinge, 3) == 1.0 and staleness_weight(hinge, 5) == pytest.approx(1 / 5)


def test_deadline_discards_late_updates_and_bounds_round_time(tmp_path):
    summary = _run(small_scenario(tmp_path, *STRAGGLERS, "execution.deadline=8.0", "execution.rounds=5"))
    ev, rounds = _events(tmp_path), _rounds(tmp_path)
    late = [s == "late" for s in ev["status"]]
    assert any(late) and summary["tasks"]["late"] == sum(late)
    durations = np.array(ev["virtual_end"]) - np.array(ev["virtual_start"])
    assert (durations[np.array(late)] > 8.0).all()
    assert (durations[np.array(ev["status"]) == "applied"] <= 8.0).all()
    steps = np.diff([0.0] + rounds["virtual_time"])
    assert (steps <= 8.0 + 1e-9).all() and np.isclose(steps.max(), 8.0)
    late_rows = [a for a, s in zip(ev["actor"], ev["status"]) if s == "late"]
    assert set(late_rows) == {-1}  # discarded updates were never computed
    assert sum(rounds["late"]) == summary["tasks"]["late"]


def test_over_selection_keeps_the_earliest(tmp_path):
    _run(small_scenario(tmp_path, *STRAGGLERS, "execution.over_selection=1.5", "execution.rounds=3"))
    ev, rounds = _events(tmp_path), _rounds(tmp_path)
    for r in (1, 2, 3):
        rows = [(e - s, st) for rr, s, e, st in zip(ev["round"], ev["virtual_start"], ev["virtual_end"], ev["status"])
                if rr == r]
        assert len(rows) == 18  # ceil(1.5 * 12)
        kept = sorted(d for d, st in rows if st == "applied")
        dropped = [d for d, st in rows if st == "dropped"]
        assert len(kept) == 12 and len(dropped) == 6 and max(kept) <= min(dropped)
    assert rounds["clients"] == [12, 12, 12]


def test_events_carry_virtual_time_and_profile(tmp_path):
    _run(small_scenario(tmp_path, *STRAGGLERS, "system.network.kind=constant"))
    ev = _events(tmp_path)
    for col in ["virtual_start", "virtual_end", "model_version", "staleness", "status", "speed", "down_mbps",
                "latency_s"]:
        assert col in ev
    assert all(e > s for s, e in zip(ev["virtual_start"], ev["virtual_end"]))
    assert len(set(ev["speed"])) > 1


@pytest.mark.parametrize("aggregation", ["fedasync", "fedbuff"])
def test_async_applies_in_virtual_time_order_with_staleness(tmp_path, aggregation):
    summary = _run(small_scenario(tmp_path, *STRAGGLERS, "execution.mode=async", "execution.concurrency=6",
                                  f"execution.aggregation={aggregation}",
                                  *(["execution.buffer_size=3"] if aggregation == "fedbuff" else []),
                                  "execution.max_updates=30", "eval.every=5", "algorithm.server_lr=0.3"))
    ev, rounds = _events(tmp_path), _rounds(tmp_path)
    assert summary["client_updates"] == 30 and summary["tasks"] == {"applied": 30}
    assert ev["virtual_end"] == sorted(ev["virtual_end"])  # applied in virtual-time order
    versions = {"fedasync": 30, "fedbuff": 10}[aggregation]
    assert summary["server_steps"] == versions and len(rounds["round"]) == versions
    # staleness = server version when it arrived - version the client started from; `round` is
    # the server step the update belongs to
    assert [r - 1 - m for r, m in zip(ev["round"], ev["model_version"])] == ev["staleness"]
    assert max(ev["staleness"]) > 0
    assert summary["final_test_accuracy"] is not None


@pytest.mark.parametrize("overrides", [
    ["execution.concurrency=30", "system.dropout=0.2", "system.availability.kind=bernoulli",
     "system.availability.p=0.5"],
    ["execution.concurrency=12", "execution.aggregation=fedbuff", "execution.buffer_size=4",
     "execution.max_staleness=6"],
    # the run stops at a virtual time, or at an evaluation: windows end before either
    ["execution.concurrency=30", "execution.max_virtual_time=80", "execution.max_updates=null"],
    ["execution.concurrency=30", "execution.target_accuracy=0.5", "eval.every=7"],
    # few clients available: slots often stay free, and the next dispatches fill several at once
    ["execution.concurrency=30", "data.num_clients=40", "system.availability.kind=bernoulli",
     "system.availability.p=0.6"],
])
def test_dispatches_drawn_ahead_are_the_one_at_a_time_draws(tmp_path, monkeypatch, overrides):
    """The async driver draws the next completions' dispatches ahead (clients, task draws and
    timings) and handles windows of completions at once; the run is the one in which every
    dispatch is drawn when its completion is handled, one completion at a time."""
    from raysim.engine.asynchronous import AsyncUpdates

    cfg = small_scenario(tmp_path / "ahead", *STRAGGLERS, "execution.mode=async", "execution.max_updates=300",
                         "data.num_clients=100", "eval.every=50", "algorithm.server_lr=0.3", *overrides)
    plans, windows, plan, handle = [], [], AsyncUpdates._plan, AsyncUpdates._handle_window
    monkeypatch.setattr(AsyncUpdates, "_plan", lambda self, completions, in_flight:
                        plans.append((len(self.ahead), len(completions))) or plan(self, completions, in_flight))
    monkeypatch.setattr(AsyncUpdates, "_handle_window", lambda self, window:
                        windows.append(len(window)) or handle(self, window))
    ahead = _run(cfg)
    ahead_events = _events(tmp_path / "ahead")
    # plans were used past their first entry, and some were dropped when a new task ended first
    assert len(plans) < 300 and max(size for _, size in plans) > 8 and any(left for left, _ in plans)
    assert sum(windows) > 30 and all(size >= 2 for size in windows)
    monkeypatch.setattr(AsyncUpdates, "_planned", lambda self, after: None)
    monkeypatch.setattr(AsyncUpdates, "_window", lambda self: [])
    cfg.output.dir = str(tmp_path / "alone/out")
    alone = _run(cfg)
    alone_events = _events(tmp_path / "alone")
    assert ahead["model_sha256"] == alone["model_sha256"] and ahead["virtual_time"] == alone["virtual_time"]
    for column in ("client_id", "actor", "virtual_start", "virtual_end", "model_version", "staleness", "status"):
        assert ahead_events[column] == alone_events[column], column
    ahead_rounds, alone_rounds = _rounds(tmp_path / "ahead"), _rounds(tmp_path / "alone")
    for column in ("round", "virtual_time", "train_loss", "test_accuracy", "clients"):
        assert ahead_rounds[column] == alone_rounds[column], column


def test_an_update_that_diverges_inside_a_window_ends_the_run_as_one_at_a_time(tmp_path, monkeypatch):
    """A FedAsync window takes its server steps together once its updates are in; an update that
    diverges in the middle of one first has the steps before it taken and logged, so the failed
    run leaves the rows, the error and the model version of the one-at-a-time loop."""
    from raysim.engine.asynchronous import AsyncUpdates
    from raysim.errors import DivergenceError

    overrides = [*STRAGGLERS, "execution.mode=async", "execution.max_updates=300", "data.num_clients=100",
                 "execution.concurrency=30", "eval.every=0", "eval.curvature=true",
                 "algorithm.lr=5", "algorithm.server_lr=1.0"]
    diverged_in_window, apply = [], AsyncUpdates._apply

    def watched(self, *args):
        waiting = self.deferred is not None and len(self.deferred)
        try:
            return apply(self, *args)
        except DivergenceError:
            diverged_in_window.append(waiting)
            raise

    monkeypatch.setattr(AsyncUpdates, "_apply", watched)
    with pytest.raises(DivergenceError) as windowed:
        _run(small_scenario(tmp_path / "window", *overrides))
    assert diverged_in_window[0] > 0  # steps of the window were waiting when the update came
    monkeypatch.setattr(AsyncUpdates, "_window", lambda self: [])
    with pytest.raises(DivergenceError) as alone:
        _run(small_scenario(tmp_path / "alone", *overrides))
    assert str(windowed.value) == str(alone.value)
    windowed_rounds, alone_rounds = _rounds(tmp_path / "window"), _rounds(tmp_path / "alone")
    for column in ("round", "virtual_time", "train_loss", "test_accuracy", "clients", "hessian_min_eig"):
        assert windowed_rounds[column] == alone_rounds[column], column
    windowed_events, alone_events = _events(tmp_path / "window"), _events(tmp_path / "alone")
    for column in ("round", "client_id", "virtual_end", "model_version", "staleness", "status", "train_loss"):
        assert windowed_events[column] == alone_events[column], column
    assert windowed_events["status"][-1] == "diverged"

def test_async_max_staleness_drops_and_virtual_time_budget(tmp_path):
    summary = _run(small_scenario(tmp_path, *STRAGGLERS, "execution.mode=async", "execution.concurrency=10",
                                  "execution.max_staleness=2", "execution.max_virtual_time=40",
                                  "algorithm.server_lr=0.2"))
    ev = _events(tmp_path)
    stale = [s for s, st in zip(ev["staleness"], ev["status"]) if st == "stale"]
    assert stale and min(stale) > 2
    assert max(s for s, st in zip(ev["staleness"], ev["status"]) if st == "applied") <= 2
    assert 40 <= summary["virtual_time"] and max(ev["virtual_end"]) >= 40


def test_async_target_accuracy_stops_early(tmp_path):
    summary = _run(small_scenario(tmp_path, "execution.mode=async", "execution.concurrency=4",
                                  "execution.max_updates=5000", "execution.target_accuracy=0.3", "eval.every=5",
                                  "algorithm.server_lr=0.5"))
    assert summary["final_test_accuracy"] >= 0.3 and summary["client_updates"] < 5000


def test_dropout_failures_are_counted_and_never_applied(tmp_path):
    summary = _run(small_scenario(tmp_path, "system.dropout=0.3", "execution.rounds=4"))
    ev = _events(tmp_path)
    failed = [a for a, st in zip(ev["actor"], ev["status"]) if st == "failed"]
    assert failed and set(failed) == {-1} and summary["tasks"]["failed"] == len(failed)


def test_unreliable_agents_change_training_but_not_its_scale(tmp_path):
    plain = _run(small_scenario(tmp_path / "a", "execution.rounds=12"))
    flaky = _run(small_scenario(tmp_path / "b", "execution.rounds=12", "system.unreliable.participation.value=0.5",
                                "system.unreliable.local_steps.kind=uniform_int",
                                "system.unreliable.local_steps.low=2", "system.unreliable.local_steps.high=6"))
    assert plain["model_sha256"] != flaky["model_sha256"]
    assert flaky["final_test_accuracy"] > 0.2  # 1/δ rescaling keeps steps unbiased: still learns


def test_nobody_ever_available_stops_with_a_message(tmp_path):
    import pyarrow as pa

    pq.write_table(pa.table({"client_id": [0], "start": [0.0], "end": [1.0]}), tmp_path / "avail.parquet")
    cfg = small_scenario(tmp_path, "system.availability.kind=trace", f"system.availability.path={tmp_path}/avail.parquet",
                         "execution.clients_per_round=1", "execution.rounds=50", "system.compute.seconds_per_sample=1")
    with pytest.raises(NoClientAvailable, match="no client is available and none will ever be"):
        _run(cfg)
    assert pq.read_table(tmp_path / "out/rounds.parquet").num_rows >= 1


def test_diurnal_availability_only_samples_online_clients(tmp_path):
    _run(small_scenario(tmp_path, "system.availability.kind=diurnal", "system.availability.period=100",
                        "system.availability.on_fraction=0.3", "execution.clients_per_round=4",
                        "system.compute.seconds_per_sample=0.2", "execution.rounds=6"))
    from raysim.system import SystemModel

    cfg = small_scenario(tmp_path, "system.availability.kind=diurnal", "system.availability.period=100",
                         "system.availability.on_fraction=0.3")
    system = SystemModel(cfg.system, 40, 0)
    ev = _events(tmp_path)
    for c, t in zip(ev["client_id"], ev["virtual_start"]):
        assert system.available(np.array([c]), t, 0)[0]


@pytest.mark.parametrize("overrides, key", [
    (["execution.mode=async"], "execution.max_updates"),
    (["execution.aggregation=fedsgd"], "execution.aggregation"),
    (["execution.over_selection=0.5"], "execution.over_selection"),
    (["execution.deadline=-1"], "execution.deadline"),
    (["execution.staleness.kind=exp"], "execution.staleness.kind"),
    (["system.compute.kind=weibull"], "system.compute.kind"),
    (["system.dropout=1.5"], "system.dropout"),
    (["system.compute.speed=0", "system.compute.kind=constant"], "system.compute.speed"),
    (["system.network.kind=constant", "system.network.down_mbps=-3"], "system.network.down_mbps"),
    (["system.availability.kind=bernoulli", "system.availability.p=0"], "system.availability.p"),
])
def test_bad_system_and_execution_input(overrides, key):
    with pytest.raises(ScenarioError) as info:
        load_scenario("scenarios/quickstart.yaml", overrides)
    assert str(info.value).startswith(key)


def test_report_command_writes_plots(tmp_path, capsys):
    _run(small_scenario(tmp_path / "a", *STRAGGLERS, "execution.mode=async", "execution.max_updates=20",
                        "algorithm.server_lr=0.2"))
    _run(small_scenario(tmp_path / "b", *STRAGGLERS, "execution.deadline=5"))
    assert main(["report", str(tmp_path / "a/out"), str(tmp_path / "b/out"), "--out", str(tmp_path / "plots")]) == 0
    written = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"accuracy_vs_virtual_time.png", "accuracy_vs_wall_time.png", "staleness_histogram.png",
            "participation_per_client.png", "timeline.png"} <= written
    assert json.loads((tmp_path / "a/out/summary.json").read_text())["mode"] == "async"
    capsys.readouterr()
    assert main(["report", str(tmp_path / "b/out"), "--out", str(tmp_path / "plots"), "--target", "0.99"]) == 0
    table = capsys.readouterr().out.splitlines()[-1]
    late = json.loads((tmp_path / "b/out/summary.json").read_text())["tasks"].get("late", 0)
    assert table.startswith("| small | not reached |") and f"| {late} |" in table
