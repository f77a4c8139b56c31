"""A Parquet table that grows row by row and stays readable if the run stops."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


class ParquetLog:
    """Rows appended as the run goes; the file is rewritten atomically (write, then rename)
    at most every ``flush_seconds`` — and never more than a tenth of the time, since each
    rewrite grows with the rows — and on :meth:`close`, so a reader never sees a partial
    file and an interrupted run keeps what was flushed."""

    def __init__(self, output, name: str, schema: pa.Schema, flush_seconds: float = 2.0):
        """A file ``name`` in ``output`` (an OutputDir); ``schema`` types the known columns,
        other columns are typed from their first values."""
        self.fs, self.path = output.fs, output.path(name)
        self.schema, self.flush_seconds = schema, flush_seconds
        self._batches: list[pa.RecordBatch] = []
        self._pending = 0
        self._last_flush = time.monotonic()
        self._flush_cost = 0.0

    def append(self, columns: dict) -> None:
        """Append rows given as column name → sequence (all the same length); NaN is stored as null."""
        if not self._batches:
            known = set(self.schema.names)
            extra = [pa.field(k, pa.array(v).type) for k, v in columns.items() if k not in known]
            self.schema = pa.schema(list(self.schema) + extra)
        arrays = [pa.array(columns[f.name], type=f.type, from_pandas=True) for f in self.schema]  # NaN -> null
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._batches.append(batch)
        self._pending += batch.num_rows
        if time.monotonic() - self._last_flush >= max(self.flush_seconds, 10 * self._flush_cost):
            self.flush()

    def flush(self) -> None:
        """Rewrite the file with every row so far."""
        if self._pending == 0 and self.fs.get_file_info(self.path).type != pafs.FileType.NotFound:
            return
        began = time.monotonic()
        tmp = f"{self.path}.tmp"
        pq.write_table(pa.Table.from_batches(self._batches, schema=self.schema), tmp, filesystem=self.fs)
        self.fs.move(tmp, self.path)
        self._pending, self._last_flush = 0, time.monotonic()
        self._flush_cost = self._last_flush - began

    def close(self) -> None:
        """Flush what is left."""
        self.flush()
