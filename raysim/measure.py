"""What a run costs: wall time and peak memory of a command's whole process tree (Ray's daemons and
workers included), and the steady rate of its rounds. Shared by ``raysim bench`` and ``raysim sweep``."""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from contextlib import contextmanager

import psutil

MIB = 1024 * 1024


def steady(round_seconds: list, clients_per_round: int) -> tuple[float, float]:
    """(updates/s, seconds per round) from the median round after the first (warm-up): the
    median keeps a hiccup of a shared machine from moving a 5-round figure."""
    per_round = statistics.median(round_seconds[1:] or round_seconds)
    return clients_per_round / per_round, per_round


def _tree_memory(root: psutil.Process, pss: bool) -> int:
    """Sum of PSS (``pss``) or RSS in bytes over ``root`` and all its descendants."""
    try:
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss if pss else proc.memory_info().rss
        except psutil.Error:
            continue
    return total


@contextmanager
def peak_memory(pid: int, rss_interval: float = 0.2, pss_every: int = 5):
    """Sample the memory of process ``pid`` and its descendants in a thread while the block runs;
    yields a dict whose ``rss`` and ``pss`` hold the peaks so far (bytes), final once the block ends.

    PSS (proportional set size) splits shared pages, such as the object store
    and shared libraries, between the processes that map them; it is the
    memory the tree really uses. RSS counts shared pages once per process.
    RSS is cheap to read and is sampled every ``rss_interval`` seconds; PSS walks
    each process's page tables (which slows the process being measured), so it
    is sampled only every ``pss_every`` RSS samples.
    """
    root = psutil.Process(pid)
    peak = {"pss": 0, "rss": 0}
    stop = threading.Event()

    def sample():
        tick = 0
        while not stop.is_set():
            peak["rss"] = max(peak["rss"], _tree_memory(root, pss=False))
            if tick % pss_every == pss_every - 1:
                peak["pss"] = max(peak["pss"], _tree_memory(root, pss=True))
            tick += 1
            stop.wait(rss_interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()


def measure(command: list, rss_interval: float = 0.2, pss_every: int = 5, started=None, env=None,
            cwd=None) -> dict:
    """Run ``command`` (in environment ``env`` and directory ``cwd``, or this process's); return its
    exit code, wall seconds and peak tree PSS/RSS (bytes), sampled as :func:`peak_memory` does.
    ``started(popen)``, if given, is called once the process runs (e.g. to keep its pid, to stop it
    from another thread)."""
    began = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=cwd)
    if started is not None:
        started(proc)
    with peak_memory(proc.pid, rss_interval, pss_every) as peak:
        code = proc.wait()
    wall = time.perf_counter() - began
    return {"returncode": code, "wall_seconds": wall, "peak_pss": peak["pss"], "peak_rss": peak["rss"]}
