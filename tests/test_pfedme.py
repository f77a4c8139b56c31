"""pFedMe: its inner solve (K steps toward the personal model θ̃ on one minibatch, warm-started)
and the local model's step along λ(w − θ̃) computed by hand in numpy (logistic regression), the
kept θ̃ and its evaluation, the work a task declares, and its bad-input lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import HAND_CLIENTS, HAND_TRAIN, hand_context, logreg_grad, small_scenario
from test_bad_input import cli, one_error_line

import raysim
from raysim.algorithms import AlgorithmEnv
from raysim.algorithms.keys import PFedMeKeys
from raysim.algorithms.pfedme import PFedMe
from raysim.streams import Purpose, stream


def test_inner_solve_and_local_step_by_hand(logreg_clients):
    """Each client takes 2 local steps (batches of 3, the first draws of its stream); at each, 3
    inner steps θ ← θ − 0.2(∇f(θ) + 2(θ − w_local)) on that batch from the previous θ (w at the
    first), then w_local ← w_local − 0.3·2(w_local − θ). It sends w − w_local and keeps θ; client
    0's kept θ from an earlier visit plays no part (each visit starts from w)."""
    ds, model, model_cfg = logreg_clients
    keys = PFedMeKeys(name="pfedme", lr=0.3, local_steps=2, batch_size=3, pfedme_lambda=2.0, inner_steps=3,
                      personal_lr=0.2)
    algorithm = PFedMe(keys, AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w0 = model.initial_vector().double()
    states = [{"personal": w0 + 1.0}, None]
    updates = algorithm.client_update([{"params": w0}] * 2, hand_context(ds, model, states=states))

    x, y = ds.features().astype(np.float64), ds.labels()
    for c, (lo, _, _) in enumerate(ds.offsets()[HAND_CLIENTS]):
        order = stream(0, Purpose.CLIENT_TRAIN, c, 4).permutation(HAND_TRAIN)
        local, theta = w0.numpy().copy(), w0.numpy().copy()
        for s in range(2):
            rows = lo + order[3 * s:3 * s + 3]
            for _ in range(3):
                theta = theta - 0.2 * (logreg_grad(theta, x[rows], y[rows]) + 2.0 * (theta - local))
            local = local - 0.3 * 2.0 * (local - theta)
        np.testing.assert_allclose(updates.vector[c].numpy(), w0.numpy() - local, rtol=0, atol=1e-12)
        np.testing.assert_allclose(updates.states["personal"][c].numpy(), theta, rtol=0, atol=1e-12)
    assert not torch.allclose(updates.states["personal"][0], updates.states["personal"][1])


def test_personalized_evaluation_tests_each_clients_personal_model(logreg_clients):
    """Client 0 is tested at its kept θ̃, client 1 (never sampled) at w; one adaptation step starts
    from those."""
    ds, model, model_cfg = logreg_clients
    algorithm = PFedMe(PFedMeKeys(name="pfedme", batch_size=4), AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w = model.initial_vector().double()
    kept = w + torch.randn(w.numel(), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    states = [{"personal": kept}, None]
    for steps in (0, 1):
        tests = algorithm.personalize([{"params": w}] * 2, hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE),
                                      steps, 0, 0.1)
        expected = algorithm.finetune_and_test(hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE),
                                               torch.stack([kept, w]), steps, 0, 0.1)
        np.testing.assert_array_equal(tests.test_loss_sum, expected.test_loss_sum)
        np.testing.assert_array_equal(tests.test_correct, expected.test_correct)
    assert algorithm.adaptation_lr() == 0.1  # personal_lr's default


def test_a_task_declares_k_gradients_a_step(logreg_clients):
    ds, model, model_cfg = logreg_clients
    sizes, none = np.array([5, 50]), np.zeros(2)
    steps = PFedMe(PFedMeKeys(name="pfedme", local_steps=4, batch_size=8, inner_steps=3),
                   AlgorithmEnv(model, model_cfg, 2, 0))
    assert steps.work(sizes, none, {}).tolist() == [3 * 4 * 5, 3 * 4 * 8]
    assert steps.work(sizes, np.array([2, 0]), {}).tolist() == [3 * 2 * 5, 3 * 4 * 8]  # E_k
    epochs = PFedMe(PFedMeKeys(name="pfedme", local_epochs=2), AlgorithmEnv(model, model_cfg, 2, 0))
    assert epochs.work(sizes, none, {}).tolist() == [5 * 10, 5 * 100]  # K = 5 by default
    assert steps.upload_size({}) == model.size


def test_personal_models_beat_the_global_one(tmp_path):
    """On this non-iid mixture each client's θ̃, tested as it is, beats the global model, and β
    (server_lr) changes the global model."""
    common = ["execution.rounds=6", "execution.clients_per_round=20", "algorithm.local_steps=5", "eval.every=3",
              "algorithm.name=pfedme"]
    one = raysim.run(small_scenario(tmp_path / "one", *common)).summary
    two = raysim.run(small_scenario(tmp_path / "two", *common, "algorithm.server_lr=2")).summary
    assert one["final_personalized_accuracy"] > one["final_test_accuracy"] + 0.05
    assert one["model_sha256"] != two["model_sha256"]


@pytest.mark.parametrize("overrides, line", [
    (["model.personal=output_layer"], "model.personal = 'output_layer': expected none for algorithm.name=pfedme "
                                      "(each client's personal model is a whole model)"),
    (["algorithm.pfedme_lambda=0"], "algorithm.pfedme_lambda = 0.0: expected a number > 0"),
    (["algorithm.inner_steps=0"], "algorithm.inner_steps = 0: expected a positive integer"),
    (["algorithm.personal_lr=0"], "algorithm.personal_lr = 0.0: expected a number > 0"),
    (["algorithm.lr=0.1"], "algorithm.lr = 0.1: expected at most 1/pfedme_lambda = 0.0666667 for "
                           "algorithm.name=pfedme (a local step w ← w − lr·λ(w − θ̃) past the personal model θ̃)"),
    (["data.kind=quadratic", "model.kind=quadratic", "~model.hidden", "~model.activation", "~algorithm.batch_size",
      "~algorithm.local_epochs", "algorithm.local_steps=2", "~eval.personalized_steps"],
     "data.kind = 'quadratic': expected a data set of rows for algorithm.name=pfedme (its personal models are "
     "judged by personalized evaluation, which the quadratic problem does not have)"),
])
def test_bad_input_is_one_line(capsys, tmp_path, overrides, line):
    from raysim.cli import main

    assert main(["validate", "scenarios/quickstart.yaml", "algorithm.name=pfedme", "algorithm.lr=0.05",
                 f"output.dir={tmp_path}/out", *overrides]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"


def test_a_step_past_the_personal_model_is_refused_before_ray_starts(tmp_path):
    proc = cli("run", "scenarios/quickstart.yaml", "algorithm.name=pfedme", "algorithm.pfedme_lambda=40",
               "algorithm.lr=0.05", f"output.dir={tmp_path}/out")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr).startswith("error: algorithm.lr = 0.05: expected at most 1/pfedme_lambda = "
                                                  "0.025 for algorithm.name=pfedme")
    assert not (tmp_path / "out").exists()
