"""Server optimizers: how the server turns the aggregated client update into a model step.

The aggregated update g is a pseudo-gradient (the mean of θ − θ_k, or of the clients' partial
gradients for FFGG), in float64. Each optimizer is a pair of pure functions, as optax's
transforms are: ``init(size) -> state`` (a dict of float64 tensors, part of the server state)
and ``update(g, state) -> (step, state)``; the server then sets θ ← θ − step.

* ``sgd``: step = η·g.
* ``momentum`` (FedAvgM, Hsu et al. 2019): m ← β·m + g; step = η·m, or η·(g + β·m) with Nesterov.
* ``adam``, ``yogi``, ``adagrad`` (FedAdam, FedYogi, FedAdagrad of Reddi et al., "Adaptive Federated
  Optimization", 2021): m ← β₁·m + (1 − β₁)·g and
  adam v ← β₂·v + (1 − β₂)·g², yogi v ← v − (1 − β₂)·g²·sign(v − g²), adagrad v ← v + g²;
  step = η·m̂ / (√v̂ + τ), with v starting at τ² as the paper initialises it. Without bias
  correction m̂ = m and v̂ = v; with it m̂ = m / (1 − β₁ᵗ) and, for adam and yogi, v̂ = v / (1 − β₂ᵗ).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch


class ServerOptimizer(NamedTuple):
    """``init(size) -> state``; ``update(g, state) -> (step to subtract, state)``. ``rowwise``: the
    optimizer keeps no state and treats each row of g alone, so the steps of several server steps
    come from one call on their directions stacked ``[K, size]``."""

    init: Callable[[int], dict]
    update: Callable[[torch.Tensor, dict], tuple[torch.Tensor, dict]]
    rowwise: bool = False


def _zeros(size: int) -> torch.Tensor:
    return torch.zeros(size, dtype=torch.float64)


def sgd(lr: float) -> ServerOptimizer:
    """step = lr·g."""
    return ServerOptimizer(lambda size: {}, lambda g, state: (lr * g, state), rowwise=True)


def momentum(lr: float, beta: float, nesterov: bool = False) -> ServerOptimizer:
    """Heavy-ball momentum: m ← β·m + g; step = lr·m (Nesterov: lr·(g + β·m))."""

    def update(g, state):
        m = beta * state["m"] + g
        return lr * (g + beta * m if nesterov else m), {"m": m}

    return ServerOptimizer(lambda size: {"m": _zeros(size)}, update)


def _adaptive(second_moment: Callable, lr: float, betas, eps: float, bias_correction: bool,
              correct_v: bool) -> ServerOptimizer:
    beta1, beta2 = betas

    def init(size):
        return {"m": _zeros(size), "v": torch.full((size,), eps * eps, dtype=torch.float64),
                "t": torch.tensor(0, dtype=torch.int64)}

    def update(g, state):
        t = state["t"] + 1
        m = beta1 * state["m"] + (1 - beta1) * g
        v = second_moment(state["v"], g * g, beta2)
        m_hat, v_hat = m, v
        if bias_correction:
            m_hat = m / (1 - beta1 ** int(t))
            if correct_v:
                v_hat = v / (1 - beta2 ** int(t))
        return lr * m_hat / (v_hat.sqrt() + eps), {"m": m, "v": v, "t": t}

    return ServerOptimizer(init, update)


def adam(lr: float, betas=(0.9, 0.99), eps: float = 1e-3, bias_correction: bool = False) -> ServerOptimizer:
    """FedAdam: v ← β₂·v + (1 − β₂)·g²."""
    return _adaptive(lambda v, g2, b2: b2 * v + (1 - b2) * g2, lr, betas, eps, bias_correction, True)


def yogi(lr: float, betas=(0.9, 0.99), eps: float = 1e-3, bias_correction: bool = False) -> ServerOptimizer:
    """FedYogi: v ← v − (1 − β₂)·g²·sign(v − g²)."""
    return _adaptive(lambda v, g2, b2: v - (1 - b2) * g2 * torch.sign(v - g2), lr, betas, eps, bias_correction, True)


def adagrad(lr: float, betas=(0.9, 0.99), eps: float = 1e-3, bias_correction: bool = False) -> ServerOptimizer:
    """FedAdagrad: v ← v + g² (β₂ unused)."""
    return _adaptive(lambda v, g2, b2: v + g2, lr, betas, eps, bias_correction, False)


def from_keys(cfg, lr: float) -> ServerOptimizer:
    """The optimizer that ``algorithm.server_optimizer`` names, with its keys, at learning rate ``lr``."""
    name = cfg.server_optimizer
    if name == "sgd":
        return sgd(lr)
    if name == "momentum":
        return momentum(lr, cfg.server_momentum, cfg.server_nesterov)
    rule = {"adam": adam, "yogi": yogi, "adagrad": adagrad}[name]
    return rule(lr, tuple(cfg.server_betas), cfg.server_eps, cfg.server_bias_correction)
