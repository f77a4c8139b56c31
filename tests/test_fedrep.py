"""FedRep and FedPer: FedRep's alternation (head steps with the body fixed, then body steps with
the head fixed) and FedPer's joint steps computed by hand in numpy (a tanh MLP), the body-only
upload, the kept heads (only of the clients sampled) and their evaluation, the work a task
declares, and the bad-input lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (HAND_CLASSES, HAND_CLIENTS, HAND_FEATURES, HAND_TRAIN, checkpointed, hand_context, hand_rows,
                      small_scenario)
from omegaconf import OmegaConf
from test_bad_input import cli, one_error_line

import raysim
from raysim.algorithms import AlgorithmEnv
from raysim.algorithms.fedrep import FedPer, FedRep
from raysim.algorithms.keys import FedPerKeys, FedRepKeys
from raysim.scenario import ModelConfig
from raysim.streams import Purpose, stream

FEATURES, CLASSES, HIDDEN = HAND_FEATURES, HAND_CLASSES, 4  # the two hand-made clients of conftest.hand_rows
BODY = HIDDEN * FEATURES + HIDDEN  # the first Linear layer's weight and bias; the head is the second's
SPLIT = ["model.personal=output_layer", "model.personal_state=stateful"]


@pytest.fixture
def setup():
    """Two clients with 12 training and 5 test rows of 3 features, 3 classes; a tanh MLP with 4
    hidden units whose output layer is personal, a new client's head the server's (init global)."""
    model_cfg = OmegaConf.structured(ModelConfig(kind="mlp", hidden=[HIDDEN], activation="tanh",
                                                 personal="output_layer", personal_state="stateful",
                                                 personal_init="global"))
    ds, model = hand_rows(model_cfg)
    assert model.personal.tolist() == [False] * BODY + [True] * (model.size - BODY)
    return ds, model, model_cfg


def _layers(theta):
    W1 = theta[:HIDDEN * FEATURES].reshape(HIDDEN, FEATURES)
    b1 = theta[HIDDEN * FEATURES:BODY]
    W2 = theta[BODY:BODY + CLASSES * HIDDEN].reshape(CLASSES, HIDDEN)
    return W1, b1, W2, theta[BODY + CLASSES * HIDDEN:]


def _logits(theta, x):
    W1, b1, W2, b2 = _layers(theta)
    return np.tanh(x @ W1.T + b1) @ W2.T + b2


def _grad(theta, x, y):
    """The mean cross-entropy's gradient of the tanh MLP by hand (backpropagation in numpy)."""
    W1, b1, W2, b2 = _layers(theta)
    h = np.tanh(x @ W1.T + b1)
    logits = h @ W2.T + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    err = (p - np.eye(CLASSES)[y]) / len(y)
    dz = (err @ W2) * (1 - h ** 2)
    return np.concatenate([(dz.T @ x).ravel(), dz.sum(0), (err.T @ h).ravel(), err.sum(0)])


def _start(model):
    """The server's vector and client 0's kept head (client 1 visits for the first time)."""
    w = model.initial_vector().double()
    head = w[BODY:] + 0.5 * torch.randn(model.size - BODY, generator=torch.Generator().manual_seed(9),
                                        dtype=torch.float64)
    return w, head


def test_fedrep_alternates_head_then_body_by_hand(setup):
    """3 head steps at 0.3 (body fixed) on the first draws of each client's stream, then 2 body
    steps at 0.4 (head fixed) on the next; the body's update is sent, the head kept."""
    ds, model, model_cfg = setup
    keys = FedRepKeys(name="fedrep", lr=0.4, local_steps=2, batch_size=3, head_lr=0.3, head_steps=3)
    algorithm = FedRep(keys, AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w, kept = _start(model)
    updates = algorithm.client_update([{"params": w}] * 2, hand_context(ds, model, [{"head": kept}, None]))
    assert updates.vector.shape == (2, BODY) and set(updates.states) == {"head"}

    x, y = ds.features().astype(np.float64), ds.labels()
    head_mask = model.personal.numpy()
    for c, (lo, _, _) in enumerate(ds.offsets()[HAND_CLIENTS]):
        rng = stream(0, Purpose.CLIENT_TRAIN, c, 4)
        theta = w.numpy().copy()
        theta[BODY:] = kept.numpy() if c == 0 else w.numpy()[BODY:]
        order = rng.permutation(HAND_TRAIN)
        for s in range(3):
            rows = lo + order[3 * s:3 * s + 3]
            theta = theta - 0.3 * _grad(theta, x[rows], y[rows]) * head_mask
        assert np.array_equal(theta[:BODY], w.numpy()[:BODY])  # the body has not moved yet
        order = rng.permutation(HAND_TRAIN)
        head = theta[BODY:].copy()
        for s in range(2):
            rows = lo + order[3 * s:3 * s + 3]
            theta = theta - 0.4 * _grad(theta, x[rows], y[rows]) * ~head_mask
        assert np.array_equal(theta[BODY:], head)  # nor the head now
        np.testing.assert_allclose(updates.vector[c].numpy(), w.numpy()[:BODY] - theta[:BODY], rtol=0, atol=1e-12)
        np.testing.assert_allclose(updates.states["head"][c].numpy(), theta[BODY:], rtol=0, atol=1e-12)


def test_fedper_trains_body_and_head_together_by_hand(setup):
    ds, model, model_cfg = setup
    algorithm = FedPer(FedPerKeys(name="fedper", lr=0.4, local_steps=3, batch_size=3),
                       AlgorithmEnv(model, model_cfg, num_clients=2, seed=0))
    w, kept = _start(model)
    updates = algorithm.client_update([{"params": w}] * 2, hand_context(ds, model, [{"head": kept}, None]))
    x, y = ds.features().astype(np.float64), ds.labels()
    for c, (lo, _, _) in enumerate(ds.offsets()[HAND_CLIENTS]):
        theta = w.numpy().copy()
        theta[BODY:] = kept.numpy() if c == 0 else w.numpy()[BODY:]
        order = stream(0, Purpose.CLIENT_TRAIN, c, 4).permutation(HAND_TRAIN)
        for s in range(3):
            rows = lo + order[3 * s:3 * s + 3]
            theta = theta - 0.4 * _grad(theta, x[rows], y[rows])
        np.testing.assert_allclose(updates.vector[c].numpy(), w.numpy()[:BODY] - theta[:BODY], rtol=0, atol=1e-12)
        np.testing.assert_allclose(updates.states["head"][c].numpy(), theta[BODY:], rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls, keys", [(FedRep, FedRepKeys), (FedPer, FedPerKeys)])
def test_personalized_evaluation_tests_the_body_with_each_clients_head(setup, cls, keys):
    """No adaptation: client 0 with its kept head, client 1 (never sampled) with a fresh one (here
    the server's, personal_init global); one step adapts the head alone."""
    ds, model, model_cfg = setup
    algorithm = cls(keys(name=cls.__name__.lower(), batch_size=4), AlgorithmEnv(model, model_cfg, 2, 0))
    w, kept = _start(model)
    states = [{"head": kept}, None]
    tests = algorithm.personalize([{"params": w}] * 2, hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE),
                                  0, 0, 0.1)
    x, y = ds.features().astype(np.float64), ds.labels()
    for c, (_, lo, hi) in enumerate(ds.offsets()[HAND_CLIENTS]):
        theta = w.numpy().copy()
        if c == 0:
            theta[BODY:] = kept.numpy()
        assert tests.test_correct[c] == int((_logits(theta, x[lo:hi]).argmax(1) == y[lo:hi]).sum())
    ctx = hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE)
    adapted = algorithm.personalize([{"params": w}] * 2, ctx, 1, 0, 0.1)
    start = w.expand(2, -1).clone()
    start[0, BODY:] = kept
    expected = algorithm.finetune_and_test(hand_context(ds, model, states, Purpose.CLIENT_PERSONALIZE), start, 1, 0,
                                           0.1, only=model.personal)
    np.testing.assert_array_equal(adapted.test_loss_sum, expected.test_loss_sum)


def test_a_task_declares_head_and_body_steps(setup):
    ds, model, model_cfg = setup
    sizes, none = np.array([5, 50]), np.zeros(2)
    fedrep = FedRep(FedRepKeys(name="fedrep", local_steps=4, batch_size=8, head_steps=2),
                    AlgorithmEnv(model, model_cfg, 2, 0))
    assert fedrep.work(sizes, none, {}).tolist() == [4 * 5 + 2 * 5, 4 * 8 + 2 * 8]
    assert fedrep.work(sizes, np.array([3, 0]), {}).tolist() == [2 * 3 * 5, 4 * 8 + 2 * 8]  # E_k: both counts
    epochs = FedRep(FedRepKeys(name="fedrep", local_epochs=1, head_epochs=3), AlgorithmEnv(model, model_cfg, 2, 0))
    assert epochs.work(sizes, none, {}).tolist() == [5 + 15, 50 + 150]
    fedper = FedPer(FedPerKeys(name="fedper", local_steps=4, batch_size=8), AlgorithmEnv(model, model_cfg, 2, 0))
    assert fedper.work(sizes, none, {}).tolist() == [4 * 5, 4 * 8]
    assert fedrep.upload_size({}) == fedper.upload_size({}) == BODY  # the body only


@pytest.mark.parametrize("name, split, kept, size", [("fedrep", SPLIT, "head", 16 * 10 + 10),
                                                      ("fedper", SPLIT, "head", 16 * 10 + 10),
                                                      ("ditto", [], "personal", 60 * 16 + 16 + 16 * 10 + 10)])
def test_kept_state_is_in_the_run_state_for_the_sampled_clients_only(tmp_path, name, split, kept, size):
    """After a round (checkpointed), the run state holds the kept state (FedRep's and FedPer's head,
    Ditto's whole personal model) of exactly the clients that round sampled (60 features, 16 hidden
    units, 10 classes)."""
    state, events = checkpointed(tmp_path, f"algorithm.name={name}", *split, "algorithm.local_steps=2")
    sampled = {e["client_id"] for e in events if e["status"] == "applied"}
    assert state["version"] == 1 and len(sampled) == 12  # of 40 clients
    assert set(state["client_state"]) == sampled
    assert all(set(state["client_state"][c]) == {kept} for c in sampled)
    models = [state["client_state"][c][kept] for c in sorted(sampled)]
    assert all(m.shape == (size,) for m in models) and not torch.equal(models[0], models[1])


def test_runs_with_personalized_accuracy_above_the_global_models(tmp_path):
    for name in ("fedrep", "fedper"):
        summary = raysim.run(small_scenario(tmp_path / name, f"algorithm.name={name}", *SPLIT,
                                            "execution.rounds=5", "execution.clients_per_round=20",
                                            "eval.every=5")).summary
        assert summary["final_personalized_accuracy"] > summary["final_test_accuracy"], name


BAD_SPLIT = ("a split with personal parameters for algorithm.name={}: output_layer (a personal head), input_layer, "
             "adapter or name patterns")


@pytest.mark.parametrize("name", ["fedrep", "fedper"])
@pytest.mark.parametrize("overrides, line", [
    ([], "model.personal = 'none': expected " + BAD_SPLIT),
    (["model.personal=output_layer"], "model.personal_state = 'stateless': expected stateful for "
                                      "algorithm.name={} (each client keeps its personal part between visits)"),
    ([*SPLIT, "data.kind=quadratic", "model.kind=quadratic", "~model.hidden", "~model.activation",
      "~algorithm.batch_size", "~algorithm.local_epochs", "algorithm.local_steps=2", "~eval.personalized_steps"],
     "data.kind = 'quadratic': expected a data set of rows for algorithm.name={} (its personal models are judged "
     "by personalized evaluation, which the quadratic problem does not have)"),
])
def test_bad_input_is_one_line(capsys, tmp_path, name, overrides, line):
    from raysim.cli import main

    assert main(["validate", "scenarios/quickstart.yaml", f"algorithm.name={name}", f"output.dir={tmp_path}/out",
                 *overrides]) == 2
    assert capsys.readouterr().err == f"error: {line.format(name)}\n"


@pytest.mark.parametrize("overrides, line", [
    (["algorithm.head_steps=0"], "algorithm.head_steps = 0: expected a positive integer"),
    (["algorithm.head_lr=-1"], "algorithm.head_lr = -1.0: expected a number > 0"),
    (["algorithm.head_steps=2", "algorithm.head_epochs=3"],
     "algorithm.head_epochs = 3: expected no setting (it applies only with algorithm.head_steps = null (here "
     "algorithm.head_steps = 2))"),
])
def test_fedrep_keys_bad_input_is_one_line(capsys, tmp_path, overrides, line):
    from raysim.cli import main

    assert main(["validate", "scenarios/quickstart.yaml", "algorithm.name=fedrep", *SPLIT,
                 f"output.dir={tmp_path}/out", *overrides]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"


def test_a_model_without_a_split_is_refused_before_ray_starts(tmp_path):
    proc = cli("run", "scenarios/quickstart.yaml", "algorithm.name=fedrep", f"output.dir={tmp_path}/out")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr) == "error: model.personal = 'none': expected " + BAD_SPLIT.format("fedrep")
    assert not (tmp_path / "out").exists()
