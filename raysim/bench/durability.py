"""``raysim bench --durability``: what checkpoints and resuming cost, and whether the driver's
memory stays flat over a long asynchronous run.

- checkpoint cost: W1 with a checkpoint after every round; the run's own count of checkpoint
  seconds and bytes, against the median round time of the same run;
- resume: W1 interrupted with SIGINT after its first checkpoint, then ``raysim resume``; the
  resume's wall time and (interrupted + resumed) against the uninterrupted W1 of the same command,
  and whether both ended with the same ``model_sha256``;
- driver memory: the scheduler-throughput scenario (FedAsync, 1,000 in flight) for ``events``
  applied updates, the driver process's RSS sampled throughout: early, middle and last samples.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from raysim.measure import MIB, measure

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios" / "bench"


def _cli(*args) -> list:
    return [sys.executable, "-m", "raysim.cli", *args, "--quiet"]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def checkpoint_cost(out: Path) -> dict:
    """W1 with a checkpoint after every round: seconds and bytes per checkpoint, share of a round."""
    run_dir = out / "checkpoint_every_round"
    figures = measure(_cli("run", "--replace", str(SCENARIOS / "w1.yaml"), f"output.dir={run_dir}",
                           "output.checkpoint_every=1"))
    summary = _summary(run_dir)
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pydict()
    per_round = statistics.median(c / u for c, u in zip(rounds["clients"][1:], rounds["updates_per_second"][1:]))
    made = summary["checkpoints"]
    seconds = made["seconds"] / made["count"]
    return {"wall_seconds": figures["wall_seconds"], "checkpoints": made["count"], "seconds_each": seconds,
            "bytes": made["bytes"], "round_seconds": per_round, "share_of_round": seconds / per_round}


def resume_cost(out: Path) -> dict:
    """W1 uninterrupted, and W1 stopped by SIGINT after its first checkpoint then resumed."""
    whole = out / "uninterrupted"
    reference = measure(_cli("run", "--replace", str(SCENARIOS / "w1.yaml"), f"output.dir={whole}"))
    stopped = out / "interrupted"
    began = time.perf_counter()
    proc = subprocess.Popen(_cli("run", "--replace", str(SCENARIOS / "w1.yaml"), f"output.dir={stopped}",
                                 "output.checkpoint_every=2"))
    while not (stopped / "checkpoint.pt").exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    code = proc.wait()
    first = time.perf_counter() - began
    at_step = _summary(stopped)["server_steps"]
    resumed = measure(_cli("resume", str(stopped)))
    return {"uninterrupted_seconds": reference["wall_seconds"], "interrupted_seconds": first,
            "interrupted_exit": code, "resume_seconds": resumed["wall_seconds"], "resume_exit": resumed["returncode"],
            "resumed_at_step": at_step,
            "same_model": _summary(whole)["model_sha256"] == _summary(stopped)["model_sha256"],
            "total_over_uninterrupted": (first + resumed["wall_seconds"]) / reference["wall_seconds"]}


def driver_memory(out: Path, events: int, interval: float = 1.0) -> dict:
    """RSS of the driver process over a FedAsync run of ``events`` applied updates."""
    run_dir = out / "long_async"
    proc = subprocess.Popen(_cli("run", "--replace", str(SCENARIOS / "scheduler.yaml"), f"output.dir={run_dir}",
                                 f"execution.max_updates={events}", "execution.concurrency=1000",
                                 "data.num_clients=5000"))
    driver = psutil.Process(proc.pid)
    samples = []

    def sample():
        began = time.perf_counter()
        while proc.poll() is None:
            try:
                rss = driver.memory_info().rss
            except psutil.Error:
                return
            if rss:  # 0: the driver has exited and waits to be reaped
                samples.append((time.perf_counter() - began, rss))
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    sampler.join()
    summary = _summary(run_dir)
    rss = [r for _, r in samples]
    tenth = max(1, len(rss) // 10)
    return {"exit": code, "events": summary["client_updates"], "wall_seconds": samples[-1][0] if samples else None,
            "rss_early": statistics.median(rss[tenth:2 * tenth]), "rss_middle": statistics.median(
                rss[len(rss) // 2 - tenth // 2:len(rss) // 2 + tenth // 2 + 1]),
            "rss_last": statistics.median(rss[-tenth:]), "rss_peak": max(rss),
            "checkpoints": summary["checkpoints"]}


def run_durability_bench(out: Path, events: int) -> dict:
    """Run the three measurements, print them, return them."""
    results = {"checkpoint": checkpoint_cost(out)}
    c = results["checkpoint"]
    print(f"checkpoint after every W1 round: {c['seconds_each'] * 1000:.1f} ms each ({c['bytes'] / 1024:.0f} KiB), "
          f"{c['share_of_round']:.1%} of a {c['round_seconds'] * 1000:.0f} ms round", flush=True)
    results["resume"] = r = resume_cost(out)
    print(f"W1 interrupted (SIGINT, exit {r['interrupted_exit']}) {r['interrupted_seconds']:.1f} s + resume "
          f"{r['resume_seconds']:.1f} s (from step {r['resumed_at_step']}) = {r['total_over_uninterrupted']:.2f}x the uninterrupted "
          f"{r['uninterrupted_seconds']:.1f} s; same model_sha256: {r['same_model']}", flush=True)
    results["memory"] = m = driver_memory(out, events)
    print(f"driver RSS over {m['events']:,} async updates ({m['wall_seconds']:.0f} s): early "
          f"{m['rss_early'] / MIB:.0f} MiB, middle {m['rss_middle'] / MIB:.0f} MiB, last {m['rss_last'] / MIB:.0f} MiB "
          f"(last/early {m['rss_last'] / m['rss_early']:.2f}x), peak {m['rss_peak'] / MIB:.0f} MiB; "
          f"{m['checkpoints']['count']} checkpoints", flush=True)
    return results
