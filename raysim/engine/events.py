"""The columns of events.parquet rows, one builder for every kind of row (a synchronous round's
tasks, asynchronous completions, tasks run again after a lost actor), from the events schema."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from raysim.output.directory import EVENTS_SCHEMA

# each column a task's row holds, with its numpy dtype (node: added per row batch by Scheduler.advance)
TASK_COLUMNS = {f.name: str if pa.types.is_string(f.type) else f.type.to_pandas_dtype()
                for f in EVENTS_SCHEMA if f.name != "node"}


def event_columns(diagnostics: tuple, numbers: dict, **columns) -> dict:
    """Event rows as columns: every one of :data:`TASK_COLUMNS` (the keyword arguments, any
    sequences of one value per row), then each name of the algorithm's ``diagnostics`` from
    ``numbers`` (NaN for a name ``numbers`` lacks: tasks that returned no update)."""
    if set(columns) != set(TASK_COLUMNS):
        raise TypeError(f"event rows need the columns {sorted(TASK_COLUMNS)}, got {sorted(columns)}")
    out = {name: np.asarray(columns[name], dtype=dtype) for name, dtype in TASK_COLUMNS.items()}
    for name in diagnostics:
        out[name] = np.asarray(numbers[name]) if name in numbers else np.full(len(out["client_id"]), math.nan)
    return out
