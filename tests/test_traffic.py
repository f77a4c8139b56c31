"""Bytes on the wire: every task's downloaded and uploaded bytes in events.parquet, the totals so far
in rounds.parquet and the run's in summary.json, and the virtual time those bytes take."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import small_scenario

import raysim

NETWORK = ["system.network.kind=constant", "system.network.down_mbps=10", "system.network.up_mbps=1",
           "system.network.latency_s=0.5", "system.compute.seconds_per_sample=1e-9", "system.dropout=0.2"]


def _run(tmp_path, *overrides):
    result = raysim.run(small_scenario(tmp_path, *NETWORK, *overrides))
    out = result.output_dir
    return result.summary, pq.read_table(f"{out}/rounds.parquet").to_pandas(), \
        pq.read_table(f"{out}/events.parquet").to_pandas()


@pytest.mark.parametrize("mode", ["sync", "fedbuff"])
def test_each_task_moves_the_models_and_the_updates_bytes_in_the_time_the_network_gives(tmp_path, mode):
    extra = ([] if mode == "sync" else ["execution.mode=async", "execution.aggregation=fedbuff",
                                        "execution.buffer_size=4", "execution.concurrency=6",
                                        "execution.max_updates=24"])
    summary, rounds, events = _run(tmp_path, *extra)
    parameters = summary["model"]["parameters"]
    assert (events.bytes_down == 4 * parameters).all()  # the float32 model
    failed = events.status == "failed"
    assert failed.any() and (events.bytes_up[failed] == 0).all() and (events.bytes_up[~failed] == 4 * parameters).all()
    # next to no compute time (1e-9 s a sample): a task that ends takes 2 latencies and its bytes over the bandwidths
    done = events[~failed]
    expected = 2 * 0.5 + done.bytes_down * 8 / 10e6 + done.bytes_up * 8 / 1e6
    np.testing.assert_allclose(done.virtual_end - done.virtual_start, expected, rtol=0, atol=1e-5)
    assert summary["bytes_up"] == events.bytes_up.sum() == rounds.total_bytes_up.iloc[-1]
    assert summary["bytes_down"] == events.bytes_down.sum() == rounds.total_bytes_down.iloc[-1]
    assert (np.diff(rounds.total_bytes_up) >= 0).all()


def test_the_report_plots_accuracy_against_bytes_uploaded(tmp_path):
    from raysim.report.figures import write_report

    result = raysim.run(small_scenario(tmp_path, "execution.rounds=2"))
    assert any(p.endswith("accuracy_vs_bytes_up.png") for p in write_report([result.output_dir]))
