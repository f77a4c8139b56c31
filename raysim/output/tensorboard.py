"""TensorBoard event files of a run (``output.tensorboard: true``), written as the run goes.

At every flush of the Parquet logs (:meth:`raysim.engine.run.RunLoop._flush`), the rows that flush
wrote (taken from memory just before it) go to ``<output.dir>/tensorboard/``: each numeric column
of ``rounds.parquet`` as the scalar ``rounds/<column>`` at step ``round`` (null values skipped), and
two histograms at the last step flushed: ``staleness`` of the updates applied since the previous
flush, and ``participation_per_client``, the applied updates per client so far. A resumed (or restarted)
run's writer purges the steps after the rows it kept, so no step is shown twice. Needs the
``tensorboard`` package (``pip install tensorboard``, or the ``tensorboard`` extra);
:func:`check_tensorboard` refuses the key without it before Ray starts.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysim.errors import ScenarioError
from raysim.output.directory import TENSORBOARD_DIR, applied, table_arrays
from raysim.output.parquet_log import log_files

COLUMNS = {"rounds.parquet": None, "events.parquet": ("client_id", "staleness", "status")}  # None: all


def check_tensorboard(output) -> None:
    """ScenarioError when ``output.tensorboard`` is on but cannot work: the tensorboard package
    is missing, or ``output.dir`` is a URI other than file:// (event files need a local path)."""
    if not output.tensorboard:
        return
    if importlib.util.find_spec("tensorboard") is None:
        raise ScenarioError("output.tensorboard", True, "false, or the tensorboard package installed "
                            "(pip install tensorboard)")
    location = str(output.dir)
    if "://" in location and not location.startswith("file://"):
        raise ScenarioError("output.tensorboard", True, f"false with output.dir a URI ({location}): TensorBoard "
                            "event files are written to a local or shared-filesystem path")


def read_rows(out, name: str, first: int, end: int, columns: tuple[str, ...] | None) -> dict[str, np.ndarray]:
    """The ``columns`` present (None: all) in rows ``[first, end)`` of table ``name`` of ``out`` (a Parquet file
    or a log's parts) as arrays, reading only the files that hold those rows."""
    tables, at = [], 0
    for path in log_files(out.fs, out.path(name)):
        with pq.ParquetFile(path, filesystem=out.fs) as file:
            n = file.metadata.num_rows
            if at + n > first and at < end:
                table = file.read(columns=None if columns is None else
                                  [c for c in columns if c in file.schema_arrow.names])
                tables.append(table.slice(max(first - at, 0), min(end, at + n) - max(first, at)))
        at += n
    return _arrays(pa.concat_tables(tables, promote_options="default"), None) if tables else {}


def _arrays(table: pa.Table, columns: tuple[str, ...] | None) -> dict[str, np.ndarray]:
    """The ``columns`` present in ``table`` (None: all) as arrays; {} when it has no rows."""
    if table.num_rows == 0:
        return {}

    return table_arrays(table if columns is None else table.select([c for c in columns if c in table.column_names]))


class TensorBoardLog:
    """A SummaryWriter on ``<out>/tensorboard`` that goes on after the rows ``kept`` (name → rows)."""

    def __init__(self, out, kept: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.out = out
        done = read_rows(out, "rounds.parquet", 0, kept["rounds.parquet"], ("round",))
        self.step = int(done["round"][-1]) if done else 0
        self.writer = SummaryWriter(out.path(TENSORBOARD_DIR), purge_step=self.step + 1 if done else None)
        self.participation = np.zeros(0, dtype=np.int64)
        self._count(read_rows(out, "events.parquet", 0, kept["events.parquet"], ("client_id", "status")))

    def write_flushed(self, unwritten: dict) -> None:
        """Write the rows a flush of the logs wrote: ``unwritten`` (log name -> its
        :meth:`raysim.output.parquet_log.ParquetLog.unwritten` table, taken just before the flush)."""
        self.write({name: _arrays(unwritten[name], columns) for name, columns in COLUMNS.items()})

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()

    def write(self, rows: dict[str, dict[str, np.ndarray]]) -> None:
        """Scalars of the new rounds rows, histograms of the new events; then flush the event file."""
        rounds = rows["rounds.parquet"]
        if rounds:
            for name, values in rounds.items():
                if name == "round" or values.dtype.kind not in "iuf":  # lists (parameters), strings
                    continue
                for step, value in zip(rounds["round"], values.astype(float)):
                    if np.isfinite(value):
                        self.writer.add_scalar(f"rounds/{name}", value, int(step))
            self.step = int(rounds["round"][-1])
        events = rows["events.parquet"]
        if events:
            mask = self._count(events)
            staleness = events["staleness"][mask].astype(float)
            if np.isfinite(staleness).any():
                self.writer.add_histogram("staleness", staleness[np.isfinite(staleness)], self.step)
            self.writer.add_histogram("participation_per_client", self.participation, self.step)
        self.writer.flush()

    def _count(self, events: dict[str, np.ndarray]) -> np.ndarray:
        """Add the applied events to the per-client counts; return the applied mask."""

        if not events:
            return np.zeros(0, dtype=bool)
        mask = applied(events)
        ids = events["client_id"].astype(np.int64)
        counts = np.bincount(ids[mask], minlength=max(self.participation.size, int(ids.max(initial=-1)) + 1))
        counts[:self.participation.size] += self.participation
        self.participation = counts
        return mask
