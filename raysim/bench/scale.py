"""``raysim bench --scale``: W1 with a million registered clients against W1 itself (1,000 clients),
both in one command, as a sweep of ``data.num_clients`` whose points each run in a fresh process.

Both sides evaluate the same number of clients (``eval.clients``), so the comparison is about the
registered population alone: client data built on demand, per-step costs that follow the sampled
clients, and the process tree's peak memory.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pyarrow.parquet as pq

from raysim.bench import SCENARIOS
from raysim.measure import MIB

REFERENCE_CLIENTS = 1000
EVALUATED = 1000  # eval.clients on both sides: W1's whole population
MEMORY_TARGET = 2 * 1024 * MIB


def check_clients(clients) -> None:
    """``--clients`` must be an integer above W1's own population (ScenarioError)."""
    from raysim.errors import ScenarioError

    if isinstance(clients, bool) or not isinstance(clients, int) or clients <= REFERENCE_CLIENTS:
        raise ScenarioError("--clients", clients, f"an integer > {REFERENCE_CLIENTS:,} (W1's own population)")


def run_scale_bench(out: Path, repeat: int, clients: int = 1_000_000) -> dict:
    """Run W1 with ``REFERENCE_CLIENTS`` and with ``clients`` registered clients ``repeat`` times each
    (a fresh sweep: earlier results in ``out/scale`` are removed) and print the medians and ratios."""
    from raysim.sweep import plan_sweep, run_sweep

    check_clients(clients)
    where = out / "scale"
    shutil.rmtree(where, ignore_errors=True)  # a benchmark measures now: it never reuses a finished point
    sweep = plan_sweep(str(SCENARIOS / "w1.yaml"), [f"data.num_clients={REFERENCE_CLIENTS},{clients}"],
                       [f"eval.clients={EVALUATED}"], repeat=repeat, out=str(where))
    run_sweep(sweep, quiet=True)
    rows = pq.read_table(where / "sweep.parquet").to_pylist()
    figures = {}
    for n in (REFERENCE_CLIENTS, clients):
        mine = [r for r in rows if r["data.num_clients"] == n]
        figures[n] = {k: statistics.median(r[k] for r in mine) for k in
                      ("wall_seconds", "startup_seconds", "median_round_seconds", "peak_rss_bytes",
                       "steady_updates_per_second", "final_test_accuracy")}
        f = figures[n]
        print(f"W1, {n:>9,} clients: wall {f['wall_seconds']:6.2f} s, first round after {f['startup_seconds']:5.2f} s, "
              f"median round {f['median_round_seconds']:.4f} s, {f['steady_updates_per_second']:6.0f} updates/s, "
              f"peak RSS {f['peak_rss_bytes'] / MIB:5.0f} MiB, accuracy {f['final_test_accuracy']:.4f}")
    ref, big = figures[REFERENCE_CLIENTS], figures[clients]
    ratios = {"round_time": big["median_round_seconds"] / ref["median_round_seconds"],
              "startup_extra_seconds": big["startup_seconds"] - ref["startup_seconds"],
              "peak_rss_mib": big["peak_rss_bytes"] / MIB,
              "peak_rss_over_w1": big["peak_rss_bytes"] / ref["peak_rss_bytes"]}
    print(f"{clients:,} clients / W1: median round {ratios['round_time']:.2f}x (target <= 1.2), first round "
          f"{ratios['startup_extra_seconds']:+.2f} s (target <= +3 s), peak RSS {ratios['peak_rss_mib']:.0f} MiB "
          f"= {ratios['peak_rss_over_w1']:.2f}x W1's (target <= {MEMORY_TARGET / MIB:.0f} MiB)")
    return {"clients": clients, "repeat": repeat, "figures": {str(k): v for k, v in figures.items()}, "ratios": ratios}
