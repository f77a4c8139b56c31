"""Ditto: its personal step computed by hand in numpy (logistic regression), its global model
FedAvg's to the byte, personalized evaluation of the kept personal models, the work a task
declares, and its bad-input lines."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import (HAND_CLASSES, HAND_CLIENTS, HAND_FEATURES, HAND_TRAIN, hand_context, logreg_grad,
                      small_scenario)
from test_bad_input import cli, one_error_line

from raysim.algorithms import AlgorithmEnv
from raysim.algorithms.ditto import Ditto
from raysim.algorithms.keys import DittoKeys
from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.streams import Purpose, stream

def test_personal_step_and_upload_by_hand(logreg_clients):
    """Client 0 comes back with a kept v, client 1 visits for the first time (v = w). Each takes 2
    FedAvg steps at lr 0.4 (batches of 3, the first draws of its stream) and sends w − w_k; then 3
    personal steps v ← v − 0.3(∇F(v) + 0.5(v − w)) on the next draws, and keeps v."""
    ds, model, model_cfg = logreg_clients
    keys = DittoKeys(name="ditto", lr=0.4, local_steps=2, batch_size=3, ditto_lambda=0.5, personal_lr=0.3,
                     personal_steps=3)
    algorithm = Ditto(keys, AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w = model.initial_vector().double()
    kept = w + 0.2 * torch.randn(w.numel(), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    updates = algorithm.client_update([{"params": w}] * 2, hand_context(ds, model, states=[{"personal": kept}, None]))

    x, y = ds.features().astype(np.float64), ds.labels()
    for c, (lo, _, _) in enumerate(ds.offsets()[HAND_CLIENTS]):
        rng = stream(0, Purpose.CLIENT_TRAIN, c, 4)
        order = rng.permutation(HAND_TRAIN)  # the FedAvg update's batches: 2 × 3 rows of one pass
        theta = w.numpy().copy()
        for s in range(2):
            rows = lo + order[3 * s:3 * s + 3]
            theta = theta - 0.4 * logreg_grad(theta, x[rows], y[rows])
        np.testing.assert_allclose(updates.vector[c].numpy(), w.numpy() - theta, rtol=0, atol=1e-12)
        order = rng.permutation(HAND_TRAIN)  # then the personal steps' batches: 3 × 3 rows of the next pass
        v = (kept if c == 0 else w).numpy().copy()
        for s in range(3):
            rows = lo + order[3 * s:3 * s + 3]
            v = v - 0.3 * (logreg_grad(v, x[rows], y[rows]) + 0.5 * (v - w.numpy()))
        np.testing.assert_allclose(updates.states["personal"][c].numpy(), v, rtol=0, atol=1e-12)
    assert not torch.allclose(updates.states["personal"][0], updates.states["personal"][1])


def test_personalized_evaluation_tests_each_clients_kept_model(logreg_clients):
    """With no adaptation steps, client 0 is tested at its kept v and client 1 (never sampled) at w;
    with one step, each adapts from that start."""
    ds, model, model_cfg = logreg_clients
    algorithm = Ditto(DittoKeys(name="ditto", batch_size=4), AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w = model.initial_vector().double()
    kept = w + torch.randn(w.numel(), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    states = [{"personal": kept}, None]
    tests = algorithm.personalize([{"params": w}] * 2, hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE),
                                  0, 0, 0.1)
    x, y = ds.features().astype(np.float64), ds.labels()
    for c, (_, lo, hi) in enumerate(ds.offsets()[HAND_CLIENTS]):
        theta = (kept if c == 0 else w).numpy()
        weights = HAND_CLASSES * HAND_FEATURES
        W, b = theta[:weights].reshape(HAND_CLASSES, HAND_FEATURES), theta[weights:]
        assert tests.test_correct[c] == int(((x[lo:hi] @ W.T + b).argmax(1) == y[lo:hi]).sum())
        assert tests.test_rows[c] == hi - lo
    ctx = hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE)
    adapted = algorithm.personalize([{"params": w}] * 2, ctx, 1, 0, 0.1)
    expected = algorithm.finetune_and_test(hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE),
                                           torch.stack([kept, w]), 1, 0, 0.1)
    np.testing.assert_array_equal(adapted.test_loss_sum, expected.test_loss_sum)


def _run(cfg):
    runtime = LocalRuntime()
    try:
        return run_scenario(prepare(cfg), runtime)
    finally:
        runtime.close()


def test_the_global_model_is_fedavgs_and_personal_models_are_evaluated(tmp_path):
    """λ and the personal steps never reach the server: Ditto's global model is FedAvg's to the
    byte; its personalized accuracy (of the kept models, no adaptation) is logged at each evaluation
    and the personal models beat the global one on this non-iid mixture."""
    common = ["execution.rounds=6", "execution.clients_per_round=20", "algorithm.local_steps=5", "eval.every=3"]
    fedavg = _run(small_scenario(tmp_path / "fedavg", *common))
    ditto = _run(small_scenario(tmp_path / "ditto", *common, "algorithm.name=ditto", "algorithm.ditto_lambda=0.05",
                                "algorithm.personal_steps=10"))
    assert ditto["model_sha256"] == fedavg["model_sha256"]
    assert ditto["final_test_accuracy"] == fedavg["final_test_accuracy"]
    rows = pq.read_table(tmp_path / "ditto/out/rounds.parquet").to_pylist()
    evaluated = [r for r in rows if r["round"] in (3, 6)]
    assert all(0 < r["personalized_accuracy"] <= 1 for r in evaluated)
    assert ditto["final_personalized_accuracy"] > ditto["final_test_accuracy"]
    assert fedavg["final_personalized_accuracy"] is None  # FedAvg without personalized steps: not evaluated


def test_a_task_declares_both_kinds_of_steps(logreg_clients):
    ds, model, model_cfg = logreg_clients
    sizes, none = np.array([5, 50]), np.zeros(2)
    twice = Ditto(DittoKeys(name="ditto", local_steps=4, batch_size=8), AlgorithmEnv(model, model_cfg, 2, 0))
    assert twice.work(sizes, none, {}).tolist() == [2 * 4 * 5, 2 * 4 * 8]
    assert twice.work(sizes, np.array([2, 0]), {}).tolist() == [2 * 2 * 5, 2 * 4 * 8]  # E_k: both kinds
    own = Ditto(DittoKeys(name="ditto", local_steps=4, batch_size=8, personal_steps=1),
                AlgorithmEnv(model, model_cfg, 2, 0))
    assert own.work(sizes, none, {}).tolist() == [4 * 5 + 5, 4 * 8 + 8]
    epochs = Ditto(DittoKeys(name="ditto", local_epochs=3), AlgorithmEnv(model, model_cfg, 2, 0))
    assert epochs.work(sizes, none, {}).tolist() == [2 * 15, 2 * 150]
    assert twice.upload_size({}) == model.size  # only the FedAvg update is sent


@pytest.mark.parametrize("overrides, line", [
    (["model.personal=output_layer"], "model.personal = 'output_layer': expected none for algorithm.name=ditto "
                                      "(each client's personal model is a whole model)"),
    (["algorithm.ditto_lambda=-1"], "algorithm.ditto_lambda = -1.0: expected a number >= 0"),
    (["algorithm.personal_steps=0"], "algorithm.personal_steps = 0: expected a positive integer"),
    (["algorithm.personal_lr=0"], "algorithm.personal_lr = 0.0: expected a number > 0"),
    (["data.kind=quadratic", "model.kind=quadratic", "~model.hidden", "~model.activation", "~algorithm.batch_size",
      "~algorithm.local_epochs", "algorithm.local_steps=2", "~eval.personalized_steps"],
     "data.kind = 'quadratic': expected a data set of rows for algorithm.name=ditto (its personal models are "
     "judged by personalized evaluation, which the quadratic problem does not have)"),
])
def test_bad_input_is_one_line(capsys, tmp_path, overrides, line):
    from raysim.cli import main

    assert main(["validate", "scenarios/quickstart.yaml", "algorithm.name=ditto", f"output.dir={tmp_path}/out",
                 *overrides]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"


def test_a_split_model_is_refused_before_ray_starts(tmp_path):
    proc = cli("run", "scenarios/quickstart.yaml", "algorithm.name=ditto", "model.personal=input_layer",
               f"output.dir={tmp_path}/out")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr) == ("error: model.personal = 'input_layer': expected none for "
                                           "algorithm.name=ditto (each client's personal model is a whole model)")
    assert not (tmp_path / "out").exists()
