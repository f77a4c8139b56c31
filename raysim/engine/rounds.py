"""The rounds.parquet row of a server step, from the rounds schema (as :mod:`.events` builds the
events.parquet rows from the events schema)."""

from __future__ import annotations

import math

from raysim.output.directory import ROUNDS_SCHEMA

ROUND_COLUMNS = tuple(ROUNDS_SCHEMA.names)
TASK_COUNTS = ("late", "dropped", "failed", "stale", "aborted")  # the step's tasks by status other than applied: 0 unless given
DEFAULTS = {name: 0 if name in TASK_COUNTS else None for name in ROUND_COLUMNS}  # each column's value when not given


def round_row(own: tuple, values: dict) -> dict:
    """One rounds row: each of :data:`ROUND_COLUMNS` from ``values`` (a count of :data:`TASK_COUNTS`
    it lacks: 0; any other column: null), then each column the algorithm's ``own`` diagnostics (its
    ``server_diagnostics``) add to the schema's (null where ``values`` lacks it); NaN is stored as
    null. TypeError for a name of ``values`` that is neither."""
    row = {**DEFAULTS, **values}
    if len(row) > len(DEFAULTS) and not row.keys() - DEFAULTS.keys() <= set(own):
        unknown = sorted(row.keys() - DEFAULTS.keys() - set(own))
        raise TypeError(f"a rounds row has no columns {unknown} (it has {list(ROUND_COLUMNS)} and {list(own)})")
    for name in own:
        row.setdefault(name, None)
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
