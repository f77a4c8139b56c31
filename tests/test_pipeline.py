"""The server step as one pipeline of stages, and the client's stages before upload: stages are
pure, their states live in the run state, a window of FedAsync steps is the steps one at a time,
and what a client stage does reaches the server and the virtual upload time."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import small_scenario

import raysim
from raysim.algorithms import ClientUpdates
from raysim.data import build_dataset
from raysim.engine.asynchronous import AsyncUpdates
from raysim.engine.runtime import LocalRuntime
from raysim.pipeline import build, per_client
from raysim.pipeline.attack import ByzantineAttack
from raysim.pipeline.client import ClientStage
from raysim.pipeline.momentum import ClientMomentum
from raysim.pipeline.stage import AggregateStage, ServerInput
from raysim.scenario import scenario_object

FEDASYNC = ["execution.mode=async", "execution.concurrency=6", "execution.max_updates=12"]


def _scheduler(cfg):
    scenario = scenario_object(cfg)
    runtime = LocalRuntime()
    return runtime.scheduler(scenario, runtime.load(scenario, build_dataset(cfg.data, cfg.seed)))


def _updates(ids, rows) -> ClientUpdates:
    ids = np.asarray(ids)
    return ClientUpdates(ids, np.full(len(ids), 10), np.full(len(ids), 0.5), rows)


def test_the_pipeline_holds_the_stages_the_scenario_asks_for(tmp_path):
    """Client momentum, then the attack, then the algorithm's step; a FedAsync window is taken at
    once exactly when no stage acts on the updates and the aggregator is the mean."""
    def pipeline(*overrides):
        return _scheduler(small_scenario(tmp_path, *FEDASYNC, *overrides)).server.pipeline

    plain = pipeline()
    assert plain.stages == () and plain.takes_steps_together
    both = pipeline("algorithm.client_momentum=0.5", "system.byzantine.fraction=0.2", "system.byzantine.attack=ipm",
                    "system.byzantine.window=4")
    assert [type(s) for s in both.stages] == [ClientMomentum, ByzantineAttack] and not both.takes_steps_together
    assert both.stages[1].window == 4
    assert not pipeline("algorithm.aggregator=median", "execution.aggregation=fedbuff",
                        "execution.buffer_size=4").takes_steps_together
    assert pipeline("system.byzantine.fraction=0.2", "system.byzantine.attack=label_flip").stages == ()


def test_stages_are_pure_and_a_run_of_steps_is_the_steps_one_at_a_time(tmp_path):
    scheduler = _scheduler(small_scenario(tmp_path, *FEDASYNC, "algorithm.client_momentum=0.5"))
    pipeline, server, states = scheduler.server.pipeline, scheduler.state, scheduler.server.stage_states
    size = scheduler.algorithm.update_size()
    rows = torch.randn(4, size, generator=torch.Generator().manual_seed(0))
    steps = [(_updates([c], rows[i:i + 1]), np.array([1.0])) for i, c in enumerate([3, 5, 3, 7])]
    servers, after = pipeline.steps(server, states, steps, 0)
    assert states == {"client_momentum": {"vectors": {}}}  # the states passed in are left as they were
    one, kept = server, states
    for (updates, weights), got in zip(steps, servers):
        one, kept = pipeline.step(one, kept, updates, weights, 0)
        assert torch.equal(got.params, one.params)
    assert sorted(after["client_momentum"]["vectors"]) == [3, 5, 7]
    moved = after["client_momentum"]["vectors"][3]  # 0.5 · (0.5 · u_0) + 0.5 · u_2
    assert torch.allclose(moved, 0.25 * rows[0] + 0.5 * rows[2])


def test_the_attack_window_is_the_last_honest_updates(tmp_path):
    scheduler = _scheduler(small_scenario(tmp_path, *FEDASYNC, "system.byzantine.fraction=0.2",
                                          "system.byzantine.attack=ipm", "system.byzantine.window=2"))
    stage = scheduler.server.pipeline.stages[0]
    byzantine = np.flatnonzero(stage.byzantine)
    honest = np.flatnonzero(~stage.byzantine)
    state, size = stage.init(), scheduler.algorithm.update_size()
    for i, c in enumerate(honest[:3]):
        _, state = stage.update(ServerInput(_updates([c], torch.full((1, size), float(i))), np.ones(1), i), state)
    assert [float(t[0]) for t in state["seen"]] == [1.0, 2.0]
    sent, after = stage.update(ServerInput(_updates([byzantine[0]], torch.ones(1, size)), np.ones(1), 3), state)
    epsilon = scheduler.cfg.system.byzantine.epsilon
    assert torch.allclose(sent.updates.vector[0].double(), torch.full((size,), -epsilon * 1.5, dtype=torch.float64))
    assert after["seen"] == state["seen"]  # a Byzantine update is never seen as honest


class Halve(ClientStage):
    """A client stage of this test: the update halved, uploaded in a quarter of the bytes."""

    name = "halve"

    def update(self, updates, ctx, payloads):
        updates.vector = updates.vector / 2
        return updates

    def upload_bytes(self, nbytes, values):
        return nbytes // 4


def test_a_client_stage_changes_what_the_server_sees_and_the_upload_time(tmp_path, monkeypatch):
    (tmp_path / "seen_rows.py").write_text("import torch\nSEEN = {}\n"
                                           "def frozen(updates, weights, run):\n"
                                           "    SEEN.setdefault(run, []).append(updates.clone())\n"
                                           "    return torch.zeros(updates.shape[1], dtype=torch.float64)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    keys = ["execution.rounds=2", "system.network.kind=constant", "system.network.up_mbps=0.01"]
    times = {}
    for run in ("raw", "halved"):
        if run == "halved":
            monkeypatch.setattr(build, "client_stages", lambda cfg: (Halve(),))
        result = raysim.run(small_scenario(tmp_path / run, *keys, "algorithm.aggregator=seen_rows:frozen",
                                           f"algorithm.aggregator_options={{run: {run}}}"))
        times[run] = result.summary["virtual_time"]
    import seen_rows

    for raw, halved in zip(seen_rows.SEEN["raw"], seen_rows.SEEN["halved"]):
        assert torch.equal(halved, raw / 2)
    assert times["halved"] < times["raw"]


class Shift(AggregateStage):
    """An aggregate stage of this test: adds ``vector`` to every step's aggregate, counting the steps
    in its state."""

    name = "shift"

    def __init__(self, vector):
        self.vector = vector

    def init(self):
        return {"steps": 0}

    def update(self, aggregate, state):
        return replace(aggregate, vector=aggregate.vector + self.vector), {"steps": state["steps"] + 1}


@pytest.mark.parametrize("mode", [[], FEDASYNC])
def test_an_aggregate_stage_reaches_the_server_optimizer(tmp_path, monkeypatch, mode):
    """Between the aggregation rule (here one that always gives zero) and the server optimizer
    (SGD at server_lr 0.5), an aggregate stage adding v moves the model by exactly −0.5·v each
    server step, in synchronous rounds and in FedAsync windows; its state is in the run state."""
    (tmp_path / "zero_rule.py").write_text("import torch\n"
                                           "def zero(updates, weights):\n"
                                           "    return torch.zeros(updates.shape[1], dtype=torch.float64)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = small_scenario(tmp_path, *mode, "algorithm.aggregator=zero_rule:zero", "algorithm.server_lr=0.5")
    size = _scheduler(cfg).algorithm.update_size()
    shift = torch.linspace(-1, 1, size, dtype=torch.float64)
    monkeypatch.setattr(build, "aggregate_stages", lambda cfg: (Shift(shift),))
    windows = []
    handle_window = AsyncUpdates._handle_window
    monkeypatch.setattr(AsyncUpdates, "_handle_window",
                        lambda self, w: windows.append(len(w)) or handle_window(self, w))
    scheduler = _scheduler(cfg)
    assert not scheduler.server.pipeline.takes_steps_together
    expected = scheduler.state.params.clone()
    while not scheduler.done:
        scheduler.advance(60.0)
    steps = scheduler.version
    for _ in range(steps):
        expected = (expected.double() - 0.5 * shift).to(expected.dtype)
    assert torch.equal(scheduler.finish()["params"], expected)
    assert scheduler.run_state().pipeline == {"shift": {"steps": steps}}
    assert steps == (3 if not mode else 12) and (not mode or windows)


def test_a_window_of_steps_goes_through_the_aggregate_stages(tmp_path, monkeypatch):
    """Under the mean, an aggregate stage makes :meth:`ServerPipeline.steps` take a window's steps
    one after the other, each through the stage."""
    cfg = small_scenario(tmp_path, *FEDASYNC)
    size = _scheduler(cfg).algorithm.update_size()
    shift = torch.full((size,), 0.25, dtype=torch.float64)
    monkeypatch.setattr(build, "aggregate_stages", lambda cfg: (Shift(shift),))
    scheduler = _scheduler(cfg)
    pipeline, server = scheduler.server.pipeline, scheduler.state
    assert not pipeline.takes_steps_together
    rows = torch.randn(3, size, generator=torch.Generator().manual_seed(0))
    steps = [(_updates([c], rows[i:i + 1]), np.array([1.0])) for i, c in enumerate([3, 5, 3])]
    servers, after = pipeline.steps(server, pipeline.init(), steps, 0)
    assert after == {"shift": {"steps": 3}}
    plain = server
    for (updates, weights), got in zip(steps, servers):
        aggregate = scheduler.algorithm.aggregator(updates.vector, weights, plain.aggregation)[0] + shift
        plain = scheduler.algorithm.server_apply(plain, aggregate, plain.aggregation, updates, weights)
        assert torch.equal(got.params, plain.params)


def test_per_client_state_is_a_persistent_tree_that_copies_only_the_paths_it_sets():
    """Setting some clients' values gives a new tree sharing every node off their paths and leaves
    the old tree as it was; at most FANOUT clients: the tree is {client id: value} itself."""
    assert [per_client.levels_for(n) for n in (1, 64, 65, 4096, 4097)] == [1, 1, 2, 2, 3]
    assert per_client.updated({}, {3: "a", 7: "b"}, 1) == {3: "a", 7: "b"}
    levels = per_client.levels_for(10_000)
    first = per_client.updated({}, {c: c for c in range(0, 10_000, 7)}, levels)
    second = per_client.updated(first, {5: -5, 9_999: -1, 7: -7}, levels)
    assert [per_client.value_of(first, c, levels) for c in (5, 7, 9_999, 14)] == [None, 7, None, 14]
    assert [per_client.value_of(second, c, levels) for c in (5, 7, 9_999, 14, 6)] == [-5, -7, -1, 14, None]
    assert second[0][0] is not first[0][0] and second[1] is first[1]  # client 4096 + …: untouched, shared
    assert sum(1 for top in first.values() for mid in top.values() for _ in mid) == len(range(0, 10_000, 7))


def test_client_momentum_with_many_clients_keeps_each_clients_running_average():
    """Beyond FANOUT clients the momentum of a client is found in the tree and moves as m ← (1 − β)·u + β·m,
    a client twice in one step (a FedBuff buffer) taken row by row."""
    stage, size = ClientMomentum(0.5, 5000), 3
    rows = torch.arange(12, dtype=torch.float32).reshape(4, size)
    step = ServerInput(_updates([4000, 4000, 17, 4999], rows), np.full(4, 0.25), 0)
    sent, state = stage.update(step, stage.init())
    assert torch.equal(sent.updates.vector[1], 0.5 * rows[1] + 0.5 * (0.5 * rows[0]))
    again, after = stage.update(ServerInput(_updates([17], rows[:1]), np.ones(1), 1), state)
    assert torch.equal(again.updates.vector[0], 0.5 * rows[0] + 0.5 * (0.5 * rows[2]))
    assert torch.equal(per_client.value_of(state["vectors"], 17, stage.levels), sent.updates.vector[2])
    assert torch.equal(per_client.value_of(after["vectors"], 4000, stage.levels), sent.updates.vector[1])
