"""output.dir on pyarrow filesystems: local paths, file:// URIs, an in-memory filesystem."""

from __future__ import annotations

import json

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import small_scenario

from raysim.engine.runtime import LocalRuntime
from raysim.engine.simulation import prepare, run_scenario
from raysim.errors import ScenarioError
from raysim.metrics import OutputDir


def test_file_uri(tmp_path):
    cfg = small_scenario(tmp_path, f"output.dir=file://{tmp_path}/uri/run")
    summary = run_scenario(cfg, prepare(cfg), LocalRuntime())
    run = tmp_path / "uri/run"
    assert json.loads((run / "summary.json").read_text())["model_sha256"] == summary["model_sha256"]
    assert pq.read_table(run / "rounds.parquet").num_rows == 3 and (run / "model.pt").stat().st_size > 0


def test_in_memory_filesystem(tmp_path):
    cfg = small_scenario(tmp_path)
    prepared = prepare(cfg)
    memory = pafs._MockFileSystem()
    prepared.output = OutputDir(memory, "bucket/runs/small")
    summary = run_scenario(cfg, prepared, LocalRuntime())
    names = {info.base_name for info in memory.get_file_info(pafs.FileSelector("bucket/runs/small"))}
    assert names == {"scenario.yaml", "rounds.parquet", "events.parquet", "summary.json", "model.pt"}
    assert pq.read_table("bucket/runs/small/events.parquet", filesystem=memory).num_rows == 3 * 12
    with memory.open_input_stream("bucket/runs/small/summary.json") as f:
        assert json.loads(f.read())["model_sha256"] == summary["model_sha256"]


def test_bad_output_uri_is_an_input_error(tmp_path):
    cfg = small_scenario(tmp_path, "output.dir=nosuchfs://bucket/run")
    with pytest.raises(ScenarioError, match=r"^output.dir = 'nosuchfs://bucket/run': expected a writable local path"):
        prepare(cfg)
