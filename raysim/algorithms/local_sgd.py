"""Vectorized local training: many clients' minibatch SGD in lockstep (torch.func.vmap).

Clients of one task run the same step function at once; a client whose work
is done (fewer samples, fewer steps) is masked out, so its parameters stop
changing. The batch order of a client depends only on its own RNG, so a
client's result does not depend on which other clients share its task.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap

from raysim.models import FlatModel


@dataclass
class BatchSchedule:
    """Row indices of every local step of every client: ``rows[s, c, b]`` with ``mask`` 0 for
    padding, and ``scale[s, c]`` multiplying the step (0: no step; 1/δ_k: an unreliable
    client that did compute, see [SO])."""

    rows: torch.Tensor  # [S, C, B] int64, global row numbers
    mask: torch.Tensor  # [S, C, B] float32
    scale: torch.Tensor  # [S, C] float32
    steps: np.ndarray  # [C] real steps per client


def batch_schedule(starts: np.ndarray, sizes: np.ndarray, rngs: list, batch_size: int,
                   epochs: int, steps: int | None, client_steps: np.ndarray | None = None,
                   participation: np.ndarray | None = None) -> BatchSchedule:
    """Minibatches for clients whose rows are ``starts[c] : starts[c] + sizes[c]``.

    With ``steps`` unset, each of ``epochs`` passes shuffles the client's rows and
    cuts them into batches (the last one may be short); with ``steps`` set, the
    client takes that many batches from a stream of shuffled passes. ``client_steps``
    (> 0) overrides the step count per client (heterogeneous E_k). With
    ``participation`` δ_k < 1, each step happens with probability δ_k and is then
    scaled by 1/δ_k, so the expected update is unchanged.
    """
    per_client, scales = [], []
    for c, (start, size, rng) in enumerate(zip(starts, sizes, rngs)):
        size = int(size)
        own_steps = int(client_steps[c]) if client_steps is not None and client_steps[c] > 0 else steps
        if own_steps is None:
            batches = []
            for _ in range(epochs):
                perm = rng.permutation(size)
                batches += [perm[i:i + batch_size] for i in range(0, size, batch_size)]
        else:
            passes = -(-own_steps * batch_size // size)
            stream = np.concatenate([rng.permutation(size) for _ in range(passes)])
            batches = [stream[i * batch_size:(i + 1) * batch_size] for i in range(own_steps)]
        per_client.append([b + start for b in batches])
        delta = 1.0 if participation is None else float(participation[c])
        coins = np.ones(len(batches), bool) if delta >= 1.0 else rng.random(len(batches)) < delta
        scales.append(np.where(coins, 1.0 / delta, 0.0))
    num_steps = np.array([len(b) for b in per_client])
    width = max(len(b) for batches in per_client for b in batches)
    rows = np.zeros((num_steps.max(), len(per_client), width), dtype=np.int64)
    mask = np.zeros(rows.shape, dtype=np.float32)
    scale = np.zeros(rows.shape[:2], dtype=np.float32)
    for c, batches in enumerate(per_client):
        scale[:len(batches), c] = scales[c]
        for s, b in enumerate(batches):
            rows[s, c, :len(b)] = b
            mask[s, c, :len(b)] = 1.0
    return BatchSchedule(torch.from_numpy(rows), torch.from_numpy(mask), torch.from_numpy(scale), num_steps)


def per_client_loss(forward, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each client's unmasked rows: params [C, P], x [C, B, ...] -> [C]."""
    logits = forward(params, x)
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
    return (losses * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def client_forward(model: FlatModel, num_clients: int):
    """``forward(params [C, P], x [C, B, ...]) -> logits [C, B, K]``: vmapped over clients (a lone
    client skips vmap's overhead)."""
    return vmap(model.logits) if num_clients > 1 else (lambda p, x: model.logits(p[0], x[0])[None])


def local_sgd(model: FlatModel, start: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
              schedule: BatchSchedule, lr: float, weight_decay: float = 0.0, noise=None,
              update_mask: torch.Tensor | None = None):
    """Run every client's SGD steps; ``start`` is [C, P]. Returns (final [C, P], mean loss [C]).
    With ``update_mask`` ([P] bool) only those entries move (e.g. fine-tuning the personal part).

    The forward pass is vmapped over clients (a lone client skips vmap's overhead);
    one backward pass of the summed per-client losses gives every client's own
    gradient (client c's loss depends only on its own row of parameters). ``noise`` = (kind, scale, rngs) adds
    Gaussian or Laplace perturbations to every local gradient, drawn from each
    client's own generator ([SO] perturbed SGD).
    """
    forward = client_forward(model, start.shape[0])
    device = start.device
    rows, mask, scale = schedule.rows.to(device), schedule.mask.to(device), schedule.scale.to(device)
    params = start.detach().clone()
    loss_sum = torch.zeros(start.shape[0], dtype=torch.float64, device=device)
    for s in range(rows.shape[0]):
        leaf = params.requires_grad_(True)
        loss = per_client_loss(forward, leaf, features[rows[s]], labels[rows[s]], mask[s])
        (grads,) = torch.autograd.grad(loss.sum(), leaf)
        with torch.no_grad():
            if weight_decay:
                grads = grads + weight_decay * params
            if noise is not None:
                grads = grads + _perturbation(noise, params.shape).to(device)
            if update_mask is not None:
                grads = grads * update_mask.to(device)
            params = params - (lr * scale[s])[:, None] * grads
            loss_sum += (loss * (mask[s].sum(1) > 0)).double()
    steps = torch.as_tensor(schedule.steps, dtype=torch.float64, device=device)
    return params.detach(), (loss_sum / steps).float()


def _perturbation(noise, shape) -> torch.Tensor:
    kind, scale, rngs = noise
    draw = (lambda r: r.normal(0.0, scale, shape[1])) if kind == "gaussian" else \
        (lambda r: r.laplace(0.0, scale, shape[1]))
    return torch.from_numpy(np.stack([draw(r) for r in rngs]).astype(np.float32))


def evaluate_rows(model: FlatModel, flat: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
                  chunk: int = 8192) -> tuple[float, int]:
    """(sum of cross-entropy, number correct) of parameters ``flat`` over the given rows."""
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, features.shape[0], chunk):
            logits = model.logits(flat, features[i:i + chunk])
            y = labels[i:i + chunk]
            loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(1) == y).sum())
    return loss, correct
