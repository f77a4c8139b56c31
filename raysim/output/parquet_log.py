"""A Parquet table that grows row by row and stays readable if the run stops: a directory of parts.

A log such as ``rounds.parquet`` is a directory of part files ``part-<first>-<end>-<level>.parquet``
holding rows ``[first, end)``. Each flush writes only the rows appended since the previous one, as
a new part of level 0, under a hidden temporary name then renamed (so ``pyarrow.parquet.read_table``
or ``pandas.read_parquet`` of the directory never sees a partial file), and drops them from memory.
When the last :data:`FANOUT` parts share a level they are merged into one part of the next level
(a log of n flushes has at most ``FANOUT - 1`` parts per level, about log_FANOUT(n) levels, and each
row is rewritten once per level); :meth:`ParquetLog.close` merges all parts into one.

A merged part (or one shortened by :meth:`ParquetLog.truncate`) is written before the part files it
replaces are deleted. A part whose rows lie within another part's range is a leftover of a stop
between the two steps: readers skip it (:func:`log_files`) and opening the log for appending
(``keep_rows``) deletes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raysim.errors import RunError, first_line

FANOUT = 4
ROW_GROUP_ROWS = 65_536  # rows per Parquet row group of the parts
_PART = re.compile(r"part-(\d+)-(\d+)-(\d+)\.parquet")


@dataclass(frozen=True)
class _Part:
    """A part file: rows ``[first, end)`` of the log, after ``level`` rounds of merging."""

    first: int
    end: int
    level: int

    @property
    def name(self) -> str:
        return f"part-{self.first:012d}-{self.end:012d}-{self.level}.parquet"


def _listing(fs: pafs.FileSystem, path: str) -> list[str]:
    """The names in directory ``path``; none if it is missing or not a directory."""
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return []
    return [info.base_name for info in fs.get_file_info(pafs.FileSelector(path))]


def _parts(names: list[str]) -> list[_Part]:
    """The part files among ``names``."""
    return [_Part(*map(int, m.groups())) for m in map(_PART.fullmatch, names) if m]


def _live(parts: list[_Part]) -> list[_Part]:
    """The parts whose rows no other part covers, in row order."""
    live, reach = [], -1
    for part in sorted(parts, key=lambda p: (p.first, -p.end)):
        if part.end > reach:
            live.append(part)
            reach = part.end
    return live


def log_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """The Parquet files holding the rows of table ``path``, in row order: ``path`` itself if it is
    a file, else the live parts of the log directory (none if missing or without parts)."""
    if fs.get_file_info(path).type == pafs.FileType.File:
        return [path]
    return [f"{path}/{part.name}" for part in _live(_parts(_listing(fs, path)))]


def check_log(fs: pafs.FileSystem, path: str, rows: int) -> None:
    """ValueError, one line, unless the log at ``path`` holds its first ``rows`` rows whole: parts
    that follow each other from row 0 (none missing) and each part file readable, with the rows
    its name says."""
    live = _live(_parts(_listing(fs, path)))
    reach = 0
    for part in live:
        if reach >= rows:
            break
        if part.first > reach:
            raise ValueError(f"{path} lacks rows {reach} to {part.first - 1} (a part file is missing)")
        try:
            held = pq.read_metadata(f"{path}/{part.name}", filesystem=fs).num_rows
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"{path}/{part.name} is not a readable Parquet file ({first_line(exc)})") from None
        if held != part.end - part.first:
            raise ValueError(f"{path}/{part.name} holds {held} rows, not the {part.end - part.first} its name says")
        reach = part.end
    if reach < rows:
        raise ValueError(f"{path} holds {reach} rows, fewer than the {rows} its checkpoint counted")


class ParquetLog:
    """Rows appended as the run goes, written as parts (see the module docstring) on :meth:`flush`
    (the run decides when: :class:`raysim.engine.run.RunLoop` flushes its logs together) and on
    :meth:`close`. Memory holds only the rows not written yet."""

    def __init__(self, output, name: str, schema: pa.Schema, keep_rows: int | None = None):
        """Log ``name`` in ``output`` (an OutputDir); ``schema`` types the known columns, other
        columns are typed from their first values.

        ``keep_rows=None`` starts a new log (whatever ``name`` held is removed). An int opens the
        existing log to append after its first ``keep_rows`` rows, deleting the rest (RunError if
        it holds fewer)."""
        self.output, self.name, self.path = output, name, output.path(name)
        self.schema = schema
        self._parts: list[_Part] = []  # live parts on disk, in row order
        self._batches: list[pa.RecordBatch] = []  # rows not written yet
        self._pending = 0
        self._typed = False  # whether the extra columns' types are known
        if keep_rows is None:
            output.remove(name)
        else:
            self._resume(keep_rows)

    @property
    def rows(self) -> int:
        """Rows appended so far, written or not (on resume: counting the kept ones)."""
        return self.written + self._pending

    @property
    def written(self) -> int:
        """Rows written to disk."""
        return self._parts[-1].end if self._parts else 0

    @property
    def pending_rows(self) -> int:
        """Rows appended but not written yet (the rows held in memory)."""
        return self._pending

    def unwritten(self) -> pa.Table:
        """The rows appended but not written yet, as one table (what the next flush writes)."""
        return pa.Table.from_batches(self._batches, schema=self.schema)

    def append(self, columns: dict) -> None:
        """Append rows given as column name → sequence (all the same length); NaN is stored as null."""
        if not self._typed:
            known = set(self.schema.names)
            extra = [pa.field(k, pa.array(v).type) for k, v in columns.items() if k not in known]
            self.schema, self._typed = pa.schema(list(self.schema) + extra), True
        arrays = [pa.array(columns[f.name], type=f.type, from_pandas=True) for f in self.schema]  # NaN -> null
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._batches.append(batch)
        self._pending += batch.num_rows

    def flush(self) -> None:
        """Write the rows appended since the last flush as a new part (then merge trailing parts)."""
        if self._pending:
            self._new_part()

    def discard(self) -> None:
        """Drop the rows not written yet."""
        self.truncate(self.written)

    def truncate(self, rows: int) -> None:
        """Keep only the first ``rows`` rows, written or not. Parts after the cut are deleted, last
        one first (what stays on disk is always a prefix); the part that straddles it is rewritten
        shorter, then deleted."""
        if rows >= self.written:
            pending = min(rows, self.rows) - self.written
            self._batches, self._pending = list(_head(self._batches, pending)), pending
            return
        self._batches, self._pending = [], 0
        while self._parts and self._parts[-1].first >= rows:
            self._delete([self._parts.pop()])
        if self._parts and self._parts[-1].end > rows:
            part = self._parts[-1]
            cut = _Part(part.first, rows, part.level)
            self._write(cut, _head(self._read([part]), rows - part.first))
            self._parts[-1] = cut
            self._delete([part])

    def close(self) -> None:
        """Flush what is left and merge all parts into one (an empty log gets one row-less part,
        which holds its schema)."""
        self.flush()
        if not self._parts:
            self._new_part()
        elif len(self._parts) > 1:
            self._merge(self._parts)

    def _new_part(self) -> None:
        """Write the pending rows as a part of level 0 and drop them from memory; then merge the
        last FANOUT parts while they share a level."""
        if not self._parts:
            self.output.make_dir(self.name)
        part = _Part(self.written, self.rows, 0)
        self._write(part, self._batches)
        self._parts.append(part)
        self._batches, self._pending = [], 0
        while len(self._parts) >= FANOUT and len({p.level for p in self._parts[-FANOUT:]}) == 1:
            self._merge(self._parts[-FANOUT:])

    def _merge(self, parts: list[_Part]) -> None:
        """Replace ``parts`` (the last ones) by one part of the next level: it is written first,
        then they are deleted."""
        merged = _Part(parts[0].first, parts[-1].end, max(p.level for p in parts) + 1)
        self._write(merged, self._read(parts))
        self._parts = self._parts[:-len(parts)] + [merged]
        self._delete(parts)

    def _resume(self, keep_rows: int) -> None:
        """Open the existing log for appending: delete the leftovers of a stop (covered parts,
        temporary files), then keep its first ``keep_rows`` rows."""
        names = _listing(self.output.fs, self.path)
        found = _parts(names)
        live = _live(found)
        have = live[-1].end if live else 0
        if keep_rows > have:
            raise RunError(f"cannot resume {self.path}: it holds {have} rows, fewer than the {keep_rows} to keep")
        self._delete(set(found) - set(live))
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                self.output.remove(f"{self.name}/{name}")
        self._parts = live
        if live:  # the schema the rows were written with, before a cut part is rewritten with it
            self.schema = pq.read_schema(f"{self.path}/{live[0].name}", filesystem=self.output.fs)
            self._typed = True
        self.truncate(keep_rows)
        if not self._parts:  # nothing kept: an empty directory, or a single Parquet file of an older raysim
            self.output.remove(self.name)

    def _write(self, part: _Part, batches: Iterable[pa.RecordBatch]) -> None:
        """Write ``batches`` as file ``part`` (atomically), in row groups of about ROW_GROUP_ROWS."""
        def write(tmp: str) -> None:
            with pq.ParquetWriter(tmp, self.schema, filesystem=self.output.fs) as writer:
                group: list[pa.RecordBatch] = []
                rows = 0
                for batch in batches:
                    group.append(batch)
                    rows += batch.num_rows
                    if rows >= ROW_GROUP_ROWS:
                        writer.write_table(pa.Table.from_batches(group, self.schema))
                        group, rows = [], 0
                if group:
                    writer.write_table(pa.Table.from_batches(group, self.schema))

        self.output.write_atomic(f"{self.name}/{part.name}", write)

    def _read(self, parts: list[_Part]) -> Iterator[pa.RecordBatch]:
        """The rows of ``parts``, streamed as record batches."""
        for part in parts:
            with pq.ParquetFile(f"{self.path}/{part.name}", filesystem=self.output.fs) as file:
                yield from file.iter_batches(batch_size=ROW_GROUP_ROWS)

    def _delete(self, parts: Iterable[_Part]) -> None:
        for part in parts:
            self.output.remove(f"{self.name}/{part.name}")


def _head(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The first ``rows`` rows of ``batches``."""
    for batch in batches:
        if rows <= 0:
            return
        yield batch.slice(0, rows)
        rows -= batch.num_rows
