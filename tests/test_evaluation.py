"""Global evaluation: one rule (per evaluation task, per client, pooled in client-id order), run on the
driver or on the client hosts (``eval.where``) with the same bits."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from conftest import small_scenario

from raysim.algorithms import RowData
from raysim.engine.evaluation import PooledTests, client_tests
from raysim.engine.runtime import LocalRuntime
from raysim.engine.run_evaluation import evaluates_on_hosts
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.models import FlatModel

METRICS = ["round", "virtual_time", "train_loss", "test_loss", "test_accuracy", "clients", "samples"]


def _metrics(cfg) -> tuple[dict, dict]:
    summary = run_scenario(prepare(cfg), LocalRuntime())
    table = pq.read_table(f"{cfg.output.dir}/rounds.parquet")
    return summary, {c: table.column(c).to_pylist() for c in METRICS}


@pytest.mark.parametrize("mode", [["eval.every=1"],
                                  ["execution.mode=async", "execution.concurrency=8", "execution.max_updates=24",
                                   "eval.every=5", "eval.clients=13"]])
def test_the_driver_and_the_hosts_give_the_same_bits(tmp_path, mode):
    driver, rows = _metrics(small_scenario(tmp_path / "driver", *mode, "eval.where=driver"))
    hosts, host_rows = _metrics(small_scenario(tmp_path / "hosts", *mode, "eval.where=actors"))
    assert (driver["evaluated_on"], hosts["evaluated_on"]) == ("driver", "actors")
    assert rows == host_rows
    assert driver["final_test_loss"] == hosts["final_test_loss"] and np.isfinite(driver["final_test_loss"])
    assert driver["model_sha256"] == hosts["model_sha256"]
    assert sum(loss is not None for loss in rows["test_loss"]) >= 3


def test_each_client_is_summed_over_its_own_rows_in_float64():
    torch.manual_seed(0)
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(5, 3)))
    params = model.initial_vector()
    features, labels = torch.randn(40, 5), torch.randint(0, 3, (40,))
    offsets = np.array([[0, 4, 9], [9, 12, 12], [20, 21, 40]])  # (train start, test start, test end); one without tests
    got = client_tests(model, params, RowData(features, labels, offsets), np.array([7, 3, 5]), chunk=6)
    assert got.test_rows.tolist() == [5, 0, 19] and got.test_loss_sum.dtype == np.float64
    for c, (_, lo, hi) in enumerate(offsets):
        logits = model.logits(params, features[lo:hi])
        per_row = F.cross_entropy(logits, labels[lo:hi], reduction="none").double()
        # the same sum, up to the kernels' rounding of rows batched otherwise (here: per client)
        assert np.isclose(got.test_loss_sum[c], sum(per_row.tolist()), rtol=1e-6, atol=0)
        assert got.test_correct[c] == int((logits.argmax(1) == labels[lo:hi]).sum())
    loss, accuracy = _pooled(got)
    assert accuracy == got.test_correct.sum() / 24 and np.isclose(loss, got.test_loss_sum.sum() / 24, rtol=1e-12)
    assert all(np.isnan(_pooled(client_tests(model, params, RowData(features, labels, offsets[1:2]), np.array([3])))))


def _pooled(tests) -> tuple[float, float]:
    pooled = PooledTests(np.sort(tests.client_ids))
    pooled.add(tests)
    return pooled.result()


def test_auto_tests_on_the_hosts_only_with_gpus_in_synchronous_rounds(tmp_path):
    def hosts(*overrides):
        return evaluates_on_hosts(small_scenario(tmp_path, *overrides, backend="ray"))

    assert not hosts() and hosts("runtime.gpus_per_actor=0.5")
    assert not hosts("runtime.gpus_per_actor=0.5", "execution.mode=async", "execution.concurrency=4",
                     "execution.max_updates=8")
    assert hosts("eval.where=actors") and not hosts("runtime.gpus_per_actor=1", "eval.where=driver")


@pytest.mark.parametrize("scenario, override, message", [
    ("quickstart.yaml", "eval.where=gpu", "error: eval.where = 'gpu': expected one of actors, auto, driver"),
    ("paper/ffgg_quadratic_cg.yaml", "eval.where=actors",  # a quadratic problem's evaluation is exact, on the driver
     "error: eval.where = 'actors': expected no setting (it applies only with data.kind != quadratic"),
])
def test_bad_eval_where_is_one_line_before_anything_runs(tmp_path, scenario, override, message):
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", f"scenarios/{scenario}", "--quiet", override,
                           f"output.dir={tmp_path}/run"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
