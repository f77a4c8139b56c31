"""Local-only training: each client's steps computed by hand in numpy (logistic regression), nothing
sent and the server's model untouched, the kept models evaluated, and the bad-input lines."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from conftest import HAND_CLIENTS, HAND_TRAIN, hand_context, logreg_grad, small_scenario
from test_bad_input import cli, one_error_line

import raysim
from raysim.algorithms import AlgorithmEnv
from raysim.algorithms.keys import LocalOnlyKeys
from raysim.algorithms.local_only import LocalOnly
from raysim.models import build_model
from raysim.preparation import prepare
from raysim.streams import Purpose, stream


def test_each_client_trains_its_own_model_by_hand(logreg_clients):
    """Client 0 continues its kept model, client 1 starts from the model it receives; 2 steps at
    lr 0.4 on batches of 3 (the first draws of its stream); an update of no entries is sent."""
    ds, model, model_cfg = logreg_clients
    algorithm = LocalOnly(LocalOnlyKeys(name="local_only", lr=0.4, local_steps=2, batch_size=3),
                          AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w = model.initial_vector().double()
    kept = w + 0.2 * torch.randn(w.numel(), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    updates = algorithm.client_update([{"params": w}] * 2, hand_context(ds, model, [{"model": kept}, None]))
    assert updates.vector.shape == (2, 0) and algorithm.upload_size({}) == 0
    x, y = ds.features().astype(np.float64), ds.labels()
    for c, (lo, _, _) in enumerate(ds.offsets()[HAND_CLIENTS]):
        order = stream(0, Purpose.CLIENT_TRAIN, c, 4).permutation(HAND_TRAIN)
        theta = (kept if c == 0 else w).numpy().copy()
        for s in range(2):
            rows = lo + order[3 * s:3 * s + 3]
            theta = theta - 0.4 * logreg_grad(theta, x[rows], y[rows])
        np.testing.assert_allclose(updates.states["model"][c].numpy(), theta, rtol=0, atol=1e-12)


def test_nothing_is_sent_and_the_kept_models_are_evaluated(tmp_path):
    """The server's model stays the initial one and no byte goes up; personalized accuracy (of the
    clients' own models, no adaptation) is logged and beats the untrained global model's."""
    cfg = small_scenario(tmp_path, "algorithm.name=local_only", "execution.rounds=4", "execution.clients_per_round=20",
                         "eval.every=2")
    initial = build_model(cfg.model, (60,), 10, cfg.seed).initial_vector()
    assert prepare(cfg, create_output=False).dataset.feature_shape == (60,)
    summary = raysim.run(cfg).summary
    assert summary["model_sha256"] == hashlib.sha256(initial.numpy().tobytes()).hexdigest()
    assert summary["bytes_up"] == 0 and summary["bytes_down"] > 0
    assert summary["final_personalized_accuracy"] > summary["final_test_accuracy"] + 0.1


@pytest.mark.parametrize("overrides, line", [
    (["model.personal=output_layer"], "model.personal = 'output_layer': expected none for algorithm.name=local_only "
                                      "(each client's personal model is a whole model)"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=0.5", "privacy.clip_norm=1"],
     "privacy.mechanism = 'central': expected \"none\" with algorithm.name=local_only (its clients send nothing)"),
    (["communication.uplink.kind=topk", "communication.uplink.fraction=0.05"],
     "communication.uplink.kind = 'topk': expected \"none\" with algorithm.name=local_only (its clients send "
     "nothing)"),
    (["communication.secure_aggregation.protocol=secagg"],
     "communication.secure_aggregation.protocol = 'secagg': expected \"none\" with algorithm.name=local_only (its "
     "clients send nothing)"),
    (["system.byzantine.fraction=0.2", "system.byzantine.attack=alie"],
     "system.byzantine.fraction = 0.2: expected 0.0 with algorithm.name=local_only (its clients send nothing)"),
    (["algorithm.aggregator=krum"], "algorithm.aggregator = 'krum': expected a key of algorithm.name=local_only"),
])
def test_bad_input_is_one_line(capsys, tmp_path, overrides, line):
    from raysim.cli import main

    assert main(["validate", "scenarios/quickstart.yaml", "algorithm.name=local_only", f"output.dir={tmp_path}/out",
                 *overrides]) == 2
    assert capsys.readouterr().err.startswith(f"error: {line}")


def test_a_split_model_is_refused_before_ray_starts(tmp_path):
    proc = cli("run", "scenarios/quickstart.yaml", "algorithm.name=local_only", "model.personal=input_layer",
               f"output.dir={tmp_path}/out")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr) == ("error: model.personal = 'input_layer': expected none for "
                                           "algorithm.name=local_only (each client's personal model is a whole "
                                           "model)")
    assert not (tmp_path / "out").exists()
