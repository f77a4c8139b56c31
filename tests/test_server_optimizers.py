"""Each server optimizer over a fixed three-step sequence of aggregated updates equals its
published formula, computed here by hand (FedAvgM: Hsu et al. 2019; FedAdam, FedYogi,
FedAdagrad: Reddi et al., "Adaptive Federated Optimization", 2021), and the aggregator sums in
client-id order in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raysim.algorithms import server_optimizers as so
from raysim.algorithms.aggregation_rules import weighted_mean

UPDATES = [[0.5, -1.0, 2.0], [0.1, 0.3, -0.4], [-0.2, 0.0, 1.5]]  # g_1, g_2, g_3 (pseudo-gradients)


def _run(optimizer) -> list:
    """The steps the optimizer takes for UPDATES (θ ← θ − step)."""
    state = optimizer.init(3)
    steps = []
    for g in UPDATES:
        step, state = optimizer.update(torch.tensor(g, dtype=torch.float64), state)
        steps.append(step.tolist())
    return steps


def _close(ours, hand) -> bool:
    return np.allclose(np.array(ours), np.array(hand), rtol=1e-12, atol=1e-15)


def test_sgd():
    assert _close(_run(so.sgd(0.7)), [[0.7 * x for x in g] for g in UPDATES])


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum(nesterov):
    lr, beta = 0.5, 0.9
    m, hand = [0.0] * 3, []
    for g in UPDATES:
        m = [beta * mi + gi for mi, gi in zip(m, g)]
        hand.append([lr * (gi + beta * mi) if nesterov else lr * mi for gi, mi in zip(g, m)])
    assert _close(_run(so.momentum(lr, beta, nesterov)), hand)


def _adaptive_by_hand(rule, lr, b1, b2, tau, bias_correction):
    m, v, hand = [0.0] * 3, [tau * tau] * 3, []
    for t, g in enumerate(UPDATES, start=1):
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        if rule == "adam":
            v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        elif rule == "yogi":
            v = [vi - (1 - b2) * gi * gi * math.copysign(1.0, vi - gi * gi) if vi != gi * gi else vi
                 for vi, gi in zip(v, g)]
        else:
            v = [vi + gi * gi for vi, gi in zip(v, g)]
        mh = [mi / (1 - b1 ** t) for mi in m] if bias_correction else m
        vh = [vi / (1 - b2 ** t) for vi in v] if bias_correction and rule != "adagrad" else v
        hand.append([lr * a / (math.sqrt(b) + tau) for a, b in zip(mh, vh)])
    return hand


@pytest.mark.parametrize("rule", ["adam", "yogi", "adagrad"])
@pytest.mark.parametrize("bias_correction", [False, True])
def test_adaptive(rule, bias_correction):
    lr, betas, tau = 0.01, (0.9, 0.99), 1e-3
    ours = _run(getattr(so, rule)(lr, betas, tau, bias_correction))
    assert _close(ours, _adaptive_by_hand(rule, lr, *betas, tau, bias_correction))


def test_yogi_and_adam_differ_once_the_second_moment_moves():
    assert _run(so.adam(0.01)) != _run(so.yogi(0.01))


def test_weighted_mean_is_float64_in_row_order():
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    out = weighted_mean(rows, np.array([0.5, 0.25, 0.25]))
    assert out.dtype == torch.float64
    assert out.tolist() == [0.5 * 1 + 0.25 * 3 + 0.25 * 5, 0.5 * 2 + 0.25 * 4 + 0.25 * 6]
