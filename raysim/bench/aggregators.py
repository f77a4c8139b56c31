"""Micro-benchmark of the aggregators: seconds per call on one seeded float32 ``[clients, size]`` tensor.

Each rule runs alone and inside ``bucketing``; times are printed with their ratio to ``mean`` measured in the same
run, so no figure is compared with one from another machine.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from raysim.algorithms.aggregation_rules import AGGREGATORS, bucketing
from raysim.robust_f import capped_f


def rule_params(name: str, clients: int) -> dict:
    """The benchmarked parameters of a rule reducing ``clients`` updates."""
    f = clients // 5
    return {"trimmed_mean": {"trim": 0.2}, "krum": {"f": f}, "multi_krum": {"f": f},
            "bulyan": {"f": min(f, (clients - 3) // 4)},
            "centered_clipping": {"radius": 1.0, "iterations": 3}}.get(name, {})


def median_seconds(call, repeat: int) -> float:
    """Median wall time of ``repeat`` calls after one warm-up call."""
    call()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def run_aggregator_bench(clients: int = 100, size: int = 1_000_000, repeat: int = 3, bucket_size: int = 2) -> dict:
    """Time every rule and every rule in ``bucketing``; prints one line each, returns {name: seconds}."""
    updates = torch.randn(clients, size, generator=torch.Generator().manual_seed(0))
    buckets = -(-clients // bucket_size)
    print(f"aggregators on [{clients}, {size}] float32, {torch.get_num_threads()} torch threads, "
          f"median of {repeat} after a warm-up")
    calls = {}
    for name, rule in AGGREGATORS.items():
        params = rule_params(name, clients)
        calls[name] = lambda rule=rule, params=params: rule(updates, None, **params)
        # f faulty clients spoil at most f buckets; f capped to what the rule accepts for fewer inputs
        bucket_params = dict(params, **{"f": capped_f(buckets, params["f"], name)} if "f" in params else {})
        calls[f"bucketing({name})"] = lambda rule=rule, params=bucket_params: bucketing(
            updates, None, rule=rule, bucket_size=bucket_size, rng=np.random.default_rng(0), **params)
    seconds = {}
    for name, call in calls.items():
        seconds[name] = median_seconds(call, repeat)
        print(f"{name:30s} {seconds[name]:9.4f} s {seconds[name] / seconds['mean']:8.1f}x mean", flush=True)
    return seconds
