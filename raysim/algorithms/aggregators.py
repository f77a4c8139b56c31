"""Aggregators: how a server step reduces its client updates ``[K, U]`` with weights ``[K]`` to one
update ``[U]``. Rows come in client-id order and sums run in that order, in float64, so the
result does not depend on which host computed which update.

An aggregator sees all of a step's updates at once (a synchronous round, a FedBuff buffer, or
FedAsync's single update), which is what robust rules (median, Krum, …) need.
"""

from __future__ import annotations

import numpy as np
import torch


def weighted_mean(updates: torch.Tensor, weights: np.ndarray) -> torch.Tensor:
    """Σ_k weights[k]·updates[k] in float64, accumulated in row order (weights sum to 1 in a
    synchronous round; FedAsync passes one update with its staleness weight)."""
    total = torch.zeros(updates.shape[1:], dtype=torch.float64)
    for w, row in zip(np.asarray(weights, dtype=np.float64).tolist(), updates):
        total.add_(row.double(), alpha=w)
    return total


AGGREGATORS = {"mean": weighted_mean}
