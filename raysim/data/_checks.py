"""Checks of scenario values shared by the data builders, and their shared arithmetic."""

from __future__ import annotations

import numbers

from raysim.data.federated import MAX_CLIENTS
from raysim.errors import ScenarioError

QUADRATIC_THREADS = 8  # at most this many quadratic clients are drawn and reduced at once (the population pass)


def quadratic_shapes(d_theta: int, d_w: int) -> dict:
    """A quadratic client's statistics ``P, q, C, D, e, c`` and their shapes, in that order."""
    return {"P": (d_theta, d_theta), "q": (d_theta,), "C": (d_theta, d_w), "D": (d_w, d_w), "e": (d_w,), "c": ()}


def check_num_clients(num_clients) -> int:
    """``data.num_clients`` must be an integer in [1, MAX_CLIENTS]."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, numbers.Integral) \
            or not 1 <= num_clients <= MAX_CLIENTS:
        raise ScenarioError("data.num_clients", num_clients, f"an integer in [1, {MAX_CLIENTS}]")
    return int(num_clients)


def check_test_fraction(test_fraction) -> float:
    """``data.test_fraction`` must be a number in [0, 1)."""
    if not isinstance(test_fraction, numbers.Real) or not 0.0 <= test_fraction < 1.0:
        raise ScenarioError("data.test_fraction", test_fraction, "a number in [0, 1)")
    return float(test_fraction)


def check_count(key: str, value, minimum: int) -> int:
    """An integer scenario value must be >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ScenarioError(key, value, f"an integer >= {minimum}")
    return int(value)


def test_rows_beside(train_rows: int, test_fraction: float) -> int:
    """Test rows per client: as many as make ``test_fraction`` of the client's rows, next to its
    ``train_rows`` training rows (data sets whose clients all hold ``samples_per_client`` rows)."""
    return round(train_rows * test_fraction / (1.0 - test_fraction))
