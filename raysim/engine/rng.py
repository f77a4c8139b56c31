"""Random streams: every draw is a pure function of (seed, stream, ids…), never of placement."""

from __future__ import annotations

import numpy as np

TRAIN, PERSONALIZE, L2GD_COINS = 1, 2, 3  # (0 was client sampling, now the system model's own stream)


def stream(seed: int, kind: int, *ids: int) -> np.random.Generator:
    """A numpy Generator for one purpose (``kind``) and the given ids (client, task counter…)."""
    return np.random.default_rng([seed, kind, *ids])
