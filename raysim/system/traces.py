"""Trace files (CSV or Parquet): per-client compute speeds and online intervals, checked on load."""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from raysim.errors import ScenarioError, first_line

COMPUTE_KEY = "system.compute.path"
AVAILABILITY_KEY = "system.availability.path"
TRACE_FILE = "an existing CSV or Parquet file"


def check_exists(key: str, path) -> None:
    """Raise ScenarioError on ``key`` unless ``path`` names an existing file."""
    if path is None or not os.path.isfile(str(path)):
        raise ScenarioError(key, path, TRACE_FILE)


def read_table(key: str, path: str) -> pa.Table:
    """Read a ``.csv`` file as CSV, anything else as Parquet."""
    check_exists(key, path)
    try:
        return pacsv.read_csv(path) if str(path).lower().endswith(".csv") else pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise ScenarioError(key, path, f"{TRACE_FILE} ({first_line(exc)})") from None


def _numeric_columns(table: pa.Table, key: str, path: str, names: list) -> list:
    """The named columns as float64 arrays; a missing or non-numeric column is a ScenarioError."""
    allowed = "a file with columns " + ", ".join(names)
    columns = []
    for name in names:
        if name not in table.column_names:
            raise ScenarioError(key, path, f"{allowed} (column {name!r} is missing)")
        column = table.column(name)
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        if table.num_rows and (not numeric or column.null_count):
            raise ScenarioError(key, path, f"{allowed} (column {name!r} must hold numbers, no nulls)")
        columns.append(np.asarray(column.to_numpy(), dtype=np.float64))
    return columns


def _client_ids(ids: np.ndarray, num_clients: int, key: str, path: str, allowed: str) -> np.ndarray:
    ok = (ids >= 0) & (ids < num_clients) & (ids == np.floor(ids))
    if not ok.all():
        bad = ids[~ok][0]
        raise ScenarioError(key, path, f"{allowed} (client_id {bad:g} is not an integer in 0..{num_clients - 1})")
    return ids.astype(np.int64)


def load_compute_trace(path: str, num_clients: int) -> np.ndarray:
    """Speed of every client 0..num_clients-1 (float64[N]) from a trace with columns client_id, speed.

    Every client must appear exactly once with a finite speed > 0; otherwise a
    ScenarioError on ``system.compute.path`` says which client or column is wrong.
    """
    allowed = "a file with columns client_id, speed"
    ids, speed = _numeric_columns(read_table(COMPUTE_KEY, path), COMPUTE_KEY, path, ["client_id", "speed"])
    ids = _client_ids(ids, num_clients, COMPUTE_KEY, path, allowed)
    present, counts = np.unique(ids, return_counts=True)  # sized by the file, not by num_clients
    if (counts > 1).any():
        i = int(np.argmax(counts > 1))
        raise ScenarioError(COMPUTE_KEY, path, f"{allowed} (client {present[i]} appears {counts[i]} times)")
    if len(present) < num_clients:
        gaps = np.flatnonzero(present != np.arange(len(present)))  # sorted ids: the first gap is missing
        client = int(gaps[0]) if len(gaps) else len(present)
        raise ScenarioError(COMPUTE_KEY, path, f"{allowed} and a row for every client 0..{num_clients - 1} "
                                               f"(client {client} is missing)")
    bad = ~(np.isfinite(speed) & (speed > 0))
    if bad.any():
        row = int(np.argmax(bad))
        raise ScenarioError(COMPUTE_KEY, path, f"{allowed} and speeds > 0 (client {ids[row]} has speed {speed[row]:g})")
    out = np.empty(num_clients)
    out[ids] = speed
    return out


class Intervals:
    """Online intervals ``[start, end)`` of clients 0..N-1, grouped by client (CSR layout).

    Queries are vectorized: a client is online at ``t`` iff more of its intervals
    have started (start <= t) than have ended (end <= t), which holds even when
    its intervals overlap; both counts are binary searches within the client's
    sorted group, so a query costs O(len(client_ids) * log(intervals per client)).
    """

    def __init__(self, client: np.ndarray, start: np.ndarray, end: np.ndarray, num_clients: int):
        by_start = np.lexsort((start, client))
        self.starts, self.ends_of_starts = start[by_start], end[by_start]
        self.ends = end[np.lexsort((end, client))]
        self.offsets = np.searchsorted(client[by_start], np.arange(num_clients + 1))
        self.clients_with_intervals = int(np.count_nonzero(np.diff(self.offsets)))

    def active(self, client_ids: np.ndarray, t: float) -> np.ndarray:
        """Whether each client is online at time ``t`` (bool array)."""
        lo, hi = self.offsets[client_ids], self.offsets[client_ids + 1]
        return _count_le(self.starts, lo, hi, t) > _count_le(self.ends, lo, hi, t)

    def next_time(self, t: float) -> float:
        """The earliest time >= t at which some client is online (``math.inf`` if none will be)."""
        later = self.ends_of_starts > t
        return float(np.maximum(self.starts[later], t).min()) if later.any() else math.inf


def _count_le(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, t: float) -> np.ndarray:
    """For each query, how many of the sorted ``values[lo:hi]`` are <= t (vectorized binary search)."""
    first = lo
    while True:
        active = lo < hi
        if not active.any():
            return lo - first
        mid = (lo + hi) // 2
        right = active & (values[np.minimum(mid, len(values) - 1)] <= t)
        lo, hi = np.where(right, mid + 1, lo), np.where(active & ~right, mid, hi)


def load_availability_trace(path: str, num_clients: int) -> Intervals:
    """Online intervals from a trace with columns client_id, start, end (virtual seconds).

    A client may have several rows or none (then it is never available). Each row
    needs a finite start and end > start; client ids must lie in 0..N-1; at least
    one row must name a client. Otherwise a ScenarioError on ``system.availability.path``.
    """
    allowed = "a file with columns client_id, start, end"
    key = AVAILABILITY_KEY
    ids, start, end = _numeric_columns(read_table(key, path), key, path, ["client_id", "start", "end"])
    ids = _client_ids(ids, num_clients, key, path, allowed)
    bad = ~(np.isfinite(start) & (end > start))
    if bad.any():
        row = int(np.argmax(bad))
        raise ScenarioError(key, path, f"{allowed} and end > start (row {row}: start {start[row]:g}, "
                                       f"end {end[row]:g})")
    if len(ids) == 0:
        raise ScenarioError(key, path, f"{allowed} and at least one row (with none, no client is ever available)")
    return Intervals(ids, start, end, num_clients)
