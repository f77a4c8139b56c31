"""Client transforms: what a local step does to a gradient before it moves the parameters.

In the spirit of optax's ``GradientTransformation``: a transform is a pair of pure functions
``init(params) -> state`` and ``update(grads, state, params) -> (updates, state)``, and
:func:`chain` composes them left to right. Every array is ``[C, P]``: one row per client of a
task (``params`` are the clients' current parameters). The local loop
(:func:`raysim.algorithms.local.local_train`) subtracts the final updates from the parameters,
so the learning rate is the last transform (:func:`scale`).

A method is mostly a choice of terms: FedProx adds :func:`add_proximal` toward the model it
received, SCAFFOLD :func:`add_correction` by c − c_i, FedDyn both; weight decay, clipping,
the unreliable-agent model's gradient noise and participation scaling apply to every algorithm alike.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np
import torch


class ClientTransform(NamedTuple):
    """``init(params) -> state``; ``update(grads, state, params) -> (updates, state)``."""

    init: Callable[[torch.Tensor], Any]
    update: Callable[[torch.Tensor, Any, torch.Tensor], tuple[torch.Tensor, Any]]


def stateless(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> ClientTransform:
    """A transform without state: ``fn(grads, params) -> updates``."""
    return ClientTransform(lambda params: None, lambda grads, state, params: (fn(grads, params), state))


def chain(*transforms: ClientTransform) -> ClientTransform:
    """Apply ``transforms`` in order; the state is the tuple of their states."""

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(grads, state, params):
        new_state = []
        for t, s in zip(transforms, state):
            grads, s = t.update(grads, s, params)
            new_state.append(s)
        return grads, tuple(new_state)

    return ClientTransform(init, update)


def add_proximal(mu: float, anchor: torch.Tensor) -> ClientTransform:
    """Gradient of (μ/2)‖v − anchor‖²: adds μ·(params − anchor) (FedProx, FedACG, FedDyn)."""
    return stateless(lambda g, p: g + mu * (p - anchor))


def add_correction(correction: torch.Tensor) -> ClientTransform:
    """Gradient of the linear term ⟨correction, v⟩: adds ``correction`` [C, P] (SCAFFOLD's
    c − c_i; FedDyn's −g_i)."""
    return stateless(lambda g, p: g + correction)


def clip_by_norm(max_norm: float) -> ClientTransform:
    """Scale each client's gradient down to Euclidean norm ``max_norm`` if it is longer."""

    def clip(g, p):
        norm = torch.linalg.vector_norm(g, dim=1, keepdim=True)
        return g * torch.clamp(max_norm / norm.clamp_min(torch.finfo(g.dtype).tiny), max=1.0)

    return stateless(clip)


def add_weight_decay(weight_decay: float) -> ClientTransform:
    """Gradient of (wd/2)‖v‖²: adds wd·params."""
    return stateless(lambda g, p: g + weight_decay * p)


def add_noise(kind: str, scale: float, rngs: list) -> ClientTransform:
    """Perturbed SGD (unreliable-agent model): adds Gaussian N(0, scale²) or Laplace(0, scale) noise to every
    coordinate, drawn from each client's own generator (one draw per step and client)."""
    draw = ((lambda r, n: r.normal(0.0, scale, n)) if kind == "gaussian" else
            (lambda r, n: r.laplace(0.0, scale, n)))

    def perturb(g, p):
        noise = np.stack([draw(r, g.shape[1]) for r in rngs]).astype(np.float32 if g.dtype == torch.float32 else np.float64)
        return g + torch.from_numpy(noise).to(g.device)

    return stateless(perturb)


def scale_by_participation(scales: torch.Tensor) -> ClientTransform:
    """Unreliable agents: the gradient of local step s times ``scales[s, c]``, 1/δ_c when
    client c computed at that step and 0 when it did not (the expected step is unchanged).
    The state counts this transform's steps."""

    def update(grads, step, params):
        return grads * scales[step][:, None], step + 1

    return ClientTransform(lambda params: 0, update)


def mask(entries: torch.Tensor) -> ClientTransform:
    """Only the ``entries`` ([P] bool) move, e.g. the personal part when fine-tuning w."""
    return stateless(lambda g, p: g * entries.to(g))


def scale(step_size) -> ClientTransform:
    """Multiply by the step size (a number, or one per client as a [C] tensor)."""
    if isinstance(step_size, torch.Tensor):
        return stateless(lambda g, p: g * step_size.to(g)[:, None])
    return stateless(lambda g, p: g * step_size)
