"""The arithmetic of the robust rules' f, the Byzantine inputs a step tolerates: how many a share
of a step's inputs makes, and how many krum, multi_krum and bulyan accept among n.

Ground floor: the scenario's checks (before torch loads), the rules themselves and the server's
aggregation step read the same numbers here.
"""

from __future__ import annotations

import math


def floor_share(share: float, count: int) -> int:
    """⌊share × count⌋, rounded to 9 decimals first so that 0.29 × 100 gives 29, not 28."""
    return math.floor(round(share * count, 9))


def default_f(share: float, updates: int) -> int:
    """Krum's and Bulyan's f when ``algorithm.byzantine_f`` is null: ⌊share × updates⌋, the Byzantine
    updates a step of ``updates`` holds on average (with bucketing each may spoil a bucket)."""
    return floor_share(share, updates)


def largest_f(rule: str, n: int) -> int:
    """The most Byzantine inputs f that ``rule`` accepts among ``n``: krum and multi_krum keep
    n − f − 2 >= 1 neighbours (f <= n − 3); bulyan needs n >= 4f + 3 (f <= ⌊(n − 3) / 4⌋)."""
    return (n - 3) // 4 if rule == "bulyan" else n - 3


def capped_f(n: int, f: int, rule) -> int:
    """The largest f' <= f that ``rule`` (a name or function: krum, multi_krum, bulyan) accepts for n updates;
    with n <= 2 krum and multi_krum take any f (the mean), other rules take no f: both get f back. For a short
    last buffer; multi_krum's m must also stay <= n − f'."""
    name = getattr(rule, "__name__", rule)
    if (name in ("krum", "multi_krum") and n > 2) or name == "bulyan":
        return max(0, min(f, largest_f(name, n)))
    return f
