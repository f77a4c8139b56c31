"""FedAvg and the vectorized local SGD it runs on, checked against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from raysim.algorithms import AlgorithmEnv, ClientContext, RowData
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import FedAvgKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.oracles import RowOracle, minibatch_plan
from raysim.algorithms.transforms import add_weight_decay, chain, scale
from raysim.scenario import ModelConfig
from raysim.data import FederatedDataset
from raysim.models import build_model


def _softmax_grad(W, b, X, y):
    """Mean cross-entropy gradient of logistic regression, by hand."""
    logits = X @ W.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    err = p - np.eye(W.shape[0])[y]
    return err.T @ X / len(y), err.mean(0)


def _context(dataset, model, clients, seed=0):
    rngs = [np.random.default_rng([seed, 1, c, 0]) for c in clients]
    data = RowData(torch.from_numpy(dataset.features().copy()), torch.from_numpy(dataset.labels().copy()),
                   dataset.offsets()[np.array(clients)])
    return ClientContext(np.array(clients), rngs, model, data, torch.device("cpu"))


@pytest.fixture
def tiny():
    """Two clients with 2 and 1 training rows, 2 features, 2 classes."""
    x0 = np.array([[1.0, 2.0], [0.5, -1.0]], np.float32)
    x1 = np.array([[-1.0, 0.5]], np.float32)
    ds = FederatedDataset.from_clients([x0, x1], [np.array([0, 1]), np.array([1])],
                                       [x0[:1], x1], [np.array([0]), np.array([1])], 2, (2,))
    model = build_model(OmegaConf.structured(ModelConfig(kind="logreg")), (2,), 2, seed=3)
    return ds, model, (x0, np.array([0, 1])), (x1, np.array([1]))


@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_fedavg_one_full_batch_step_matches_hand_computation(tiny, server_lr):
    ds, model, (x0, y0), (x1, y1) = tiny
    cfg = FedAvgKeys(lr=0.5, batch_size=8, local_epochs=1, server_lr=server_lr)
    algo = FedAvg(cfg, AlgorithmEnv(model, ModelConfig(kind="logreg"), num_clients=2, seed=0))
    theta = model.initial_vector()
    W, b = theta[:4].numpy().reshape(2, 2).astype(np.float64), theta[4:].numpy().astype(np.float64)
    state = algo.init(theta)
    updates = algo.client_update([algo.payload(state)] * 2, _context(ds, model, [0, 1]))
    new = algo.server_update(state, updates, updates.samples / updates.samples.sum()).params.numpy()

    deltas = []
    for X, y in [(x0, y0), (x1, y1)]:
        gW, gb = _softmax_grad(W, b, X.astype(np.float64), y)
        deltas.append(0.5 * np.concatenate([gW.ravel(), gb]))
    np.testing.assert_allclose(updates.vector.numpy(), np.stack(deltas), rtol=1e-5, atol=1e-6)
    mean_delta = (2 * deltas[0] + 1 * deltas[1]) / 3  # weighted by samples
    expected = np.concatenate([W.ravel(), b]) - server_lr * mean_delta
    np.testing.assert_allclose(new, expected, rtol=1e-5, atol=1e-6)
    assert list(updates.samples) == [2, 1]


def test_vectorized_local_sgd_equals_one_client_at_a_time():
    rng = np.random.default_rng(0)
    sizes = [7, 23, 12]
    xs = [rng.normal(size=(n, 5)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, 3, n) for n in sizes]
    ds = FederatedDataset.from_clients(xs, ys, [x[:1] for x in xs], [y[:1] for y in ys], 3, (5,))
    model = build_model(OmegaConf.structured(ModelConfig(kind="mlp", hidden=[8])), (5,), 3, seed=1)
    X, Y = torch.from_numpy(ds.features().copy()), torch.from_numpy(ds.labels().copy())
    offsets = ds.offsets()
    theta = model.initial_vector()

    def schedule(clients):
        rngs = [np.random.default_rng([9, c]) for c in clients]
        return minibatch_plan(offsets[clients, 0], offsets[clients, 1] - offsets[clients, 0], rngs, 4, 2, None)

    def train(clients):
        plan = schedule(clients)
        oracle = RowOracle(model, X, Y, offsets[clients], plan, torch.device("cpu"))
        result = local_train(theta.expand(len(clients), -1), oracle, chain(add_weight_decay(1e-3), scale(0.1)))
        return result.params, result.loss

    together, loss = train([0, 1, 2])
    for c in range(3):
        alone, alone_loss = train([c])
        torch.testing.assert_close(together[c], alone[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss[c], alone_loss[0], rtol=1e-6)
    # by hand for client 0: plain SGD over its own batches, with weight decay
    sched = schedule([0])
    p = theta.clone()
    for s in range(sched.rows.shape[0]):
        rows = sched.rows[s, 0][sched.mask[s, 0] > 0]
        q = p.clone().requires_grad_(True)
        g, = torch.autograd.grad(torch.nn.functional.cross_entropy(model.logits(q, X[rows]), Y[rows]), q)
        p = p - 0.1 * (g + 1e-3 * p)
    torch.testing.assert_close(together[0], p, rtol=1e-5, atol=1e-6)


def test_minibatch_plan_epochs_and_steps():
    rngs = [np.random.default_rng(i) for i in range(2)]
    s = minibatch_plan(np.array([0, 10]), np.array([10, 25]), rngs, batch_size=10, epochs=2, steps=None)
    assert list(s.steps) == [2, 6]  # ceil(10/10)*2, ceil(25/10)*2
    rows_client1 = s.rows[:, 1][s.mask[:, 1] > 0]
    assert sorted(rows_client1.tolist()) == sorted(list(range(10, 35)) * 2)  # every row once per epoch
    assert s.mask[2:, 0].sum() == 0 and s.active[2:, 0].sum() == 0  # client 0 is done after 2 steps
    fixed = minibatch_plan(np.array([0]), np.array([3]), [np.random.default_rng(0)], 2, 1, steps=5)
    assert list(fixed.steps) == [5] and fixed.mask.sum() == 10
