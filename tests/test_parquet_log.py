"""ParquetLog: a directory of parts written as rows come, merged to few parts, cut back on resume,
readable by pyarrow and pandas at any time, with one clear error when the disk refuses a write."""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from raysim.errors import RunError
from raysim.output import OutputDir, ParquetLog
from raysim.output.parquet_log import FANOUT, log_files

SCHEMA = pa.schema([("i", pa.int64()), ("x", pa.float64())])
NAME = "events.parquet"


def rows(first: int, n: int) -> dict:
    return {"i": list(range(first, first + n)), "x": [i / 2 for i in range(first, first + n)]}


def new_log(out: OutputDir, **kw) -> ParquetLog:
    return ParquetLog(out, NAME, SCHEMA, **kw)


def parts(out: OutputDir) -> list[str]:
    return sorted(os.listdir(out.path(NAME)))


def written_log(tmp_path, flushes: int = 3, size: int = 10) -> OutputDir:
    """A log of ``flushes`` parts of ``size`` rows (i = 0, 1, …), left open as a stopped run leaves it."""
    out = OutputDir.open(str(tmp_path / "run"))
    log = new_log(out)
    for k in range(flushes):
        log.append(rows(k * size, size))
        log.flush()
    return out


def test_each_flush_adds_a_part_and_earlier_parts_are_not_rewritten(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    log = new_log(out)
    log.append(rows(0, 10))
    assert (log.rows, log.pending_rows) == (10, 10) and not os.path.exists(out.path(NAME))
    log.flush()
    first = out.path(f"{NAME}/{parts(out)[0]}")
    stat, content = os.stat(first), open(first, "rb").read()
    for k in (1, 2):
        log.append(rows(10 * k, 10))
        log.flush()
    assert parts(out) == ["part-000000000000-000000000010-0.parquet", "part-000000000010-000000000020-0.parquet",
                          "part-000000000020-000000000030-0.parquet"]
    assert os.stat(first).st_mtime_ns == stat.st_mtime_ns and open(first, "rb").read() == content
    log.append(rows(30, 5))
    assert (log.rows, log.written, log.pending_rows) == (35, 30, 5)
    assert out.read_table(NAME).column("i").to_pylist() == list(range(30))


def test_the_directory_reads_as_one_table_with_pyarrow_and_pandas(tmp_path):
    out = written_log(tmp_path, flushes=3)
    with open(out.path(f"{NAME}/.part-000000000030-000000000040-0.parquet.0123.tmp"), "wb") as f:
        f.write(b"PAR1 a write in progress")  # a temporary file: readers must not see it
    expected = list(range(30))
    assert out.read_table(NAME).column("i").to_pylist() == expected
    assert pq.read_table(out.path(NAME)).column("i").to_pylist() == expected
    pandas = pytest.importorskip("pandas")
    frame = pandas.read_parquet(out.path(NAME))
    assert frame["i"].tolist() == expected and frame["x"].tolist() == [i / 2 for i in expected]


def test_rows_are_written_only_on_flush(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    log = new_log(out)
    log.append(rows(0, 4))
    assert log.pending_rows == 4 and not os.path.exists(out.path(NAME))
    log.flush()
    assert log.pending_rows == 0 and out.read_table(NAME).num_rows == 4


def test_nan_is_null_and_extra_columns_keep_their_first_type(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    log = new_log(out)
    log.append({"i": [0, 1], "x": [float("nan"), 1.0], "note": ["a", "b"], "k": [7, 8]})
    log.flush()
    log.append({"i": [2], "x": [2.0], "note": [None], "k": [None]})  # all-null: typed from the first rows
    log.close()
    table = out.read_table(NAME)
    assert table.schema.field("k").type == pa.int64() and table.schema.field("note").type == pa.string()
    assert table.to_pydict() == {"i": [0, 1, 2], "x": [None, 1.0, 2.0], "note": ["a", "b", None], "k": [7, 8, None]}


def _digit_sum(n: int, base: int) -> int:
    return 0 if n == 0 else n % base + _digit_sum(n // base, base)


def test_merging_bounds_the_parts_and_close_leaves_one(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    log = new_log(out)
    for k in range(1, 101):
        log.append(rows(3 * (k - 1), 3))
        log.flush()
        # FANOUT parts of one level become one part of the next: a base-FANOUT counter of flushes
        assert len(parts(out)) == _digit_sum(k, FANOUT)
    assert max(_digit_sum(k, FANOUT) for k in range(1, 101)) <= (FANOUT - 1) * math.ceil(math.log(101, FANOUT))
    log.close()
    assert len(parts(out)) == 1
    assert out.read_table(NAME).column("i").to_pylist() == list(range(300))


def test_memory_holds_only_unwritten_rows_over_a_million_rows(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    log = new_log(out)
    most_held = most_parts = 0
    values = np.arange(1000, dtype=np.int64)
    for k in range(1000):
        log.append({"i": values + 1000 * k, "x": np.zeros(1000)})
        most_held = max(most_held, log.pending_rows)
        if k % 10 == 9:
            log.flush()
            assert log.pending_rows == 0
            most_parts = max(most_parts, len(parts(out)))
    assert log.rows == 1_000_000 and most_held == 10_000
    assert most_parts <= (FANOUT - 1) * 4  # 100 flushes: 4 levels of FANOUT = 4
    log.close()
    column = out.read_table(NAME).column("i").to_numpy()
    assert len(parts(out)) == 1 and np.array_equal(column, np.arange(1_000_000))


def test_a_stop_between_a_merge_and_its_deletes_still_reads_each_row_once(tmp_path, monkeypatch):
    out = written_log(tmp_path, flushes=3)
    log = new_log(out, keep_rows=30)
    with monkeypatch.context() as m:
        m.setattr(out, "remove", lambda name: None)  # the process stops before deleting the merged parts
        log.close()
    assert len(parts(out)) == 4
    assert len(log_files(out.fs, out.path(NAME))) == 1
    assert out.read_table(NAME).column("i").to_pylist() == list(range(30))
    new_log(out, keep_rows=30)  # opening for appending deletes the leftovers
    assert parts(out) == ["part-000000000000-000000000030-1.parquet"]


def test_a_stop_while_cutting_back_leaves_the_old_rows(tmp_path, monkeypatch):
    out = written_log(tmp_path, flushes=3)
    with monkeypatch.context() as m:
        m.setattr(out, "remove", lambda name: None)  # the cut part is written, nothing deleted yet
        new_log(out, keep_rows=15)
    assert "part-000000000010-000000000015-0.parquet" in parts(out)
    assert out.read_table(NAME).column("i").to_pylist() == list(range(30))
    log = new_log(out, keep_rows=15)
    assert out.read_table(NAME).column("i").to_pylist() == list(range(15)) and log.rows == 15


@pytest.mark.parametrize("keep, left", [
    (15, ["part-000000000000-000000000010-0.parquet", "part-000000000010-000000000015-0.parquet"]),
    (20, ["part-000000000000-000000000010-0.parquet", "part-000000000010-000000000020-0.parquet"]),
    (30, ["part-000000000000-000000000010-0.parquet", "part-000000000010-000000000020-0.parquet",
          "part-000000000020-000000000030-0.parquet"]),
])
def test_keep_rows_cuts_the_log_and_appends_after_the_cut(tmp_path, keep, left):
    out = written_log(tmp_path, flushes=3)
    first = out.path(f"{NAME}/part-000000000000-000000000010-0.parquet")
    before = os.stat(first).st_mtime_ns
    with open(out.path(f"{NAME}/.part-x.0123.tmp"), "wb") as f:
        f.write(b"left by a stop")
    log = new_log(out, keep_rows=keep)
    assert parts(out) == left and log.rows == keep and os.stat(first).st_mtime_ns == before
    log.append(rows(100, 2))
    log.close()
    assert out.read_table(NAME).column("i").to_pylist() == list(range(keep)) + [100, 101]


def test_a_cut_part_keeps_the_columns_the_rows_were_written_with(tmp_path):
    """Rows with columns beyond the base schema (as events' client profiles): the part the cut
    falls in is rewritten with all of them, and the log goes on appending."""
    out = OutputDir.open(str(tmp_path / "run"))
    log = new_log(out)
    log.append({**rows(0, 10), "tier": [1] * 10})
    log.flush()
    log = new_log(out, keep_rows=4)
    log.append({**rows(100, 1), "tier": [2]})
    log.close()
    table = out.read_table(NAME)
    assert table.column_names == ["i", "x", "tier"]
    assert table.column("i").to_pylist() == [0, 1, 2, 3, 100] and table.column("tier").to_pylist() == [1] * 4 + [2]


def test_keep_rows_zero_starts_over_and_more_than_written_is_an_error(tmp_path):
    out = written_log(tmp_path, flushes=3)
    with pytest.raises(RunError) as error:
        new_log(out, keep_rows=31)
    assert str(error.value) == f"cannot resume {out.path(NAME)}: it holds 30 rows, fewer than the 31 to keep"
    assert len(parts(out)) == 3 and out.read_table(NAME).num_rows == 30  # nothing was changed
    log = new_log(out, keep_rows=0)
    assert log.rows == 0 and not os.path.exists(out.path(NAME))
    log.append(rows(5, 1))
    log.close()
    assert out.read_table(NAME).column("i").to_pylist() == [5]


def test_truncate_and_discard_drop_written_and_pending_rows(tmp_path):
    out = written_log(tmp_path, flushes=3)
    log = new_log(out, keep_rows=30)
    log.append(rows(30, 10))
    log.truncate(35)  # pending rows only
    assert (log.written, log.pending_rows) == (30, 5)
    log.discard()
    assert (log.rows, log.pending_rows) == (30, 0)
    log.truncate(12)
    assert log.rows == 12 and out.read_table(NAME).column("i").to_pylist() == list(range(12))


def test_an_empty_log_has_one_part_with_its_schema_and_a_file_table_still_reads(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    new_log(out).close()
    assert parts(out) == ["part-000000000000-000000000000-0.parquet"]
    assert out.read_table(NAME).schema == SCHEMA and out.read_table(NAME).num_rows == 0
    pq.write_table(pa.table({"i": [4, 5]}), out.path("rounds.parquet"))  # the single file of an older raysim
    assert out.read_table("rounds.parquet").column("i").to_pylist() == [4, 5]
    with pytest.raises(FileNotFoundError):
        out.read_table("missing.parquet")


def test_in_memory_filesystem(tmp_path):
    memory = pafs._MockFileSystem()
    out = OutputDir(memory, "bucket/run")
    log = new_log(out)
    for k in range(5):
        log.append(rows(4 * k, 4))
        log.flush()
    assert len(log_files(memory, out.path(NAME))) == 2
    assert pq.read_table(out.path(NAME), filesystem=memory).column("i").to_pylist() == list(range(20))
    log.close()
    assert out.read_table(NAME).column("i").to_pylist() == list(range(20))


DISK_FULL = textwrap.dedent("""
    import json, math, resource, signal, sys, traceback
    import numpy as np, pyarrow as pa
    from raysim.output import OutputDir, ParquetLog

    out = OutputDir.open(sys.argv[1])
    out.write_text("summary.json", "{}")
    log = ParquetLog(out, "events.parquet", pa.schema([("x", pa.float64())]))
    log.append({"x": [1.0] * 10})
    log.flush()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))  # root cannot bypass it
    errors = []
    for write in (lambda: (log.append({"x": np.random.default_rng(0).random(50_000)}), log.flush()),
                  lambda: out.write_text("summary.json", "x" * 200_000)):
        try:
            write()
        except Exception as exc:
            errors.append([type(exc).__name__, str(exc), "During handling" in "".join(traceback.format_exception(exc))])
    print(json.dumps(errors))
""")


def test_a_full_disk_is_one_output_error_and_earlier_files_stay_readable(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", DISK_FULL, str(run)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    too_large = os.strerror(errno.EFBIG)
    part = "part-000000000010-000000050010-0.parquet"
    assert json.loads(proc.stdout) == [  # [type, message, whether a chained traceback shows]
        ["OutputError", f"cannot write {run}/events.parquet/{part}: {too_large}", False],
        ["OutputError", f"cannot write {run}/summary.json: {too_large}", False],
    ]
    assert (run / "summary.json").read_text() == "{}"
    assert pq.read_table(run / "events.parquet").column("x").to_pylist() == [1.0] * 10
    assert not [name for _, _, names in os.walk(run) for name in names if name.endswith(".tmp")]


def test_read_table_lists_the_parts_again_when_a_merge_deleted_one(tmp_path, monkeypatch):
    """A live run's merge may delete a part between the reader's listing and its read."""
    out = written_log(tmp_path, flushes=3)
    read, calls = pq.read_table, []

    def racing(files, **kwargs):
        calls.append(files)
        if len(calls) == 1:
            raise FileNotFoundError(files[0])
        return read(files, **kwargs)

    monkeypatch.setattr("raysim.output.directory.pq.read_table", racing)
    assert out.read_table(NAME, columns=("i", "missing")).column_names == ["i"]
    assert out.read_table(NAME).column("i").to_pylist() == list(range(30)) and len(calls) == 3
