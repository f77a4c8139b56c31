"""Cells of the studies' Markdown tables (``scenarios/*/summarize.py``)."""

from __future__ import annotations

import numpy as np


def mean_std(values, digits: int = 1) -> str:
    """``mean ± std`` (sample standard deviation) of ``values`` with ``digits`` decimals; the value
    alone for one, ``—`` for none (None entries are left out)."""
    values = np.asarray([v for v in values if v is not None], dtype=float)
    if not len(values):
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"
