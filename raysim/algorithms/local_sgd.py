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
    """Row indices of every local step of every client: ``rows[s, c, b]`` with ``mask`` 0 for padding."""

    rows: torch.Tensor  # [S, C, B] int64, global row numbers
    mask: torch.Tensor  # [S, C, B] float32
    steps: np.ndarray  # [C] real steps per client


def batch_schedule(starts: np.ndarray, sizes: np.ndarray, rngs: list, batch_size: int,
                   epochs: int, steps: int | None) -> BatchSchedule:
    """Minibatches for clients whose rows are ``starts[c] : starts[c] + sizes[c]``.

    With ``steps`` unset, each of ``epochs`` passes shuffles the client's rows and
    cuts them into batches (the last one may be short); with ``steps`` set, the
    client takes that many batches from a stream of shuffled passes.
    """
    per_client = []
    for start, size, rng in zip(starts, sizes, rngs):
        size = int(size)
        if steps is None:
            batches = []
            for _ in range(epochs):
                perm = rng.permutation(size)
                batches += [perm[i:i + batch_size] for i in range(0, size, batch_size)]
        else:
            passes = -(-steps * batch_size // size)
            stream = np.concatenate([rng.permutation(size) for _ in range(passes)])
            batches = [stream[i * batch_size:(i + 1) * batch_size] for i in range(steps)]
        per_client.append([b + start for b in batches])
    num_steps = np.array([len(b) for b in per_client])
    width = max(len(b) for batches in per_client for b in batches)
    rows = np.zeros((num_steps.max(), len(per_client), width), dtype=np.int64)
    mask = np.zeros(rows.shape, dtype=np.float32)
    for c, batches in enumerate(per_client):
        for s, b in enumerate(batches):
            rows[s, c, :len(b)] = b
            mask[s, c, :len(b)] = 1.0
    return BatchSchedule(torch.from_numpy(rows), torch.from_numpy(mask), num_steps)


def per_client_loss(forward, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each client's unmasked rows: params [C, P], x [C, B, ...] -> [C]."""
    logits = forward(params, x)
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
    return (losses * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def local_sgd(model: FlatModel, start: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
              schedule: BatchSchedule, lr: float, weight_decay: float = 0.0):
    """Run every client's SGD steps; ``start`` is [C, P]. Returns (final [C, P], mean loss [C]).

    The forward pass is vmapped over clients; one backward pass of the summed
    per-client losses gives every client's own gradient (client c's loss depends
    only on its own row of parameters).
    """
    forward = vmap(model.logits)
    device = start.device
    rows, mask = schedule.rows.to(device), schedule.mask.to(device)
    params = start.detach().clone()
    loss_sum = torch.zeros(start.shape[0], dtype=torch.float64, device=device)
    for s in range(rows.shape[0]):
        active = (mask[s].sum(1) > 0).to(params.dtype)
        leaf = params.requires_grad_(True)
        loss = per_client_loss(forward, leaf, features[rows[s]], labels[rows[s]], mask[s])
        (grads,) = torch.autograd.grad(loss.sum(), leaf)
        with torch.no_grad():
            if weight_decay:
                grads = grads + weight_decay * params
            params = params - (lr * active)[:, None] * grads
            loss_sum += (loss * active).double()
    steps = torch.as_tensor(schedule.steps, dtype=torch.float64, device=device)
    return params.detach(), (loss_sum / steps).float()


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
