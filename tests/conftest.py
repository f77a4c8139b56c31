"""Shared fixtures: small scenarios and one Ray session for the whole test run."""

from __future__ import annotations

import os

import pytest

from raysim.config import load_scenario

# 4 logical CPUs (so 4 one-CPU actors fit on this 2-core machine) and 1 logical GPU
# (fractional-GPU placement is checked without hardware).
RAY_CPUS, RAY_GPUS = 4, 1


def small_scenario(tmp_path, *overrides, backend="local"):
    """A fast scenario (Gaussian mixture, 40 clients, MLP) with overrides, writing under tmp_path.
    The base's MLP size and round settings are left out when the overrides choose another model
    kind or asynchronous mode (a key that would be ignored is an error)."""
    chosen = dict(o.split("=", 1) for o in overrides)
    base = ["name=small", "data.kind=gaussian_mixture", "data.num_clients=40", "model.kind=mlp",
            "runtime.clients_per_task=5", f"runtime.backend={backend}", f"output.dir={tmp_path}/out",
            "eval.every=1", "output.flush_seconds=0"]
    if chosen.get("model.kind", "mlp") == "mlp":
        base.append("model.hidden=[16]")
    if chosen.get("execution.mode", "sync") == "sync":
        base += ["execution.rounds=3", "execution.clients_per_round=12"]
    return load_scenario(None, base + list(overrides))


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for every test that needs it (RayRuntime reuses it and leaves it running)."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=RAY_CPUS, num_gpus=RAY_GPUS, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
