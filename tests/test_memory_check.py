"""The memory check's holes that issue 41 found, each refused with one line before Ray starts: what
grows with the local steps (each host's minibatch plan), the ClientActor processes an automatic plan
starts, and system keys whose product overflowed the virtual clock to Infinity in summary.json."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.test_bad_input import cli, one_error_line

W1 = "scenarios/bench/w1.yaml"
FITS = "expected a scenario that fits in memory: it needs about"


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.local_steps=1000000000000", "~algorithm.local_epochs"], "algorithm.local_steps = 1000000000000"),
    (["system.unreliable.local_steps.kind=poisson", "system.unreliable.local_steps.mean=1e12"],
     "system.unreliable.local_steps.mean = 1000000000000.0"),
    (["eval.personalized_steps=1000000000"], "eval.personalized_steps = 1000000000"),
])
def test_step_counts_whose_minibatch_plan_cannot_fit_are_refused(tmp_path, overrides, key):
    """Each grew past 8 GiB while the estimate said megabytes: a host builds every step's rows of
    its task's clients before training."""
    done = cli("run", W1, *overrides, f"output.dir={tmp_path}")
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert line.startswith(f"error: {key}: {FITS}") and "step plan" in line, line
    assert not (tmp_path / "w1").exists()


@pytest.mark.parametrize("override, key", [("runtime.num_cpus=100000", "runtime.num_cpus = 100000"),
                                           ("runtime.cpus_per_actor=0.001", "runtime.cpus_per_actor = 0.001")])
def test_an_actor_plan_whose_processes_cannot_fit_is_refused(tmp_path, override, key):
    """'auto' fills the declared CPUs with ClientActors: 100,000 or 2,000 processes of ~300 MiB."""
    done = cli("run", W1, override, f"output.dir={tmp_path}")
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert line.startswith(f"error: {key}: {FITS}") and "client hosts" in line, line


def test_the_estimate_counts_each_client_actor_process():
    from raysim.footprint import ACTOR_PROCESS_BYTES, estimate
    from raysim.scenario.load import load_scenario

    def hosts(*overrides):
        parts = estimate(load_scenario(W1, list(overrides))).parts
        return next((p.bytes for p in parts if p.what == "client hosts"), 0)

    assert hosts("runtime.num_cpus=2") == 2 * ACTOR_PROCESS_BYTES
    assert hosts("runtime.num_cpus=2", "runtime.cpus_per_actor=0.5") == 4 * ACTOR_PROCESS_BYTES
    assert hosts("runtime.backend=local") == 0  # the driver is the host


@pytest.mark.parametrize("override, allowed", [
    ("system.compute.seconds_per_sample=1e300", "a number in (0, 1e6]"),
    ("system.compute.speed=1e-300", "a number in [1e-09, 1e+09]"),
    ("system.network.up_mbps=1e-300", "a number in [1e-06, 1e+09]"),
    ("system.network.latency_s=1e300", "a number in [0, 1e+06]"),
    ("system.compute.mu=-1000", "a number in [-20, 20]"),
])
def test_system_keys_that_overflow_the_virtual_clock_are_refused(tmp_path, override, allowed):
    """These were accepted and the run's virtual time became Infinity (not JSON) in summary.json."""
    extra = ["system.network.kind=constant"] if "network" in override else []
    if "mu" in override:
        extra = ["system.compute.kind=lognormal"]
    done = cli("validate", W1, override, *extra)
    assert done.returncode == 2
    key, value = override.split("=")
    line = one_error_line(done.stderr)
    assert line.startswith(f"error: {key} = ") and line.endswith(f"expected {allowed}"), line


def test_summary_json_never_holds_nan_or_infinity():
    from raysim.engine.run import _plain

    text = json.dumps(_plain({"virtual_time": math.inf, "loss": [np.float64("nan"), np.float32(0.5)],
                              "steps": np.int64(3), "name": "x", "done": True}), allow_nan=False)
    assert json.loads(text) == {"virtual_time": None, "loss": [None, 0.5], "steps": 3.0, "name": "x", "done": True}
