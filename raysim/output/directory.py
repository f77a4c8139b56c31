"""The run's output directory on any filesystem pyarrow understands: a local path, a shared
filesystem path, or a URI such as ``s3://bucket/runs/x``, ``gs://…`` or ``file:///…``.

Every write is atomic: the file is written under a hidden temporary name (``.<name>.<random>.tmp``,
which Parquet dataset readers skip), then renamed into place, so a reader sees the old file or the
new one. An OSError while writing (disk full, permission denied) raises
:class:`~raysim.errors.OutputError`, one line naming the file. A run claims the directory with the
lock file ``.raysim.lock`` (:meth:`OutputDir.claim`), so two live runs never write into one directory.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import uuid
from datetime import datetime
from typing import Callable

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raysim.errors import OutputError, ScenarioError, first_line
from raysim.output.parquet_log import log_files

CHECKPOINT = "checkpoint.pt"  # raysim.engine.checkpoint writes it; named here, where no torch is imported
PRIVACY_LEDGER = "privacy.parquet"  # differential privacy: each client's participations and ε
RUN_FILES = ("scenario.yaml", "summary.json", "model.pt", CHECKPOINT, "rounds.parquet", "events.parquet",
             PRIVACY_LEDGER)
"""The files a run writes into its directory."""
PLOTS: dict[str, str] = {  # what `raysim report` writes (each only when some run has its columns), in order
    "accuracy_vs_round.png": "test accuracy against server steps, runs overlaid (with --target: its line, "
                             "and each run's step reaching it in the legend)",
    "accuracy_vs_virtual_time.png": "test accuracy against virtual time, runs overlaid (--target as above)",
    "accuracy_vs_wall_time.png": "test accuracy against wall-clock time, runs overlaid (--target as above)",
    "accuracy_vs_epsilon.png": "differential privacy: test accuracy against the ε spent (at the evaluation steps), "
                               "runs overlaid (--target as above)",
    "accuracy_vs_bytes_up.png": "test accuracy against the bytes all clients uploaded so far, runs overlaid "
                                "(--target as above)",
    "epsilon_vs_round.png": "differential privacy: the ε spent against server steps, runs overlaid",
    "loss_vs_round.png": "training loss (solid) and test loss (dashed) against server steps, runs overlaid",
    "loss_vs_virtual_time.png": "training and test loss against virtual time, runs overlaid",
    "loss_vs_wall_time.png": "training and test loss against wall-clock time, runs overlaid",
    "personalized_accuracy_vs_round.png": "personalized accuracy (pooled; mean over clients, dashed, with its "
                                          "95% band) and the global test accuracy (dotted) against server steps",
    "diagnostics_vs_round.png": "one panel per diagnostics column logged (rel_error, grad_norm_sq, loss_gap: "
                                "log y; objective, hessian_min_eig; an algorithm's server_diagnostics) against "
                                "server steps, runs overlaid",
    "staleness_histogram.png": "staleness of applied updates (model versions behind), one panel per run",
    "participation_per_client.png": "histogram of applied updates per client (zeros included), one panel per run",
    "byzantine_share_vs_round.png": "share of each server step's applied updates sent by Byzantine clients",
    "timeline.png": "client tasks on the virtual clock, one lane per concurrent task, by status, one panel "
                    "per run on a shared time range",
}
"""The PNGs of `raysim report`; an axis whose positive values span more than 100× is logarithmic."""
DIAGNOSTICS = {"rel_error": "‖θ − θ*‖² / ‖θ⁰ − θ*‖²", "grad_norm_sq": "‖F(θ)‖² or ‖∇J‖²",
               "loss_gap": "mean f_m − min f_m", "deployed_loss_gap": "mean f_m at the deployed w − min f_m",
               "objective": "J(w)", "hessian_min_eig": "λ_min(∇²J)"}
"""The diagnostics columns of rounds.parquet and what each measures (the summary keeps their last values)."""
SERVER_DIAGNOSTIC = {b"raysim": b"server diagnostic"}
"""The field metadata of a rounds.parquet column that an algorithm's ``server_diagnostics`` adds."""
ROUNDS_SCHEMA = pa.schema([
    ("round", pa.int64()), ("virtual_time", pa.float64()), ("wall_time", pa.float64()),
    ("train_loss", pa.float64()), ("test_loss", pa.float64()), ("test_accuracy", pa.float64()),
    ("personalized_accuracy", pa.float64()), ("personalized_accuracy_mean", pa.float64()),
    ("personalized_accuracy_ci95", pa.float64()),
    ("personalized_accuracy_p10", pa.float64()), ("personalized_accuracy_std", pa.float64()),  # across clients
    ("new_client_accuracy", pa.float64()), ("new_client_personalized_accuracy", pa.float64()),  # eval.new_clients
    ("clients", pa.int64()), ("samples", pa.int64()),
    ("updates_per_second", pa.float64()), ("eval_seconds", pa.float64()),
    ("late", pa.int64()), ("dropped", pa.int64()), ("failed", pa.int64()), ("stale", pa.int64()),
    ("aborted", pa.int64()),  # secure aggregation: the round's updates discarded, too few survived to unmask
    ("total_bytes_down", pa.int64()), ("total_bytes_up", pa.int64()),  # every client's, so far
    ("rel_error", pa.float64()), ("grad_norm_sq", pa.float64()), ("loss_gap", pa.float64()),
    ("deployed_loss_gap", pa.float64()), ("objective", pa.float64()), ("hessian_min_eig", pa.float64()),
    ("epsilon", pa.float64()),  # differential privacy: ε spent so far at δ, at the evaluation steps (else null)
    ("parameters", pa.list_(pa.float64())),  # eval.curvature: the global model's flat parameters (else null)
])
"""rounds.parquet's own columns (an algorithm's server_diagnostics add more)."""
EVENTS_SCHEMA = pa.schema([
    ("round", pa.int64()), ("client_id", pa.int64()), ("actor", pa.int64()), ("samples", pa.int64()),
    ("train_loss", pa.float64()), ("compute_seconds", pa.float64()), ("virtual_start", pa.float64()),
    ("virtual_end", pa.float64()), ("model_version", pa.int64()), ("staleness", pa.int64()),
    ("bytes_down", pa.int64()), ("bytes_up", pa.int64()), ("status", pa.string()), ("node", pa.string()),
])
"""events.parquet's own columns (each row also holds the client's system profile, and an algorithm's
client_diagnostics add more)."""
REPORT_HTML = "report.html"
"""`raysim report`'s self-contained page: every plot (embedded), a summary table, the scenarios' differences."""
TENSORBOARD_DIR = "tensorboard"
"""The TensorBoard event files of a run with ``output.tensorboard: true``."""
LOCK = ".raysim.lock"
RECORD = ".raysim.run"  # the files the run in the directory wrote (only those are ever replaced)
READ_ATTEMPTS = 5  # listings of a live log's parts tried by read_table (a merge may delete one meanwhile)
_LOCK_FIELDS = ("pid", "host", "process_started", "run_started")


def table_arrays(table: pa.Table) -> dict[str, np.ndarray]:
    """The columns of ``table`` as arrays; nulls become NaN (numbers) or None (strings)."""
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_dictionary(column.type):  # to_numpy misplaces nulls of dictionary arrays
            column = column.cast(column.type.value_type)
        columns[name] = column.to_numpy(zero_copy_only=False)
    return columns


def applied(events: dict[str, np.ndarray]) -> np.ndarray:
    """Mask of applied updates: status == "applied", or every event when there is no status column."""
    n = len(next(iter(events.values()))) if events else 0
    if "status" not in events:
        return np.ones(n, dtype=bool)
    return events["status"] == "applied"


class OutputDir:
    """A directory ``root`` on filesystem ``fs``; files are written whole (text, bytes, Parquet)."""

    def __init__(self, fs: pafs.FileSystem, root: str, create: bool = True):
        self.fs, self.root = fs, root.rstrip("/")
        self._lock: dict | None = None  # the lock record this object wrote (claim)
        if create:
            self.fs.create_dir(self.root, recursive=True)

    @staticmethod
    def open(location: str, create: bool = True) -> "OutputDir":
        """The directory at ``location`` (``output.dir``), created if missing (and ``create``)."""
        try:
            if "://" in location:
                fs, root = pafs.FileSystem.from_uri(location)
            else:
                fs, root = pafs.LocalFileSystem(), os.path.abspath(location)
            return OutputDir(fs, root, create)
        except (OSError, ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise ScenarioError("output.dir", location, "a writable local path or a URI that pyarrow.fs "
                                f"understands (file://, s3://, gs://, hdfs://): {first_line(exc)}") from None

    def path(self, name: str) -> str:
        """The full path of file ``name`` inside the directory."""
        return f"{self.root}/{name}"

    def local_path(self, name: str) -> str | None:
        """The path of ``name`` on a local disk; None on other filesystems."""
        return self.path(name) if isinstance(self.fs, pafs.LocalFileSystem) else None

    def write_atomic(self, name: str, write: Callable[[str], None]) -> None:
        """Write file ``name`` by calling ``write(temporary_path)``, then rename it into place;
        on failure the temporary file is removed (an OSError raises OutputError)."""
        path = self.path(name)
        tmp = _temporary(path)
        with _writing(path):
            try:
                write(tmp)
                self.fs.move(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    self.fs.delete_file(tmp)
                raise

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write file ``name`` atomically."""
        def write(tmp: str) -> None:
            with self.fs.open_output_stream(tmp) as stream:
                stream.write(data)

        self.write_atomic(name, write)

    def write_text(self, name: str, text: str) -> None:
        """Write text file ``name`` atomically."""
        self.write_bytes(name, text.encode())

    def write_table(self, name: str, columns: dict) -> None:
        """Write ``columns`` ({name: array}) as Parquet file ``name`` atomically."""
        table = pa.table(columns)
        self.write_atomic(name, lambda tmp: pq.write_table(table, tmp, filesystem=self.fs))

    def save_torch(self, name: str, obj) -> None:
        """``torch.save`` into the directory (atomically)."""
        import torch

        buffer = io.BytesIO()
        torch.save(obj, buffer)
        self.write_bytes(name, buffer.getvalue())

    def make_dir(self, name: str) -> None:
        """Create directory ``name`` (and its parents) if missing."""
        with _writing(self.path(name)):
            self.fs.create_dir(self.path(name), recursive=True)

    def remove(self, name: str) -> None:
        """Delete file or directory ``name`` (with its contents) if it exists."""
        path = self.path(name)
        with _writing(path):
            kind = self.fs.get_file_info(path).type
            if kind == pafs.FileType.Directory:
                self.fs.delete_dir(path)
            elif kind != pafs.FileType.NotFound:
                self.fs.delete_file(path)

    def reader(self, name: str):
        """A readable binary file object for file ``name`` (FileNotFoundError if missing)."""
        return self.fs.open_input_file(self.path(name))

    def read_bytes(self, name: str) -> bytes:
        """The content of file ``name`` (FileNotFoundError if missing)."""
        with self.reader(name) as stream:
            return stream.read()

    def read_table(self, name: str, columns: tuple[str, ...] | None = None):
        """Table ``name`` as a pyarrow Table (only those of ``columns`` it has, if given): a Parquet
        file, or a ParquetLog's directory of parts (parts covered by a merged one skipped);
        FileNotFoundError if it has no rows written yet. A live run's merge may delete a part
        between the listing and the read: the parts are then listed again."""
        def read(files):
            present = None if columns is None else \
                [c for c in columns if c in pq.read_schema(files[0], filesystem=self.fs).names]
            return pq.read_table(files, columns=present, filesystem=self.fs)

        return self._read_log(name, read)

    def read_schema(self, name: str):
        """The schema of table ``name`` (as :meth:`read_table` finds it), field metadata included."""
        return self._read_log(name, lambda files: pq.read_schema(files[0], filesystem=self.fs))

    def _read_log(self, name: str, read):
        """``read(files)`` of table ``name``'s Parquet files, listed again if a merge deletes one meanwhile."""
        for attempt in range(READ_ATTEMPTS):
            files = log_files(self.fs, self.path(name))
            if not files:
                raise FileNotFoundError(f"{self.path(name)}: no Parquet file or log parts")
            try:
                return read(files)
            except FileNotFoundError:
                if attempt == READ_ATTEMPTS - 1:
                    raise

    def take_over(self, replace: bool) -> None:
        """Make the (claimed) directory a new run's. An earlier run there is refused with a
        ScenarioError naming output.dir, unless ``replace``: then the files its record
        (:data:`RECORD`) lists are removed, with their temporary files, and nothing else. Files
        of raysim's names that no record lists are never removed: they are refused, replace or not.
        :meth:`record_run` then records what the new run writes."""
        record, present = self._record(), self._run_files_present()
        if record is None and present:
            raise ScenarioError("output.dir", self.root, f"a directory without results raysim did not record "
                                f"writing (it holds {', '.join(present)}, but no {RECORD}): choose another "
                                "output.dir, or move those files away")
        if record is not None and set(present) - {"scenario.yaml"}:  # a run that wrote nothing else: no results
            if not replace:
                raise ScenarioError("output.dir", self.root, self._earlier_run_text())
            names = tuple(record)
            for base in self._names():
                if base in names or (base.endswith(".tmp") and base.lstrip(".").startswith(names)):
                    self.remove(base)
            self.remove(RECORD)

    def record_run(self) -> None:
        """Record the files a new run writes (and a report into its directory will), before it writes any."""
        self.write_text(RECORD, json.dumps({"files": list(RUN_FILES) + [TENSORBOARD_DIR]}))

    def record_written(self, names) -> None:
        """Add ``names`` (a report's files) to the record of the run in this directory, if it has one."""
        record = self._record()
        if record is not None:
            self.write_text(RECORD, json.dumps({"files": list(dict.fromkeys([*record, *names]))}))

    def clear_temporary(self) -> None:
        """Remove the temporary files a writer killed mid-write left (``.<name>.<random>.tmp``)."""
        for base in self._names():
            if base.startswith(".") and base.endswith(".tmp"):
                self.remove(base)

    def _record(self) -> list | None:
        """The files the record of the run in this directory lists (None: no record)."""
        try:
            return list(json.loads(self.read_bytes(RECORD))["files"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # a damaged record cannot tell that run's files apart: as if there were none

    def _names(self) -> list:
        """The names of the directory's entries (none when it does not exist)."""
        return [info.base_name for info in self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))]

    def _run_files_present(self) -> list:
        names = RUN_FILES + tuple(PLOTS) + (REPORT_HTML, TENSORBOARD_DIR)
        return sorted(base for base in self._names() if base in names)

    def _earlier_run_text(self) -> str:
        """What output.dir must be when an earlier run's files are there, by that run's status."""
        try:
            status = json.loads(self.read_bytes("summary.json")).get("status", "unknown")
        except FileNotFoundError:
            status = "interrupted" if CHECKPOINT in self._run_files_present() else "unfinished"
        except (ValueError, AttributeError):
            status = "unknown"
        go_on = f"; raysim resume {self.root} goes on with it" if status in ("interrupted", "failed") else ""
        return (f"a directory without an earlier run (it holds one, status {status}{go_on}): run with --replace to "
                "replace that run's files, or choose another name= or output.dir=")

    def claim(self, holder: str = "run") -> "OutputDir":
        """Take the directory for this run (or another ``holder``: a sweep): write the lock file
        (pid, host, process and run start, holder); ``with out.claim(): …`` releases it at the end.

        A lock held by a live run raises ScenarioError. A lock whose process is gone (same host:
        pid not running, or running with another start time) is stale and replaced. A lock from
        another host cannot be checked and counts as live. On a local disk the lock is created
        atomically; on other filesystems it is written if absent, then read back."""
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "process_started": psutil.Process().create_time(),
                  "run_started": datetime.now().astimezone().isoformat(timespec="seconds"), "holder": holder}
        for _ in range(3):  # another run may take the lock between our look and our write
            held = self._read_lock()
            if held and held != self._lock and _running(held):
                raise ScenarioError("output.dir", self.root, _held_text(held, self.path(LOCK)))
            if held is not None:
                self.remove(LOCK)
            if self._create_lock(record):
                self._lock = record
                return self
        raise OutputError(self.path(LOCK), "other runs keep taking the lock")

    def release(self) -> None:
        """Remove the lock file if it is still the one :meth:`claim` wrote."""
        if self._lock is not None and self._read_lock() == self._lock:
            self.remove(LOCK)
        self._lock = None

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _read_lock(self) -> dict | None:
        """The lock's record: None without a lock, {} for an unreadable or incomplete one (stale)."""
        try:
            record = json.loads(self.read_bytes(LOCK))
        except FileNotFoundError:
            return None
        except ValueError:
            return {}
        return record if isinstance(record, dict) and all(k in record for k in _LOCK_FIELDS) else {}

    def _create_lock(self, record: dict) -> bool:
        """Write the lock file unless one exists; whether it now holds ``record``."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            self.write_text(LOCK, json.dumps(record))
            return self._read_lock() == record
        path = self.path(LOCK)
        tmp = _temporary(path)
        with _writing(path):
            with open(tmp, "w") as f:
                json.dump(record, f)
            try:
                os.link(tmp, path)  # fails if the lock exists: never a partial lock file
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        return True


def _temporary(path: str) -> str:
    """A hidden temporary name beside ``path`` (dataset readers skip names starting with '.')."""
    folder, base = path.rsplit("/", 1)
    return f"{folder}/.{base}.{uuid.uuid4().hex[:12]}.tmp"


@contextlib.contextmanager
def _writing(path: str):
    """Turn an OSError into a one-line OutputError naming ``path``."""
    try:
        yield
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc).strip().split("\n")[0] or type(exc).__name__
        raise OutputError(path, reason) from None


def _running(lock: dict) -> bool:
    """Whether the run that wrote ``lock`` may still be going: on this host, its process (same
    pid and start time) is alive; on another host it cannot be checked, so it may."""
    try:
        if lock["host"] != socket.gethostname():
            return True
        process = psutil.Process(lock["pid"])
        return (process.status() != psutil.STATUS_ZOMBIE
                and abs(process.create_time() - lock["process_started"]) < 1.0)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _held_text(lock: dict, lock_path: str) -> str:
    """What output.dir must be, given the live run (or sweep) holding it."""
    holder = lock.get("holder", "run")  # older raysims wrote no holder: runs
    text = (f"a directory no other live {holder} is writing to (pid {lock['pid']} on {lock['host']} "
            f"has held it since {lock['run_started']}")
    if lock["host"] != socket.gethostname():
        text += f"; if that {holder} is gone, delete {lock_path}"
    return text + ")"
