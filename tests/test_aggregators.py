"""The aggregators of raysim.algorithms.aggregation_rules against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raysim.algorithms.aggregation_rules import (AGGREGATORS, bucketing, bulyan, centered_clipping, geometric_median,
                                                 krum, mean, median, multi_krum, trimmed_mean, weighted_mean,
                                                 weighted_rows)
from raysim.algorithms.aggregator_catalog import AGGREGATOR_DOCS
from raysim.robust_f import capped_f

ROBUST = ["median", "trimmed_mean", "krum", "multi_krum", "centered_clipping", "bulyan"]


def column(*values) -> torch.Tensor:
    """K one-coordinate updates [K, 1] in float64."""
    return torch.tensor([[v] for v in values], dtype=torch.float64)


def params_for(name: str, count: int) -> dict:
    """Valid parameters of a rule for ``count`` updates (krum-like rules with f = 1 where they accept it)."""
    f = capped_f(count, 1, name)
    return {"krum": {"f": f}, "multi_krum": {"f": f}, "bulyan": {"f": f}}.get(name, {})


def test_registry_and_docs_name_the_same_rules():
    assert set(AGGREGATORS) == set(AGGREGATOR_DOCS) == {"mean", *ROBUST, "geometric_median"}


def test_weighted_mean_is_the_row_order_float64_loop():
    updates = torch.randn(7, 13, generator=torch.Generator().manual_seed(3))  # float32
    weights = np.array([0.1, 0.3, 0.05, 0.2, 0.15, 0.12, 0.08])
    expected = torch.zeros(13, dtype=torch.float64)
    for w, row in zip(weights.tolist(), updates):
        expected.add_(row.double(), alpha=w)
    assert torch.equal(weighted_mean(updates, weights), expected)
    assert torch.equal(weighted_mean(updates, list(weights)), expected)
    assert torch.equal(mean(updates, weights), expected)
    assert torch.equal(mean(column(1, 2, 6)), weighted_mean(column(1, 2, 6), np.full(3, 1 / 3)))  # None: 1/K
    assert mean(column(1, 2, 6)).item() == pytest.approx(3.0, abs=1e-15)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_rows_are_the_one_row_means_bits(dtype):
    """A window of FedAsync steps aggregates its updates at once: each row the bits of
    :func:`weighted_mean` of that row alone, signed zeros (0 + −0 = +0), infinities, tiny values and
    products too small for float64 included; the input is left as it was."""
    rows = torch.randn(5, 64, generator=torch.Generator().manual_seed(5), dtype=dtype) * 1e30
    rows[:, :6] = torch.tensor([0.0, -0.0, math.inf, -math.inf, 1e-38, -1e-38])
    if dtype == torch.float64:
        rows[:, 6:8] = torch.tensor([-1e-200, 1e-200], dtype=dtype)  # times 1e-200: below float64's range
    kept = rows.clone()
    weights = [1.0, 0.5, 1 / 3, 1e-200, 0.0]
    got = weighted_rows(rows, weights)
    assert got.dtype == torch.float64 and got.shape == rows.shape
    for row, w, aggregate in zip(rows, weights, got):
        expected = weighted_mean(row[None], [w])
        assert torch.equal(aggregate.view(torch.int64), expected.view(torch.int64)), w
    assert torch.equal(rows.view(torch.uint8), kept.view(torch.uint8))


def test_median_odd_even_and_per_coordinate():
    assert median(column(1, 2, 3, 100)).tolist() == [2.5]
    assert median(column(1, 2, 100)).tolist() == [2.0]
    two = torch.tensor([[1.0, 9.0], [5.0, -1.0], [3.0, 4.0], [1e9, 2.0]])
    assert median(two).tolist() == [4.0, 3.0]  # (3 + 5) / 2 and (2 + 4) / 2


def test_trimmed_mean_drops_the_extremes():
    assert trimmed_mean(column(1, 2, 3, 100), trim=0.25).tolist() == [2.5]  # drops 1 and 100
    assert trimmed_mean(column(-1000, 2, 3, 4, 1000), trim=0.2).tolist() == [3.0]  # floor(0.2·5) = 1 each side
    assert trimmed_mean(column(1, 2, 3, 100), trim=0.2).tolist() == [26.5]  # floor(0.8) = 0: the plain mean
    assert trimmed_mean(column(*range(99), 1e9), trim=0.29).tolist() == [49.5]  # 29 cut each side, not 28


def test_krum_picks_the_hand_scored_point():
    # f = 1, n = 5: each score sums the n - f - 2 = 2 nearest squared distances.
    # 0: 1 (to 1) + 4 (to 2) = 5;  1: 1 + 1 = 2;  2: 1 + 4 = 5;  4: 4 + 9 = 13;  98: 94² + 96² = 18052
    updates = column(0, 1, 2, 4, 98)
    assert krum(updates, f=1).tolist() == [1.0]
    assert krum(column(0, 98, 1, 2, 4), f=1).tolist() == [1.0]  # same set, other order: never the outlier
    # 2-D: the square's corners score alike (1 + 1 with f = 1, n = 5); the tie goes to the lowest row.
    # (Distances come from a Gram matrix of the rows minus their mean: the data keep that mean exact.)
    corners = torch.tensor([[48.0, 48.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    assert krum(corners, f=1).tolist() == [1.0, 1.0]


def test_multi_krum_averages_the_best_scores():
    updates = column(0, 1, 2, 4, 98)  # scores 5, 2, 5, 13, 18052 (see the krum test)
    assert multi_krum(updates, f=1, m=1).tolist() == [1.0]
    assert multi_krum(updates, f=1, m=2).tolist() == [0.5]  # 1, then the tie 0 / 2 goes to row 0
    assert multi_krum(updates, f=1, m=3).tolist() == [1.0]
    assert multi_krum(updates, f=1).tolist() == [1.75]  # m = n - f = 4: (0 + 1 + 2 + 4) / 4


def test_bulyan_hand_case_n7_f1():
    # θ = 5 picks by Krum on the remaining set, β = 3 values closest to the median.
    # 7 left (4 neighbours): 0:46 1:27 2:18 4:30 5:51 → 2.   6 left (3): 1:26 4:26 → 1 (lower row).
    # 5 left (2): 0:41 4:17 5:26 → 4.   4 left (1): 0:25 5:25 → 0 (lower row).
    # 3 left: n - f - 2 = 0, so all 2 others: 5: 95² + 117² = 22714 beats 100 and -112 → 5.
    # Picks 2, 1, 4, 0, 5; median 2; closest: 2 (0), 1 (1), then 4 and 0 tie at 2 → 4, the earlier pick.
    updates = column(0, 1, 2, 4, 5, 100, -112)
    assert bulyan(updates, f=1).item() == pytest.approx(7 / 3, abs=1e-15)
    assert bulyan(column(3, 1, 2), f=0).item() == pytest.approx(2.0, abs=1e-15)  # f = 0: the mean of all


def test_centered_clipping_one_and_two_steps():
    updates = torch.tensor([[3.0, 4.0], [0.0, 0.5], [0.0, 0.0]])
    # from 0 with radius 1: (3, 4) has norm 5 → scaled by 1/5; the others are inside the radius
    expected = [(0.6 + 0 + 0) / 3, (0.8 + 0.5 + 0) / 3]
    assert centered_clipping(updates, radius=1.0).tolist() == pytest.approx(expected, abs=1e-15)
    # from (1, 1) with radius 2.5: (1, 1) has offset 0, (4, 5) offset (3, 4) of norm 5 → half → (1.75, 2)
    two = torch.tensor([[1.0, 1.0], [4.0, 5.0]])
    assert centered_clipping(two, radius=2.5, start=torch.tensor([1.0, 1.0])).tolist() == [1.75, 2.0]
    # a second step from (1.75, 2): offsets (-0.75, -1) (norm 1.25) and (2.25, 3) (norm 3.75 → ×2/3)
    assert centered_clipping(two, radius=2.5, iterations=2, start=torch.tensor([1.0, 1.0])).tolist() == \
        pytest.approx([1.75 + (-0.75 + 1.5) / 2, 2.0 + (-1.0 + 2.0) / 2], abs=1e-15)


def test_geometric_median_hand_cases():
    corners = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0]])
    assert geometric_median(corners).tolist() == pytest.approx([1.0, 1.0], abs=1e-12)
    assert geometric_median(column(0, 1, 10), iterations=100, tol=0).item() == pytest.approx(1.0, abs=1e-6)
    # (-1, 0), (1, 0), (0, 100): the Fermat point sees the base under 120°, so it sits at (0, tan 30°)
    triangle = torch.tensor([[-1.0, 0.0], [1.0, 0.0], [0.0, 100.0]])
    assert geometric_median(triangle, iterations=100, tol=0).tolist() == pytest.approx([0, 1 / math.sqrt(3)], abs=1e-4)
    # weight 3 of 5 at 2 pulls the weighted median onto 2; the result is scaled by the total 5
    assert geometric_median(column(2, 3, 10), np.array([3.0, 1.0, 1.0]), iterations=100).item() == \
        pytest.approx(10.0, abs=1e-4)


def test_weiszfeld_objective_never_increases():
    points = torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0], [9.0, 9.0], [-5.0, 2.0]])

    def objective(z):
        return sum(math.dist(z.tolist(), p) for p in points.tolist())

    values = [objective(geometric_median(points, iterations=i, tol=0)) for i in range(12)]
    assert all(later <= earlier + 1e-12 for earlier, later in zip(values, values[1:]))
    assert values[-1] < values[0]


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_equal_inputs_give_that_input(name):
    row = torch.tensor([0.1, -3.0, 7.25, 1e-8], dtype=torch.float64)
    for count in (1, 2, 3, 7):
        params = {"radius": math.inf} if name == "centered_clipping" else params_for(name, count)
        result = AGGREGATORS[name](row.repeat(count, 1), None, **params)
        assert result.dtype == torch.float64
        assert torch.allclose(result, row, rtol=0, atol=1e-12), (name, count)


def test_one_huge_update_among_equal_ones():
    updates = column(2, 2, 2, 2, 2, 2, 1e12)
    for name in ("median", "krum", "multi_krum", "bulyan"):
        assert AGGREGATORS[name](updates, None, **params_for(name, 7)).tolist() == [2.0], name
    assert trimmed_mean(updates, trim=0.2).tolist() == [2.0]
    # Weiszfeld shrinks the distance to 2 about sixfold a step from the mean 1.4e11, but the objective, dominated
    # by the huge one, changes by less than the default tol long before: tol=0 iterates until it stops changing
    assert geometric_median(updates, iterations=40, tol=0).item() == pytest.approx(2.0, abs=1e-5)
    # from the common value, only the huge one moves the centre: by radius / n
    assert centered_clipping(updates, radius=1.0, start=torch.tensor([2.0])).item() == pytest.approx(2 + 1 / 7)
    assert mean(updates).item() > 1e11


def test_robust_rules_scale_by_the_weights_total():
    updates = column(1, 2, 3, 100, 7, 4, 5)
    weights = np.full(7, 0.5 / 7)  # sum 0.5
    for name in ROBUST:
        params = params_for(name, 7)
        assert torch.equal(AGGREGATORS[name](updates, weights, **params),
                           AGGREGATORS[name](updates, None, **params) * math.fsum(weights)), name
    assert median(column(1, 2, 3, 100), np.array([0.25, 0.25, 0.0, 0.0])).tolist() == [1.25]
    assert median(column(1, 2, 3, 100), torch.tensor([1.0, 0.5, 0.25, 0.25])).tolist() == [5.0]


def test_error_messages_name_the_numbers():
    with pytest.raises(ValueError, match=r"n - f - 2 >= 1 neighbours: n=4, f=2"):
        krum(column(1, 2, 3, 4), f=2)
    with pytest.raises(ValueError, match=r"n=5, f=1, m=5"):
        multi_krum(column(1, 2, 3, 4, 5), f=1, m=5)
    with pytest.raises(ValueError, match=r"n=5, f=1, m=0"):
        multi_krum(column(1, 2, 3, 4, 5), f=1, m=0)
    with pytest.raises(ValueError, match=r"n >= 4f \+ 3: n=6, f=1"):
        bulyan(column(1, 2, 3, 4, 5, 6), f=1)
    with pytest.raises(ValueError, match=r"trim=0.5"):
        trimmed_mean(column(1, 2), trim=0.5)
    with pytest.raises(ValueError, match=r"bucket_size=0"):
        bucketing(column(1, 2), rule=mean, bucket_size=0, rng=np.random.default_rng(0))


def test_small_sets_and_capped_f():
    assert krum(column(4, 8), f=3).tolist() == [6.0]  # n <= 2: the mean, whatever f
    assert multi_krum(column(4), f=3).tolist() == [4.0]
    assert bulyan(column(4, 8)).tolist() == [6.0]
    assert [capped_f(n, 2, "krum") for n in (2, 3, 4, 5, 9)] == [2, 0, 1, 2, 2]
    assert [capped_f(n, 2, bulyan) for n in (2, 3, 7, 10, 11)] == [0, 0, 1, 1, 2]
    assert capped_f(4, 2, median) == 2
    generator = torch.Generator().manual_seed(2)
    for n in range(1, 12):  # the capped f is accepted
        for rule in (krum, multi_krum, bulyan):
            rule(torch.randn(n, 3, generator=generator), f=capped_f(n, 3, rule))


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_bucket_size_one_is_the_rule_itself(name):
    updates = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))
    params = params_for(name, 7)
    for weights in (None, np.linspace(0.05, 0.25, 7)):
        rng = np.random.default_rng(0)
        got = bucketing(updates, weights, rule=AGGREGATORS[name], bucket_size=1, rng=rng, **params)
        assert torch.equal(got, AGGREGATORS[name](updates, weights, **params))
        assert rng.bit_generator.state == np.random.default_rng(0).bit_generator.state  # no draw


def test_bucketing_means_follow_the_permutation():
    updates = column(10, 20, 30, 40, 50)
    weights = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    seen = []

    def recording(vectors, bucket_weights):
        seen.append((vectors, bucket_weights))
        return vectors[0]

    bucketing(updates, weights, rule=recording, bucket_size=2, rng=np.random.default_rng(0))
    order = np.random.default_rng(0).permutation(5).tolist()
    buckets = [order[0:2], order[2:4], order[4:5]]
    vectors, bucket_weights = seen[0]
    assert vectors.tolist() == [[sum(10.0 * (i + 1) for i in b) / len(b)] for b in buckets]
    assert bucket_weights.tolist() == pytest.approx([sum(weights[i] for i in b) for b in buckets], abs=1e-15)
    bucketing(updates, None, rule=recording, bucket_size=2, rng=np.random.default_rng(0))
    assert seen[1][1].tolist() == pytest.approx([0.4, 0.4, 0.2], abs=1e-15)
    first, again = (bucketing(torch.randn(9, 4, generator=torch.Generator().manual_seed(5)), None, rule=median,
                              bucket_size=2, rng=np.random.default_rng(7)) for _ in range(2))
    assert torch.equal(first, again)


def test_rules_are_vectorized_over_large_updates():
    updates = torch.randn(20, 200_000, generator=torch.Generator().manual_seed(0))  # float32
    for name, rule in AGGREGATORS.items():
        result = rule(updates, None, **params_for(name, 20))
        assert result.shape == (200_000,) and result.dtype == torch.float64, name
        assert torch.isfinite(result).all(), name


def test_krum_and_bulyan_treat_a_non_finite_input_as_the_farthest():
    rows = column(1.0, 2.0, 3.0, 2.5, 1.5, 2.0, math.nan)
    # n = 7, f = 1: 4 nearest. Scores: 2.0 -> 0 + 0.25 + 0.25 + 1 = 1.5 (twice), 2.5 and 1.5 -> 1.75, 1 and 3 more
    assert krum(rows, f=1).item() == 2.0
    assert multi_krum(rows, f=1, m=2).item() == 2.0
    assert math.isfinite(bulyan(rows, f=1).item())


def test_krum_picks_a_finite_input_even_when_every_score_meets_a_non_finite_one():
    rows = column(math.nan, 1.0, math.nan, 2.0, math.nan)  # n = 5, f = 1: 2 neighbours, so every score meets a NaN
    assert krum(rows, f=1).item() == 1.0  # the finite rows tie (both inf): the lower index


def test_centered_clipping_in_a_run_starts_from_its_unscaled_centre():
    from types import SimpleNamespace

    from raysim.algorithms.aggregation import ServerAggregator

    cfg = SimpleNamespace(aggregator="centered_clipping", bucket_size=1, clip_radius=0.5, clip_iterations=1)
    aggregate, state = ServerAggregator(cfg, seed=0), {}
    for centre in (0.5, 1.0, 1.0):  # from 0: one clipped step of 0.5 toward 1, then 1 exactly
        out, state = aggregate(torch.ones(4, 1, dtype=torch.float64), np.full(4, 0.125), state)
        assert out.item() == 0.5 * centre  # the weights' total (a FedBuff buffer's staleness) scales only the output
