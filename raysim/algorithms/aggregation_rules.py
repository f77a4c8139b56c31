"""Aggregators: how a server step reduces its client updates to one update.

An aggregator is a function ``(updates: Tensor[K, P], weights: Tensor[K] | ndarray | None, **params) -> Tensor[P]``
with a float64 result. Rows come in client-id order; ``weights=None`` means uniform weights 1/K. It sees all of
a step's updates at once (a synchronous round, a FedBuff buffer, or FedAsync's single update).

``mean`` is the weighted mean. The robust rules treat all updates alike: they use the weights only through their
total, by which the result is scaled (1 in a synchronous round, the mean staleness weight of a FedBuff buffer,
s(τ) in FedAsync); ``geometric_median`` also weighs each update by its share w/Σw. All arithmetic runs in float64
on the input's device, deterministically, vectorized over coordinates.

They work on plain tensors (``median(torch.stack(updates))``); ``bucketing`` wraps any of them. A scenario picks
one by name from ``AGGREGATORS`` or its own with ``algorithm.aggregator: package.module:function``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from raysim.algorithms.aggregator_catalog import RULES
from raysim.robust_f import floor_share, largest_f


def _weight_list(weights) -> list:
    """Weights (a tensor on any device, an array or a sequence) as Python floats."""
    return weights.double().tolist() if isinstance(weights, torch.Tensor) else np.asarray(weights, np.float64).tolist()


def _weight_array(weights, count: int) -> np.ndarray:
    """The weights as a float64 array (uniform 1/K when None)."""
    return np.full(count, 1.0 / count) if weights is None else np.asarray(_weight_list(weights), np.float64)


def _scaled(result: torch.Tensor, weights) -> torch.Tensor:
    """A robust rule's result times the weights' total: the only way robust rules use the weights."""
    return result * (1.0 if weights is None else math.fsum(_weight_list(weights)))


def weighted_mean(updates: torch.Tensor, weights) -> torch.Tensor:
    """Σ_k weights[k]·updates[k] in float64, accumulated from +0 in row order."""
    total = torch.zeros(updates.shape[1:], dtype=torch.float64, device=updates.device)
    for w, row in zip(_weight_list(weights), updates):
        total.add_(row.double(), alpha=w)
    return total


def weighted_rows(updates: torch.Tensor, weights) -> torch.Tensor:
    """[K, ...]: :func:`weighted_mean` of each row alone (K steps of one update each, at once): 0 +
    weights[k]·updates[k] in float64, rounded as the loop's fused multiply-add rounds it (an exact
    zero is +0, a product too small for float64 keeps its sign)."""
    scale = torch.tensor(_weight_list(weights), dtype=torch.float64, device=updates.device)
    scale = scale.reshape(-1, *[1] * (updates.dim() - 1))
    product = updates * scale  # float64 by type promotion
    return torch.where((updates == 0) | (scale == 0), product + 0.0, product)


def mean(updates: torch.Tensor, weights=None) -> torch.Tensor:
    """The weighted mean (:func:`weighted_mean`; uniform 1/K weights when None)."""
    return weighted_mean(updates, _weight_array(weights, len(updates)))


def _coordinate_median(values: torch.Tensor) -> torch.Tensor:
    """Per-coordinate median in float64 (sorted in the input's dtype, which is exact); for an even count the
    average of the two middle values."""
    ordered, count = values.sort(dim=0).values, len(values)
    if count % 2:
        return ordered[count // 2].double()
    return (ordered[count // 2 - 1].double() + ordered[count // 2].double()) / 2


def median(updates: torch.Tensor, weights=None) -> torch.Tensor:
    """Coordinate-wise median (Yin, Chen, Ramchandran, Bartlett 2018, "Byzantine-Robust Distributed Learning:
    Towards Optimal Statistical Rates")."""
    return _scaled(_coordinate_median(updates), weights)


def trimmed_mean(updates: torch.Tensor, weights=None, *, trim: float = 0.1) -> torch.Tensor:
    """Per coordinate, the mean after dropping the ⌊trim·K⌋ largest and ⌊trim·K⌋ smallest values (Yin et al.
    2018, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates")."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"trimmed_mean needs 0 <= trim < 0.5, got trim={trim}")
    count = len(updates)
    cut = floor_share(trim, count)
    kept = updates.sort(dim=0).values[cut:count - cut]
    return _scaled(kept.double().mean(dim=0), weights)


def _distances_to_others(rows: torch.Tensor) -> torch.Tensor:
    """[K, K] squared Euclidean distances (Gram form on centred rows, symmetric); +inf on the diagonal and
    to and from a row with a non-finite value (it is farther than any other)."""
    finite = rows.isfinite().all(dim=1)
    centred = torch.where(finite[:, None], rows - rows[finite].mean(dim=0), 0.0)
    gram = centred @ centred.T
    norms = gram.diagonal()
    distances = (norms[:, None] + norms[None, :] - 2 * gram).clamp_(min=0)
    distances = (distances + distances.T) / 2
    distances[~finite] = math.inf
    distances[:, ~finite] = math.inf
    return distances.fill_diagonal_(math.inf)


def _krum_scores(distances: torch.Tensor, neighbours: int, finite: torch.Tensor) -> torch.Tensor:
    """Each row's sum of squared distances to its ``neighbours`` nearest other rows; a row of
    ``finite`` whose neighbours include a non-finite one still ranks before every non-finite row."""
    scores = distances.sort(dim=1).values[:, :neighbours].sum(dim=1)
    return torch.where(finite, scores.nan_to_num(posinf=torch.finfo(scores.dtype).max), math.inf)


def _check_krum(n: int, f: int) -> None:
    if f < 0:
        raise ValueError(f"krum needs f >= 0: f={f}")
    if f > largest_f("krum", n):
        raise ValueError(f"krum needs n - f - 2 >= 1 neighbours: n={n}, f={f}")


def krum(updates: torch.Tensor, weights=None, *, f: int = 0) -> torch.Tensor:
    """The update with the lowest Krum score, the sum of squared distances to its n − f − 2 nearest other updates
    (ties: lowest row index). With n <= 2 there is no neighbour structure: the plain mean. Blanchard, El Mhamdi,
    Guerraoui, Stainer 2017, "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent"."""
    rows, n = updates.double(), len(updates)
    if n <= 2:
        return _scaled(rows.mean(dim=0), weights)
    _check_krum(n, f)
    scores = _krum_scores(_distances_to_others(rows), n - f - 2, rows.isfinite().all(dim=1))
    return _scaled(rows[int(scores.argmin())], weights)


def multi_krum(updates: torch.Tensor, weights=None, *, f: int = 0, m: int | None = None) -> torch.Tensor:
    """Plain mean of the m updates with the lowest Krum scores (m=None: n − f; ties: lowest row index); n <= 2:
    the plain mean. Blanchard et al. 2017, "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent"."""
    rows, n = updates.double(), len(updates)
    if n <= 2:
        return _scaled(rows.mean(dim=0), weights)
    _check_krum(n, f)
    m = n - f if m is None else m
    if not 1 <= m <= n - f:
        raise ValueError(f"multi_krum needs 1 <= m <= n - f: n={n}, f={f}, m={m}")
    scores = _krum_scores(_distances_to_others(rows), n - f - 2, rows.isfinite().all(dim=1))
    chosen = scores.sort(stable=True).indices[:m].sort().values
    return _scaled(rows[chosen].mean(dim=0), weights)


def geometric_median(updates: torch.Tensor, weights=None, *, nu: float = 1e-6, iterations: int = 10,
                     tol: float = 1e-8) -> torch.Tensor:
    """RFA: the smoothed Weiszfeld iteration v ← Σ β_i x_i / Σ β_i, β_i = α_i / max(ν, ‖v − x_i‖), α = w/Σw, from
    the weighted mean; stops after ``iterations`` or when Σ α_i ‖v − x_i‖ changes by less than ``tol`` relatively.
    Pillutla, Kakade, Harchaoui 2022, "Robust Aggregation for Federated Learning"."""
    rows = updates.double()
    shares = torch.as_tensor(_weight_array(weights, len(rows)), device=rows.device)
    shares = shares / shares.sum()
    centre = shares @ rows
    distances = torch.linalg.vector_norm(rows - centre, dim=1)
    objective = shares @ distances
    for _ in range(iterations):
        betas = shares / distances.clamp(min=nu)
        centre = (betas / betas.sum()) @ rows
        distances = torch.linalg.vector_norm(rows - centre, dim=1)
        previous, objective = objective, shares @ distances
        if abs(previous - objective) <= tol * previous:
            break
    return _scaled(centre, weights)


def centered_clipping(updates: torch.Tensor, weights=None, *, radius: float = 1.0, iterations: int = 1,
                      start: torch.Tensor | None = None) -> torch.Tensor:
    """v ← v + (1/n) Σ (x_i − v)·min(1, radius/‖x_i − v‖), ``iterations`` times from ``start`` (the previous
    aggregate; None: zeros). Karimireddy, He, Jaggi 2021, "Learning from History for Byzantine Robust
    Optimization"."""
    rows = updates.double()
    centre = torch.zeros(rows.shape[1:], dtype=torch.float64, device=rows.device) if start is None \
        else start.to(rows.device, torch.float64)
    for _ in range(iterations):
        offsets = rows - centre
        factors = (radius / torch.linalg.vector_norm(offsets, dim=1)).clamp(max=1)
        centre = centre + (factors / len(rows)) @ offsets
    return _scaled(centre, weights)


def bulyan(updates: torch.Tensor, weights=None, *, f: int = 0) -> torch.Tensor:
    """Select θ = n − 2f updates by Krum applied repeatedly to the remaining ones (each pick removed; once fewer
    than n − f − 2 >= 1 neighbours remain, the score sums the distances to all other remaining ones), then per
    coordinate average the β = θ − 2f selected values closest to their median (ties: earlier pick). Needs
    n >= 4f + 3; with f = 0 and n < 3, the plain mean. El Mhamdi, Guerraoui, Rouault 2018, "The Hidden
    Vulnerability of Distributed Learning in Byzantium"."""
    rows, n = updates.double(), len(updates)
    if f == 0 and n < 3:
        return _scaled(rows.mean(dim=0), weights)
    if f < 0 or f > largest_f("bulyan", n):
        raise ValueError(f"bulyan needs f >= 0 and n >= 4f + 3: n={n}, f={f}")
    distances, remaining, picked = _distances_to_others(rows), list(range(n)), []
    finite = rows.isfinite().all(dim=1)
    for _ in range(n - 2 * f):
        left = len(remaining)
        neighbours = left - f - 2 if left - f - 2 >= 1 else left - 1
        scores = _krum_scores(distances[remaining][:, remaining], neighbours, finite[remaining])
        picked.append(remaining.pop(int(scores.argmin())))
    selected = rows[picked]
    closeness = (selected - _coordinate_median(selected)).abs().sort(dim=0, stable=True).indices
    closest = selected.gather(0, closeness[:len(picked) - 2 * f])
    return _scaled(closest.mean(dim=0), weights)


def bucketing(updates: torch.Tensor, weights=None, *, rule, bucket_size: int, rng: np.random.Generator,
              **params) -> torch.Tensor:
    """``rule(bucket means, bucket weights, **params)``: rows permuted by ``rng.permutation(K)``, cut into
    consecutive buckets of ``bucket_size`` (the last may be smaller); a bucket's vector is the plain mean of its
    rows, its weight their weights' sum. bucket_size 1: ``rule(updates, weights, **params)``, no draw. Karimireddy,
    He, Jaggi 2022, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing"."""
    if bucket_size < 1:
        raise ValueError(f"bucketing needs bucket_size >= 1, got bucket_size={bucket_size}")
    if bucket_size == 1:
        return rule(updates, weights, **params)
    count = len(updates)
    order, shares = rng.permutation(count), _weight_array(weights, count)
    buckets = [order[start:start + bucket_size] for start in range(0, count, bucket_size)]
    vectors = torch.stack([updates[torch.as_tensor(b, device=updates.device)].double().mean(dim=0) for b in buckets])
    return rule(vectors, np.array([math.fsum(shares[b]) for b in buckets]), **params)


AGGREGATORS = {name: globals()[rule.function.rpartition(":")[2]]  # the built-in rules are this module's functions
               for name, rule in RULES.items()}
