"""APFL: its joint step (w, v and α) computed by hand in numpy (logistic regression), α's clipping
and the fixed-α variant, its global model FedAvg's to the byte, personalized evaluation of the
mixture α_k·v_k + (1 − α_k)·w, the work a task declares, and its bad-input lines."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import (HAND_CLASSES, HAND_CLIENTS, HAND_FEATURES, HAND_TRAIN, hand_context, logreg_grad,
                      small_scenario)
from test_bad_input import cli, one_error_line

import raysim
from raysim.algorithms import AlgorithmEnv
from raysim.algorithms.apfl import APFL
from raysim.algorithms.keys import APFLKeys
from raysim.streams import Purpose, stream


def _start(model):
    """The server's w, and client 0's kept v (client 1 visits for the first time)."""
    w = model.initial_vector().double()
    return w, w + 0.3 * torch.randn(w.numel(), generator=torch.Generator().manual_seed(9), dtype=torch.float64)


@pytest.mark.parametrize("alpha_lr, adaptive", [(0.3, True), (40.0, True), (0.3, False)])
def test_joint_step_by_hand(logreg_clients, alpha_lr, adaptive):
    """Client 0 comes back with a kept v and α = 0.6, client 1 starts from v = w and α = apfl_alpha
    = 0.25. Two local steps at lr 0.4 (batches of 3, the first draws of each stream), each from the
    values before it, on the same batch: w ← w − 0.4∇f(w), v ← v − 0.4α∇f(v̄),
    α ← clip(α − η_α⟨v − w, ∇f(v̄)⟩, 0, 1) (η_α 40: α hits a bound; fixed α: unchanged)."""
    ds, model, model_cfg = logreg_clients
    keys = APFLKeys(name="apfl", lr=0.4, local_steps=2, batch_size=3, apfl_alpha=0.25, alpha_lr=alpha_lr,
                    adaptive_alpha=adaptive)
    algorithm = APFL(keys, AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w0, kept = _start(model)
    states = [{"personal": kept, "alpha": torch.tensor([0.6], dtype=torch.float64)}, None]
    updates = algorithm.client_update([{"params": w0}] * 2, hand_context(ds, model, states=states))

    x, y = ds.features().astype(np.float64), ds.labels()
    alphas = []
    for c, (lo, _, _) in enumerate(ds.offsets()[HAND_CLIENTS]):
        order = stream(0, Purpose.CLIENT_TRAIN, c, 4).permutation(HAND_TRAIN)
        w, v, alpha = w0.numpy().copy(), (kept if c == 0 else w0).numpy().copy(), 0.6 if c == 0 else 0.25
        for s in range(2):
            rows = lo + order[3 * s:3 * s + 3]
            g_w = logreg_grad(w, x[rows], y[rows])
            g_mixed = logreg_grad(alpha * v + (1 - alpha) * w, x[rows], y[rows])
            step_alpha = alpha_lr * float((v - w) @ g_mixed) if adaptive else 0.0
            w, v, alpha = w - 0.4 * g_w, v - 0.4 * alpha * g_mixed, float(np.clip(alpha - step_alpha, 0, 1))
        np.testing.assert_allclose(updates.vector[c].numpy(), w0.numpy() - w, rtol=0, atol=1e-12)
        np.testing.assert_allclose(updates.states["personal"][c].numpy(), v, rtol=0, atol=1e-12)
        np.testing.assert_allclose(updates.states["alpha"][c].numpy(), [alpha], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(updates.diagnostics["apfl_alpha"][c].numpy(), updates.states["alpha"][c].numpy())
        alphas.append(alpha)
    if alpha_lr == 40.0:
        assert alphas[0] in (0.0, 1.0)  # clipped
    if not adaptive:
        assert alphas == [0.6, 0.25]


def test_personalized_evaluation_tests_each_clients_mixture(logreg_clients):
    """With no adaptation steps, client 0 is tested at α·v + (1 − α)·w with the w it receives now
    and client 1 (never sampled) at w."""
    ds, model, model_cfg = logreg_clients
    algorithm = APFL(APFLKeys(name="apfl", batch_size=4), AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w, kept = _start(model)
    states = [{"personal": kept, "alpha": torch.tensor([0.7], dtype=torch.float64)}, None]
    ctx = hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE)
    tests = algorithm.personalize([{"params": w}] * 2, ctx, 0, 0, 0.1)
    x, y = ds.features().astype(np.float64), ds.labels()
    weights = HAND_CLASSES * HAND_FEATURES
    for c, (_, lo, hi) in enumerate(ds.offsets()[HAND_CLIENTS]):
        theta = (0.7 * kept + 0.3 * w if c == 0 else w).numpy()
        W, b = theta[:weights].reshape(HAND_CLASSES, HAND_FEATURES), theta[weights:]
        assert tests.test_correct[c] == int(((x[lo:hi] @ W.T + b).argmax(1) == y[lo:hi]).sum())
        assert tests.test_rows[c] == hi - lo


def test_a_task_declares_two_gradients_a_step(logreg_clients):
    ds, model, model_cfg = logreg_clients
    sizes, none = np.array([5, 50]), np.zeros(2)
    steps = APFL(APFLKeys(name="apfl", local_steps=4, batch_size=8), AlgorithmEnv(model, model_cfg, 2, 0))
    assert steps.work(sizes, none, {}).tolist() == [2 * 4 * 5, 2 * 4 * 8]
    assert steps.work(sizes, np.array([2, 0]), {}).tolist() == [2 * 2 * 5, 2 * 4 * 8]  # E_k
    epochs = APFL(APFLKeys(name="apfl", local_epochs=3), AlgorithmEnv(model, model_cfg, 2, 0))
    assert epochs.work(sizes, none, {}).tolist() == [2 * 15, 2 * 150]
    assert steps.upload_size({}) == model.size  # only the FedAvg update is sent


def test_the_global_model_is_fedavgs_and_the_mixtures_beat_it(tmp_path):
    """v, α and their steps never reach the server: APFL's global model is FedAvg's to the byte.
    Each sampled client's α moves away from apfl_alpha (logged per update), and the mixtures,
    tested as they are, beat the global model on this non-iid mixture."""
    common = ["execution.rounds=10", "execution.clients_per_round=40", "algorithm.local_steps=5", "eval.every=5"]
    fedavg = raysim.run(small_scenario(tmp_path / "fedavg", *common)).summary
    apfl = raysim.run(small_scenario(tmp_path / "apfl", *common, "algorithm.name=apfl", "algorithm.apfl_alpha=0.5",
                                     "algorithm.alpha_lr=0.5")).summary
    assert apfl["model_sha256"] == fedavg["model_sha256"]
    events = pq.read_table(tmp_path / "apfl/out/events.parquet").to_pylist()
    alphas = [e["apfl_alpha"] for e in events if e["status"] == "applied"]
    assert len(alphas) == 400 and all(0 <= a <= 1 for a in alphas) and not any(a == 0.5 for a in alphas)
    assert apfl["final_personalized_accuracy"] > apfl["final_test_accuracy"] + 0.05


@pytest.mark.parametrize("overrides, line", [
    (["model.personal=output_layer"], "model.personal = 'output_layer': expected none for algorithm.name=apfl "
                                      "(each client's personal model is a whole model)"),
    (["algorithm.apfl_alpha=1.5"], "algorithm.apfl_alpha = 1.5: expected a number in [0, 1]"),
    (["algorithm.apfl_alpha=-0.1"], "algorithm.apfl_alpha = -0.1: expected a number in [0, 1]"),
    (["algorithm.alpha_lr=0"], "algorithm.alpha_lr = 0.0: expected a number > 0"),
    (["algorithm.adaptive_alpha=false", "algorithm.alpha_lr=0.1"],
     "algorithm.alpha_lr = 0.1: expected no setting (it applies only with algorithm.adaptive_alpha = True (here "
     "algorithm.adaptive_alpha = False))"),
    (["data.kind=quadratic", "model.kind=quadratic", "~model.hidden", "~model.activation", "~algorithm.batch_size",
      "~algorithm.local_epochs", "algorithm.local_steps=2", "~eval.personalized_steps"],
     "data.kind = 'quadratic': expected a data set of rows for algorithm.name=apfl (its personal models are "
     "judged by personalized evaluation, which the quadratic problem does not have)"),
])
def test_bad_input_is_one_line(capsys, tmp_path, overrides, line):
    from raysim.cli import main

    assert main(["validate", "scenarios/quickstart.yaml", "algorithm.name=apfl", f"output.dir={tmp_path}/out",
                 *overrides]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"


def test_an_alpha_out_of_range_is_refused_before_ray_starts(tmp_path):
    proc = cli("run", "scenarios/quickstart.yaml", "algorithm.name=apfl", "algorithm.apfl_alpha=2",
               f"output.dir={tmp_path}/out")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr) == "error: algorithm.apfl_alpha = 2.0: expected a number in [0, 1]"
    assert not (tmp_path / "out").exists()
