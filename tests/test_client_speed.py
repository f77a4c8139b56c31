"""The fast client path gives the reference's results bit for bit.

Plain MLPs (``logreg``, ``mlp``) train through hand-written passes (:mod:`raysim.models.dense`)
instead of ``vmap(functional_call)`` plus autograd; minibatch plans are built with array
operations; fully active steps skip the mask. None of this may change a single bit: these
tests compare against the reference path (autograd through the vmapped model) and against the
previous, loop-by-loop plan builder, kept here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.local import local_train
from raysim.algorithms.oracles import Participation, RowOracle, minibatch_plan
from raysim.algorithms.transforms import add_proximal, add_weight_decay, chain, clip_by_norm, scale
from raysim.models import FlatModel
from raysim.models.split import add_adapters

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "elu": nn.ELU}


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bits (so that -0.0 != 0.0 and NaN payloads count)."""
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int64)


def _mlp(features: int, hidden: list, classes: int, activation: str = "relu", seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    layers, width = [nn.Flatten()], features
    for h in hidden:
        layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
        width = h
    return FlatModel(nn.Sequential(*layers, nn.Linear(width, classes)))


def _task(seed: int, clients: int, features=(7,), classes: int = 4, batch: int = 3, steps: int | None = None):
    """Rows of ``clients`` clients of different sizes, their offsets and a minibatch plan."""
    r = np.random.default_rng(seed)
    sizes = r.integers(1, 25, clients)
    starts = np.cumsum(np.r_[0, sizes[:-1]] + 2)  # 2 test rows after each client's train rows
    offsets = np.stack([starts, starts + sizes, starts + sizes + 2], 1)
    n = int(offsets[-1, 2])
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, *features, generator=g), torch.randint(0, classes, (n,), generator=g)
    plan = minibatch_plan(offsets[:, 0], sizes, [np.random.default_rng([seed, c]) for c in range(clients)], batch, 1,
                          steps)
    return x, y, offsets, plan


def _oracles(model, x, y, offsets, plan, label_flip=None):
    fast = RowOracle(model, x, y, offsets, plan, torch.device("cpu"), label_flip)
    reference = RowOracle(model, x, y, offsets, plan, torch.device("cpu"), label_flip)
    reference.dense = None  # the generic path: autograd through vmap(functional_call)
    assert fast.dense is not None
    return fast, reference


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("clients", [1, 2, 7])
@pytest.mark.parametrize("hidden", [[], [9], [13, 5]])
def test_dense_gradients_are_the_autograd_bits(activation, clients, hidden):
    model = _mlp(7, hidden, 4, activation, seed=clients)
    x, y, offsets, plan = _task(len(hidden) + clients, clients)
    fast, reference = _oracles(model, x, y, offsets, plan)
    g = torch.Generator().manual_seed(1)
    params = model.initial_vector().expand(clients, -1) + 0.3 * torch.randn(clients, model.size, generator=g)
    for s in [*range(plan.num_steps), None]:  # every minibatch step, then every training row
        (a, la), (b, lb) = fast.gradient(params, s), reference.gradient(params, s)
        assert torch.equal(bits(a), bits(b)) and torch.equal(bits(la), bits(lb)), s


def test_dense_gradients_with_images_and_flipped_labels():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3))
    model = FlatModel(module)
    x, y, offsets, plan = _task(3, 5, features=(1, 3, 4), classes=3)
    flip = (torch.tensor([True, False, True, False, False]), 3)
    fast, reference = _oracles(model, x, y, offsets, plan, flip)
    params = model.initial_vector().expand(5, -1).clone()
    for s in [*range(plan.num_steps), None]:
        (a, la), (b, lb) = fast.gradient(params, s), reference.gradient(params, s)
        assert torch.equal(bits(a), bits(b)) and torch.equal(bits(la), bits(lb))


@pytest.mark.parametrize("clients", [1, 6])
def test_local_training_is_the_reference_bit_for_bit(clients):
    """Several steps, clients with different step counts (masked steps), a chain of transforms."""
    model = _mlp(7, [11], 4, seed=5)
    x, y, offsets, plan = _task(11, clients, steps=None)
    fast, reference = _oracles(model, x, y, offsets, plan)
    start = model.initial_vector().expand(clients, -1)
    step = chain(add_proximal(0.1, start), clip_by_norm(5.0), add_weight_decay(1e-3), scale(0.2))
    a, b = local_train(start, fast, step), local_train(start, reference, step)
    assert torch.equal(bits(a.params), bits(b.params))
    assert a.loss.tobytes() == b.loss.tobytes() and (a.steps == b.steps).all()
    assert (plan.active.sum(0).numpy() == plan.steps).all() and (plan.steps.min() < plan.steps.max() or clients == 1)


def test_only_plain_mlps_take_the_fast_path():
    assert _mlp(5, [4], 3).dense is not None
    assert FlatModel(nn.Sequential(nn.Linear(5, 3))).dense is not None  # no Flatten: features must be [C, B, F]
    assert FlatModel(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2, 3))).dense is None
    assert FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(5, 4), nn.ELU(inplace=True), nn.Linear(4, 3))).dense is None
    assert FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(5, 4), nn.GELU(), nn.Linear(4, 3))).dense is None
    assert FlatModel(add_adapters(nn.Sequential(nn.Flatten(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)), 2,
                                  None)).dense is None
    hooked = nn.Sequential(nn.Flatten(), nn.Linear(5, 3))
    hooked[1].register_forward_hook(lambda module, args, out: out * 2)
    assert FlatModel(hooked).dense is None


def _reference_minibatch_plan(starts, sizes, rngs, batch_size, epochs, steps, client_steps=None, participation=None):
    """The previous builder, batch by batch (rows, mask, active, participation scales)."""
    per_client, coins = [], []
    for c, (start, size, rng) in enumerate(zip(starts, sizes, rngs)):
        size = int(size)
        own = int(client_steps[c]) if client_steps is not None and client_steps[c] > 0 else steps
        if own is None:
            batches = []
            for _ in range(epochs):
                perm = rng.permutation(size)
                batches += [perm[i:i + batch_size] for i in range(0, size, batch_size)]
        else:
            passes = -(-own * batch_size // size)
            order = np.concatenate([rng.permutation(size) for _ in range(passes)])
            batches = [order[i * batch_size:(i + 1) * batch_size] for i in range(own)]
        per_client.append([b + start for b in batches])
        if participation is None or participation.delta[c] >= 1.0:
            coins.append(np.ones(len(batches)))
        else:
            delta = float(participation.delta[c])
            draws = np.full(len(batches), rng.random()) if participation.per_round else rng.random(len(batches))
            coins.append(np.where(draws < delta, 1.0 / delta, 0.0))
    count = np.array([len(b) for b in per_client])
    active = np.zeros((count.max(), len(count)), np.float32)
    scales = np.zeros(active.shape, np.float32)
    for c, n in enumerate(count):
        active[:n, c], scales[:n, c] = 1.0, coins[c]
    width = max(len(b) for batches in per_client for b in batches)
    rows = np.zeros((*active.shape, width), np.int64)
    mask = np.zeros(rows.shape, np.float32)
    for c, batches in enumerate(per_client):
        for s, b in enumerate(batches):
            rows[s, c, :len(b)], mask[s, c, :len(b)] = b, 1.0
    return count, active, scales, rows, mask


@pytest.mark.parametrize("seed", range(40))
def test_minibatch_plans_are_the_previous_ones(seed):
    r = np.random.default_rng(seed)
    clients = int(r.integers(1, 6))
    sizes = r.integers(1, 30, clients)
    starts = np.cumsum(np.r_[5, sizes[:-1]])
    batch, epochs = int(r.integers(1, 12)), int(r.integers(1, 4))
    steps = None if seed % 2 else int(r.integers(1, 9))
    client_steps = r.integers(0, 5, clients) if seed % 3 == 0 else None
    participation = Participation(r.uniform(0.3, 1.0, clients), seed % 5 == 0) if seed % 4 == 0 else None
    rngs = lambda: [np.random.default_rng([seed, c]) for c in range(clients)]  # noqa: E731
    plan = minibatch_plan(starts, sizes, rngs(), batch, epochs, steps, client_steps, participation)
    count, active, scales, rows, mask = _reference_minibatch_plan(starts, sizes, rngs(), batch, epochs, steps,
                                                                  client_steps, participation)
    assert (plan.steps == count).all()
    assert np.array_equal(plan.active.numpy(), active) and np.array_equal(plan.rows.numpy(), rows)
    assert np.array_equal(plan.mask.numpy(), mask) and plan.rows.dtype == torch.int64
    if participation is not None and participation.unreliable:
        assert np.array_equal(plan.participation.numpy(), scales)
    else:
        assert plan.participation is None
