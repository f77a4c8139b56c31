"""Evaluation over every client streams (issue 41, section 1): a chunk of tasks' rows is built,
tested and dropped before the next, so memory does not grow with the evaluated population, the
figures are those of the evaluation that built every client's rows at once, to the last bit, and a
long evaluation shows its progress."""

from __future__ import annotations

import io
import math
import sys
import tracemalloc

import pyarrow.parquet as pq
import pytest
from conftest import small_scenario

from raysim.engine import dispatch, run_evaluation
from raysim.engine.run import run_scenario
from raysim.engine.runtime import LocalRuntime
from raysim.preparation import prepare

EVALUATED = ["test_loss", "test_accuracy", "personalized_accuracy", "personalized_accuracy_mean",
             "personalized_accuracy_ci95"]
# the two evaluations of _evaluated's run (600 clients, after rounds 1 and 2), as float.hex, from the
# evaluation that built every evaluated client's test rows at once and ran every task in one call
# (the code before streaming, on the driver and on the hosts, built on demand or up front alike)
ALL_AT_ONCE = {"test_loss": ["0x1.27b7a37db22d1p+1", "0x1.231a0fd3cc1e1p+1"],
               "test_accuracy": ["0x1.c8b4395810625p-4", "0x1.fbe76c8b43958p-4"],
               "personalized_accuracy": ["0x1.5e8ca11bfd44fp-3", "0x1.994237fa89e61p-3"],
               "personalized_accuracy_mean": ["0x1.5e8ca11bfd44fp-3", "0x1.994237fa89e61p-3"],
               "personalized_accuracy_ci95": ["0x1.958657b3d3570p-7", "0x1.9f0e9848bb6e6p-7"]}


def _evaluated(tmp_path, monkeypatch, max_rows: int | None, *overrides) -> tuple[dict, list]:
    """The evaluated columns (float.hex) of a 2-round run of 600 clients with personalized evaluation
    whose evaluation chunks hold at most ``max_rows`` rows (None: as many as data.cache_mb says),
    and the number of tasks of each chunk."""
    sizes = []

    def chunks(tasks, client_rows, rows):
        for chunk in dispatch.task_chunks(tasks, client_rows, rows if max_rows is None else max_rows):
            sizes.append(len(chunk))
            yield chunk

    monkeypatch.setattr(run_evaluation, "task_chunks", chunks)
    cfg = small_scenario(tmp_path, "data.num_clients=600", "execution.rounds=2", "eval.personalized_steps=2",
                         "runtime.clients_per_task=7", *overrides)
    run_scenario(prepare(cfg), LocalRuntime())
    table = pq.read_table(f"{cfg.output.dir}/rounds.parquet")
    return {c: [float(v).hex() for v in table.column(c).to_pylist()] for c in EVALUATED}, sizes


@pytest.mark.parametrize("where", ["driver", "actors"])
@pytest.mark.parametrize("on_demand", ["true", "false"])
def test_streamed_evaluation_equals_the_all_at_once_evaluation_bit_for_bit(tmp_path, monkeypatch, where, on_demand):
    """Chunks of at most 4,000 rows (4 to 8 tasks of 7 clients): the same bits as one chunk of all 600 clients
    and as the code before streaming, global and personalized, on the driver and on the hosts."""
    keys = (f"eval.where={where}", f"data.on_demand={on_demand}")
    streamed, chunks = _evaluated(tmp_path / "streamed", monkeypatch, 4000, *keys)
    whole, one = _evaluated(tmp_path / "whole", monkeypatch, None, *keys)  # 600 × ~130 rows fit data.cache_mb
    assert len(chunks) > 4 * 20 and max(chunks) < 10 and one == [86] * 4  # 2 × (global, personalized)
    assert streamed == whole == ALL_AT_ONCE


def test_every_one_of_100000_on_demand_clients_is_evaluated_in_bounded_memory(tmp_path):
    """10⁵ registered clients built on demand (50 rows of 16 features each, 10 of them test rows:
    ~470 MiB built at once before) are all evaluated, and the run's Python allocations peak within
    two chunks of data.cache_mb and a few 8-byte arrays per client."""
    clients, cache_mb = 100_000, 4
    cfg = small_scenario(tmp_path, "data.kind=synthetic_images", f"data.num_clients={clients}", "data.num_classes=4",
                         "data.samples_per_client=40", "data.image_shape=[1,4,4]", "data.test_fraction=0.2",
                         "data.on_demand=true", f"data.cache_mb={cache_mb}", "execution.rounds=1", "eval.every=0",
                         "runtime.clients_per_task=100")
    prepared = prepare(cfg)
    tracemalloc.start()
    try:
        summary = run_scenario(prepared, LocalRuntime())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert summary["status"] == "completed" and summary["data_on_demand"]
    assert summary["evaluated_clients"] == clients and 0.2 < summary["final_test_accuracy"] < 1
    bound = 2 * cache_mb * 2 ** 20 + 64 * clients + 8 * 2 ** 20
    print(f"peak of Python allocations: {peak / 2 ** 20:.1f} MiB (bound {bound / 2 ** 20:.1f} MiB)")
    assert peak < bound


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_evaluation_shows_its_progress_on_a_terminal(tmp_path, monkeypatch):
    """A bar over the evaluated clients (global, then personalized) once an evaluation lasts
    SHOWN_AFTER seconds, on a terminal only; it is cleared when the evaluation ends."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(run_evaluation, "SHOWN_AFTER", 0)
    cfg = small_scenario(tmp_path, "data.num_clients=200", "execution.rounds=1", "eval.personalized_steps=1")
    summary = run_scenario(prepare(cfg), LocalRuntime())
    shown = terminal.getvalue()
    assert "evaluating:   0%|          | 0/200" in shown and "personalizing:   0%|          | 0/200" in shown, shown
    assert shown.endswith("\r")  # cleared
    assert math.isfinite(summary["final_test_accuracy"])
    piped = io.StringIO()  # not a terminal: nothing shown
    monkeypatch.setattr(sys, "stderr", piped)
    run_scenario(prepare(small_scenario(tmp_path / "piped", "data.num_clients=200", "execution.rounds=1")),
                 LocalRuntime())
    assert "evaluating" not in piped.getvalue()
