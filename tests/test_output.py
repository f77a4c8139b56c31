"""output.dir on pyarrow filesystems (local paths, file:// URIs, an in-memory filesystem); atomic writes,
the lock a run holds on its directory, and clearing an earlier run's files."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import psutil
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import small_overrides, small_scenario

from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.errors import OutputError, ScenarioError
from raysim.output import OutputDir
from raysim.output.directory import LOCK


def test_file_uri(tmp_path):
    cfg = small_scenario(tmp_path, f"output.dir=file://{tmp_path}/uri/run")
    summary = run_scenario(prepare(cfg), LocalRuntime())
    run = tmp_path / "uri/run"
    assert json.loads((run / "summary.json").read_text())["model_sha256"] == summary["model_sha256"]
    assert pq.read_table(run / "rounds.parquet").num_rows == 3 and (run / "model.pt").stat().st_size > 0


def test_in_memory_filesystem(tmp_path):
    cfg = small_scenario(tmp_path)
    prepared = prepare(cfg)
    memory = pafs._MockFileSystem()
    prepared.output = OutputDir(memory, "bucket/runs/small")
    summary = run_scenario(prepared, LocalRuntime())
    names = {info.base_name for info in memory.get_file_info(pafs.FileSelector("bucket/runs/small"))}
    assert names == {".raysim.run", "scenario.yaml", "rounds.parquet", "events.parquet", "summary.json", "model.pt"}
    assert pq.read_table("bucket/runs/small/events.parquet", filesystem=memory).num_rows == 3 * 12
    with memory.open_input_stream("bucket/runs/small/summary.json") as f:
        assert json.loads(f.read())["model_sha256"] == summary["model_sha256"]


def test_bad_output_uri_is_an_input_error(tmp_path):
    with pytest.raises(ScenarioError, match=r"^output.dir = 'nosuchfs://bucket/run': expected a local path or a "
                                            r"URI of a lasting filesystem \(file://, s3://"):
        small_scenario(tmp_path, "output.dir=nosuchfs://bucket/run")
    with pytest.raises(ScenarioError, match=r"^output.dir = 'hdfs://nowhere:1/run': expected a writable local path"):
        OutputDir.open("hdfs://nowhere:1/run")


def test_writes_are_atomic_and_a_failed_one_keeps_the_old_file(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    out.write_text("summary.json", "old")
    out.write_text("summary.json", "new")

    def fill_the_disk(tmp):
        with open(tmp, "w") as f:
            f.write("half of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError) as error:
        out.write_atomic("summary.json", fill_the_disk)
    assert str(error.value) == f"cannot write {tmp_path}/run/summary.json: No space left on device"
    assert error.value.__suppress_context__ and error.value.__cause__ is None
    assert os.listdir(tmp_path / "run") == ["summary.json"] and (tmp_path / "run/summary.json").read_text() == "new"


def lock_of(pid: int, host: str | None = None, started: float | None = None) -> dict:
    return {"pid": pid, "host": host or socket.gethostname(),
            "process_started": psutil.Process(pid).create_time() if started is None else started,
            "run_started": "2030-01-02T03:04:05+00:00"}


def test_a_live_run_holds_the_directory_until_its_process_is_gone(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "run" / LOCK).write_text(json.dumps(lock_of(holder.pid)))
        with pytest.raises(ScenarioError) as error:
            out.claim()
        assert str(error.value) == (f"output.dir = '{tmp_path}/run': expected a directory no other live run is "
                                    f"writing to (pid {holder.pid} on {socket.gethostname()} has held it since "
                                    "2030-01-02T03:04:05+00:00)")
    finally:
        holder.kill()
        holder.wait()
    with out.claim():  # the holder is gone: its lock is stale
        assert json.loads((tmp_path / "run" / LOCK).read_text())["pid"] == os.getpid()
    assert not (tmp_path / "run" / LOCK).exists()


def test_a_lock_whose_pid_was_reused_is_stale(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    (tmp_path / "run" / LOCK).write_text(json.dumps(lock_of(os.getpid(), started=1.0)))
    out.claim()
    assert json.loads((tmp_path / "run" / LOCK).read_text())["process_started"] == psutil.Process().create_time()


def test_a_lock_from_another_host_counts_as_live_and_says_how_to_remove_it(tmp_path):
    out = OutputDir.open(str(tmp_path / "run"))
    (tmp_path / "run" / LOCK).write_text(json.dumps(lock_of(os.getpid(), host="elsewhere")))
    with pytest.raises(ScenarioError, match=rf"pid {os.getpid()} on elsewhere has held it since 2030-01-02T03:04:05"
                                            rf"\+00:00; if that run is gone, delete {tmp_path}/run/\.raysim\.lock\)$"):
        out.claim()


def test_claims_on_another_filesystem_and_release_removes_only_our_lock():
    memory = pafs._MockFileSystem()
    first, second = OutputDir(memory, "bucket/run"), OutputDir(memory, "bucket/run")
    first.claim()
    with pytest.raises(ScenarioError, match=f"pid {os.getpid()} on "):
        second.claim()  # a second run of this very process
    second.release()
    assert memory.get_file_info(f"bucket/run/{LOCK}").type == pafs.FileType.File
    first.release()
    assert [i.base_name for i in memory.get_file_info(pafs.FileSelector("bucket/run"))] == []
    with second.claim():
        assert memory.get_file_info(f"bucket/run/{LOCK}").type == pafs.FileType.File
    assert memory.get_file_info(f"bucket/run/{LOCK}").type == pafs.FileType.NotFound


def test_replacing_an_earlier_run_removes_the_files_its_record_lists_and_keeps_the_users(tmp_path):
    from raysim.output.directory import RECORD

    run = tmp_path / "run"
    out = OutputDir.open(str(run)).claim()
    out.take_over(replace=False)  # an empty directory
    out.record_run()
    for name in ["scenario.yaml", "summary.json", "model.pt", "checkpoint.pt", "events.parquet",
                 ".summary.json.0123abcd.tmp", "accuracy_vs_wall_time.png", "notes.txt", "my_plot.png",
                 "data.parquet", "draft.tmp"]:
        (run / name).write_bytes(b"x")
    (run / "rounds.parquet").mkdir()
    (run / "rounds.parquet/part-000000000000-000000000001-0.parquet").write_bytes(b"x")
    with pytest.raises(ScenarioError,
                       match=r"expected a directory without an earlier run \(it holds one, status unknown"):
        out.take_over(replace=False)
    out.record_written(["accuracy_vs_wall_time.png"])  # a report into the run's directory
    out.take_over(replace=True)
    assert sorted(os.listdir(run)) == sorted([LOCK, "data.parquet", "draft.tmp", "my_plot.png", "notes.txt"])
    (run / "summary.json").write_bytes(b"the user's own")
    with pytest.raises(ScenarioError, match=r"without results raysim did not record writing \(it holds summary.json"):
        out.take_over(replace=True)
    assert (run / "summary.json").read_bytes() == b"the user's own"


def _limited_file_size(limit: int):
    """A preexec_fn: files of the child may not grow beyond ``limit`` bytes (EFBIG, as a full disk
    would give ENOSPC; root cannot bypass it)."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_disk_error_mid_run_is_one_line_and_both_logs_cover_the_same_steps(tmp_path):
    overrides = small_overrides(tmp_path, "execution.rounds=2000", "output.save_model=false")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("name: small\n")
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(scenario), *overrides, "--quiet"],
                          capture_output=True, text=True, timeout=300, preexec_fn=_limited_file_size(40_000))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"error: cannot write {tmp_path}/out/") and first.endswith("File too large"), proc.stderr
    rounds, events = pq.read_table(f"{tmp_path}/out/rounds.parquet"), pq.read_table(f"{tmp_path}/out/events.parquet")
    assert 0 < rounds.num_rows < 2000
    assert sorted(set(events.column("round").to_pylist())) == rounds.column("round").to_pylist()
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == first.removeprefix("error: ")
    assert summary["rounds"] == rounds.num_rows
