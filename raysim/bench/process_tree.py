"""Wall time and peak memory of a command's whole process tree (Ray's daemons and workers included)."""

from __future__ import annotations

import subprocess
import threading
import time

import psutil


def _tree_memory(root: psutil.Process) -> tuple[int, int]:
    """(sum of PSS, sum of RSS) in bytes over ``root`` and all its descendants."""
    pss = rss = 0
    try:
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0, 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
            pss += getattr(info, "pss", info.rss)
            rss += info.rss
        except psutil.Error:
            continue
    return pss, rss


def measure(command: list, interval: float = 0.2) -> dict:
    """Run ``command``; return its exit code, wall seconds and peak tree PSS/RSS (bytes).

    PSS (proportional set size) splits shared pages, such as the object store
    and shared libraries, between the processes that map them; it is the
    memory the tree really uses. RSS counts shared pages once per process.
    """
    began = time.perf_counter()
    proc = subprocess.Popen(command)
    root = psutil.Process(proc.pid)
    peak = {"pss": 0, "rss": 0}

    def sample():
        while proc.poll() is None:
            pss, rss = _tree_memory(root)
            peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    wall = time.perf_counter() - began
    sampler.join()
    return {"returncode": code, "wall_seconds": wall, "peak_pss": peak["pss"], "peak_rss": peak["rss"]}
