"""The virtual-time system model: profiles, task timings, availability, sampling, traces, validation."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from raysim.errors import ScenarioError
from raysim.system import (DISTRIBUTIONS, ComputeConfig, NetworkConfig, SystemConfig, SystemModel,
                           validate_system)


def system_cfg(*overrides):
    """The system section with ``key=value`` overrides (keys relative to ``system.``)."""
    return OmegaConf.merge(OmegaConf.structured(SystemConfig), OmegaConf.from_dotlist(list(overrides)))


def model(n, *overrides, seed=0):
    return SystemModel(system_cfg(*overrides), n, seed)


def write_table(tmp_path, name, columns: dict) -> str:
    """Write ``columns`` as CSV or Parquet (by the name's suffix) under tmp_path; return the path."""
    path, table = str(tmp_path / name), pa.table(columns)
    if name.endswith(".csv"):
        pacsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    return path


# ---------------------------------------------------------------------------- compute and network


def test_constant_compute_time_is_exact_and_communication_free_by_default():
    m = SystemModel(SystemConfig(compute=ComputeConfig(speed=2.0, seconds_per_sample=0.01)), 10, seed=1)
    work = np.array([10.0, 20.0, 35.0])
    t = m.task_timing(np.array([0, 3, 9]), np.array([0, 1, 2]), work, 10 ** 6, 10 ** 6)
    assert np.array_equal(t.compute_s, work * 0.01 / 2.0)
    assert np.array_equal(t.comm_s, np.zeros(3)) and np.array_equal(t.duration_s, t.compute_s)
    assert not t.failed.any() and np.isnan(t.fail_at_s).all()
    assert np.array_equal(t.known_at_s, t.duration_s)


def test_constant_network_time_is_exact():
    m = SystemModel(SystemConfig(network=NetworkConfig(kind="constant", down_mbps=50.0, up_mbps=10.0,
                                                       latency_s=0.1)), 5, seed=0)
    t = m.task_timing(np.array([1, 2]), np.array([7, 7]), np.array([100.0, 0.0]), 10 ** 6, 2 * 10 ** 5)
    comm = 2 * 0.1 + 10 ** 6 * 8 / (50.0 * 1e6) + 2 * 10 ** 5 * 8 / (10.0 * 1e6)
    assert np.array_equal(t.comm_s, np.full(2, comm))
    assert np.array_equal(t.duration_s, np.array([100 * 0.001 + comm, comm]))


def test_network_tiers_and_lognormal_profiles():
    m = model(100_000, "network.kind=tiers",
              "network.tiers=[{fraction: 0.25, down_mbps: 10, up_mbps: 1, latency_s: 0.2},"
              "{fraction: 0.75, down_mbps: 100, up_mbps: 50, latency_s: 0.01}]")
    p = m.profile
    assert abs((p["net_tier"] == 0).mean() - 0.25) < 0.02
    assert np.array_equal(p["down_mbps"], np.where(p["net_tier"] == 0, 10.0, 100.0))
    assert np.array_equal(p["latency_s"], np.where(p["net_tier"] == 0, 0.2, 0.01))
    m = model(100_000, "network.kind=lognormal", "network.sigma=0.5", "network.down_mbps=40")
    logs = np.log(m.profile["down_mbps"] / 40)
    assert abs(logs.mean()) < 0.01 and abs(logs.std() - 0.5) < 0.025
    assert not np.array_equal(m.profile["down_mbps"] / 40, m.profile["up_mbps"] / 20)  # independent draws


def test_tiers_fractions_and_slow_clients():
    m = model(100_000, "compute.kind=tiers", "compute.slow_fraction=0.1", "compute.slow_factor=10",
              "compute.tiers=[{fraction: 0.2, speed: 4}, {fraction: 0.5, speed: 1}, {fraction: 0.3, speed: 0.25}]")
    p = m.profile
    for tier, fraction in enumerate([0.2, 0.5, 0.3]):
        assert abs((p["tier"] == tier).mean() - fraction) < 0.02
    base = np.array([4.0, 1.0, 0.25])[p["tier"]]
    assert abs(p["slow"].mean() - 0.1) < 0.02
    assert np.array_equal(p["speed"], np.where(p["slow"], base / 10, base))
    d = m.describe()
    assert sum(d["tier_counts"]) == 100_000 and d["slow_clients"] == int(p["slow"].sum())


def test_lognormal_and_pareto_speeds():
    lognormal = model(100_000, "compute.kind=lognormal", "compute.mu=0.5", "compute.sigma=1").profile["speed"]
    logs = np.log(lognormal)
    assert abs(logs.mean() - 0.5) < 0.025 and abs(logs.std() - 1.0) < 0.05
    reference = model(100_000, "compute.kind=lognormal", "compute.sigma=1").profile["speed"]
    pareto = model(100_000, "compute.kind=pareto", "compute.shape=1.5", "compute.scale=2").profile["speed"]
    assert (pareto <= 2.0).all() and (pareto > 0).all()
    # slowness (1 / speed) has a Pareto tail: its max/median is far above the lognormal's
    assert np.median(pareto) / pareto.min() > 5 * (np.median(reference) / reference.min())


def test_profiles_do_not_depend_on_the_number_of_clients():
    overrides = ["compute.kind=lognormal", "compute.slow_fraction=0.2", "availability.kind=diurnal",
                 "unreliable.participation.kind=uniform", "unreliable.participation.low=0.1"]
    small, large = model(500, *overrides, seed=3), model(2000, *overrides, seed=3)
    for name, values in small.profile.items():
        assert np.array_equal(values, large.profile[name][:500]), name
    assert not np.array_equal(small.profile["speed"], model(500, *overrides, seed=4).profile["speed"])
    rows = large.profile_of(np.array([7, 1999, 7]))
    assert set(rows) == set(large.profile) and np.array_equal(rows["speed"], large.profile["speed"][[7, 1999, 7]])


# ---------------------------------------------------------------------------- per-task draws


def test_task_timing_is_per_task_and_reproducible():
    overrides = ["compute.kind=lognormal", "compute.noise=0.3", "dropout=0.3", "network.kind=constant"]
    a, b = model(1000, *overrides, seed=5), model(1000, *overrides, seed=5)
    clients, counters = np.array([3, 17, 3, 999, 42]), np.array([0, 0, 1, 1, 8])
    work = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    together = a.task_timing(clients, counters, work, 4000, 4000)
    again = b.task_timing(clients, counters, work, 4000, 4000)
    reverse = a.task_timing(clients[::-1], counters[::-1], work[::-1], 4000, 4000)
    for i in range(len(clients)):
        alone = a.task_timing(clients[i:i + 1], counters[i:i + 1], work[i:i + 1], 4000, 4000)
        for name in ("compute_s", "comm_s", "duration_s", "failed", "fail_at_s"):
            expected = getattr(together, name)[i]
            np.testing.assert_array_equal(getattr(alone, name)[0], expected)
            np.testing.assert_array_equal(getattr(again, name)[i], expected)
            np.testing.assert_array_equal(getattr(reverse, name)[len(clients) - 1 - i], expected)
    assert together.compute_s[0] != together.compute_s[2]  # same client, another counter: new noise
    other_seed = model(1000, *overrides, seed=6).task_timing(clients, counters, work, 4000, 4000)
    assert not np.array_equal(other_seed.duration_s, together.duration_s)


def test_dropout_rate_and_failure_points():
    m = model(100, "dropout=0.25", "compute.noise=0.1")
    clients = np.arange(4000) % 100
    t = m.task_timing(clients, np.arange(4000), np.full(4000, 50.0), 1000, 1000)
    assert abs(t.failed.mean() - 0.25) < 0.03
    assert ((t.fail_at_s[t.failed] > 0) & (t.fail_at_s[t.failed] < t.duration_s[t.failed])).all()
    assert np.isnan(t.fail_at_s[~t.failed]).all()
    assert np.array_equal(t.known_at_s, np.where(t.failed, t.fail_at_s, t.duration_s))
    noise = np.log(t.compute_s / (50 * 0.001))
    assert abs(noise.std() - 0.1) < 0.01


# ---------------------------------------------------------------------------- availability


def test_bernoulli_availability_rate_and_determinism():
    m = model(100_000, "availability.kind=bernoulli", "availability.p=0.3", seed=2)
    ids = np.arange(100_000)
    first = m.available(ids, 0.0, counter=4)
    assert abs(first.mean() - 0.3) < 0.01
    assert np.array_equal(m.available(ids[::-1], 5.0, 4), first[::-1])  # order and t do not matter
    assert np.array_equal(model(100_000, "availability.kind=bernoulli", "availability.p=0.3", seed=2)
                          .available(ids, 0.0, 4), first)
    assert (m.available(ids, 0.0, 5) != first).mean() > 0.3  # a new coin per dispatch
    assert m.next_available_time(12.5) == 12.5


def test_diurnal_share_of_a_period_and_next_available_time():
    m = model(50, "availability.kind=diurnal", "availability.period=100", "availability.on_fraction=0.3")
    grid = np.arange(0, 100, 0.01)
    online = np.array([m.available(np.arange(50), t, 0) for t in grid])
    assert np.abs(online.mean(axis=0) - 0.3).max() <= 2e-4  # every client: 30% of the period
    assert len(np.unique(m.profile["phase"])) == 50

    one = model(1, "availability.kind=diurnal", "availability.period=1000", "availability.on_fraction=0.001", seed=9)
    phase = one.profile["phase"][0]
    for t in np.linspace(0, 3000, 37):
        wake = one.next_available_time(t)
        assert wake >= t and one.available(np.array([0]), wake, 0)[0]
        if not one.available(np.array([0]), t, 0)[0]:
            expected = t + (1 - (t / 1000 + phase) % 1) * 1000
            assert abs(wake - expected) < 1e-6
            assert not one.available(np.array([0]), wake - 1e-6, 0)[0]
            assert len(one.sample_available(t, 0, 5)) == 0 and one.sample_available(wake, 0, 5).tolist() == [0]
        else:
            assert wake == t


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_availability_trace(tmp_path, suffix):
    path = write_table(tmp_path, f"avail.{suffix}", {
        "client_id": [0, 0, 1, 1, 3, 3], "start": [0.0, 20.0, 5.0, 40.0, 0.0, 10.0],
        "end": [10.0, 30.0, 25.0, 50.0, 100.0, 20.0]})  # client 2 is never online; 3 has nested intervals
    m = model(4, "availability.kind=trace", f"availability.path={path}")
    ids = np.arange(4)
    expect = {0.0: [1, 0, 0, 1], 9.9: [1, 1, 0, 1], 10.0: [0, 1, 0, 1], 25.0: [1, 0, 0, 1],
              30.0: [0, 0, 0, 1], 45.0: [0, 1, 0, 1], 99.0: [0, 0, 0, 1], 100.0: [0, 0, 0, 0]}
    for t, flags in expect.items():
        assert m.available(ids, t, 0).tolist() == [bool(f) for f in flags], t
        assert m.sample_available(t, 0, 10).tolist() == [c for c in range(4) if flags[c]]
    assert m.available(np.array([3, 2, 0]), 25.0, 0).tolist() == [True, False, True]
    assert m.next_available_time(-5.0) == 0.0 and m.next_available_time(12.0) == 12.0
    assert m.next_available_time(100.0) == math.inf
    assert m.describe()["available_share"] == 0.75


def assert_trace_rejected(num_clients, kind_key, path, key, allowed, texts):
    """A bad trace file fails the same way when loaded by SystemModel and by validate_system."""
    overrides = (f"{kind_key}=trace", f"{key.removeprefix('system.')}={path}")
    for build in (lambda: model(num_clients, *overrides),
                  lambda: validate_system(system_cfg(*overrides), num_clients)):
        with pytest.raises(ScenarioError) as info:
            build()
        message = str(info.value)
        assert message.startswith(f"{key} = ") and allowed in message
        assert all(text in message for text in texts), message


def test_availability_trace_errors(tmp_path):
    cases = [
        ({"client_id": [0], "start": [0.0]}, ["column 'end' is missing"]),
        ({"client_id": [0, 1], "start": [0.0, 5.0], "end": [1.0, 5.0]}, ["end > start", "row 1"]),
        ({"client_id": [0, 7], "start": [0.0, 0.0], "end": [1.0, 1.0]}, ["client_id 7", "0..3"]),
        ({"client_id": pa.array([], pa.int64()), "start": pa.array([], pa.float64()),
          "end": pa.array([], pa.float64())}, ["no client is ever available"]),
    ]
    for i, (columns, texts) in enumerate(cases):
        path = write_table(tmp_path, f"bad{i}.parquet", columns)
        assert_trace_rejected(4, "availability.kind", path, "system.availability.path", "client_id, start, end", texts)


# ---------------------------------------------------------------------------- compute traces


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_compute_trace(tmp_path, suffix):
    path = write_table(tmp_path, f"speed.{suffix}", {"client_id": [2, 0, 1], "speed": [0.5, 2.0, 1.0]})
    m = model(3, "compute.kind=trace", f"compute.path={path}", "compute.seconds_per_sample=0.1")
    assert m.profile["speed"].tolist() == [2.0, 1.0, 0.5] and (m.profile["tier"] == -1).all()
    t = m.task_timing(np.array([0, 2]), np.array([0, 0]), np.array([10.0, 10.0]), 0, 0)
    assert np.allclose(t.compute_s, [0.5, 2.0])
    validate_system(system_cfg("compute.kind=trace", f"compute.path={path}"), 3)


@pytest.mark.parametrize("columns, texts", [
    ({"client_id": [0, 2], "speed": [1.0, 1.0]}, ["client 1 is missing"]),
    ({"client_id": [0, 1, 2]}, ["column 'speed' is missing"]),
    ({"client": [0, 1, 2], "speed": [1.0, 1.0, 1.0]}, ["column 'client_id' is missing"]),
    ({"client_id": [0, 1, 1, 2], "speed": [1.0, 1.0, 1.0, 1.0]}, ["client 1 appears 2 times"]),
    ({"client_id": [0, 1, 2], "speed": [1.0, 0.0, 1.0]}, ["client 1 has speed 0"]),
])
def test_compute_trace_errors(tmp_path, columns, texts):
    path = write_table(tmp_path, "speed.csv", columns)
    assert_trace_rejected(3, "compute.kind", path, "system.compute.path", "a file with columns client_id, speed", texts)
    validate_system(system_cfg("compute.kind=trace", f"compute.path={path}"), None)  # contents: checked on load


# ---------------------------------------------------------------------------- sampling


def test_sample_available_properties():
    m = model(1000, "availability.kind=bernoulli", "availability.p=0.5", seed=1)
    for counter in range(20):
        s = m.sample_available(3.0, counter, 30)
        assert len(s) == 30 and len(np.unique(s)) == 30 and np.array_equal(s, np.sort(s))
        assert m.available(s, 3.0, counter).all()
        assert np.array_equal(s, m.sample_available(3.0, counter, 30))
    exclude = m.sample_available(0.0, 0, 400)
    s = m.sample_available(0.0, 0, 30, exclude=exclude)
    assert len(s) == 30 and not np.isin(s, exclude).any()
    assert len(m.sample_available(0.0, 0, 1000)) == m.available(np.arange(1000), 0.0, 0).sum()  # fewer than k
    assert len(m.sample_available(0.0, 0, 0)) == 0
    everyone = model(20)
    assert everyone.sample_available(0.0, 0, 50).tolist() == list(range(20))
    assert len(everyone.sample_available(0.0, 0, 5, exclude=np.arange(20))) == 0
    assert everyone.sample_available(0.0, 1, 5, exclude=np.arange(1, 20)).tolist() == [0]


def test_sample_available_is_one_function_whatever_the_batch_sizes():
    m = model(5000, "availability.kind=diurnal", "availability.on_fraction=0.2", seed=4)
    expected = [m.sample_available(1234.0, c, 40) for c in range(5)]
    for share in (1.0, 1e-4):  # the batch-size heuristic changes, the result must not
        m._online_share = share
        assert all(np.array_equal(m.sample_available(1234.0, c, 40), expected[c]) for c in range(5))
    assert set(m.sample_available(1234.0, 0, 10)) <= set(expected[0])  # smaller samples nest


@pytest.mark.parametrize("overrides", [[], ["availability.kind=bernoulli", "availability.p=0.3"],
                                       ["availability.kind=diurnal", "availability.on_fraction=0.2"]])
def test_one_client_against_a_busy_mask_is_the_general_draw(overrides):
    """The asynchronous driver's draw (one client, a mask of busy clients) looks at the order's first
    clients first; it is the draw of the general path (busy clients given as ids), also when every
    one of those first clients is busy."""
    from raysim.streams import Purpose
    from raysim.system.model import _RandomOrder

    m = model(3000, *overrides, seed=6)
    rng = np.random.default_rng(1)
    for counter in range(60):
        busy = rng.random(3000) < (0.5 if counter < 40 else 0.0)
        if counter >= 50:  # every client the order puts first is busy: the general path decides
            order = m._per_counter(Purpose.SYSTEM_SAMPLE, counter, lambda rngs: _RandomOrder.keyed(3000, rngs))
            busy[order.head_clients] = True
        t = 97.0 * counter
        got = m.sample_available(t, counter, 1, busy, int(busy.sum()))
        assert np.array_equal(got, m.sample_available(t, counter, 1, exclude=np.flatnonzero(busy))), counter
        assert len(got) == 1

@pytest.mark.parametrize("overrides", [[], ["availability.kind=bernoulli", "availability.p=0.3"]])
def test_sampling_streams_built_with_the_next_counters_give_the_samples_of_each_counter_alone(overrides):
    """Sampling orders (and Bernoulli coin keys) are built COUNTERS_AT_ONCE counters at a time: a
    counter's sample does not depend on where its batch started, its order's keys are the first draws
    of its own stream, and the head evaluated with the batch is the order evaluated alone."""
    from raysim.streams import Purpose, stream
    from raysim.system.model import COUNTERS_AT_ONCE, _RandomOrder

    busy = np.random.default_rng(0).random(20000) < 0.5
    scattered = model(20000, *overrides, seed=2)
    for counter in (0, 1, COUNTERS_AT_ONCE - 1, COUNTERS_AT_ONCE, 200, 5, 2 ** 32 - 1, 130):
        alone = model(20000, *overrides, seed=2)  # its batch starts at this counter
        for k in (1, 5):
            got = scattered.sample_available(0.0, counter, k, busy, int(busy.sum()))
            assert np.array_equal(got, alone.sample_available(0.0, counter, k, busy, int(busy.sum()))), (counter, k)
    order = scattered._per_counter(Purpose.SYSTEM_SAMPLE, 130, None)
    assert np.array_equal(order.keys, stream(2, Purpose.SYSTEM_SAMPLE, 130).integers(0, 2 ** 64, size=8, dtype=np.uint64))
    if overrides:  # a Bernoulli draw's key: its stream's first integer
        key = scattered._per_counter(Purpose.SYSTEM_AVAILABILITY, 130, None)
        assert key == stream(2, Purpose.SYSTEM_AVAILABILITY, 130).integers(0, 2 ** 64, dtype=np.uint64)
        assert isinstance(key, np.uint64)
    assert np.array_equal(order.slice(0, _RandomOrder.HEAD), _RandomOrder(20000, order.keys).slice(0, _RandomOrder.HEAD))
    assert np.array_equal(order.head_clients, order.slice(0, _RandomOrder.HEAD))
    assert order.head_clients.dtype == np.int64
    with pytest.raises(ValueError, match="stream id 4294967296 of SYSTEM_SAMPLE"):
        scattered.sample_available(0.0, 2 ** 32, 1)


def test_sample_available_is_uniform():
    m = model(5, seed=11)
    counts = {pair: 0 for pair in itertools.combinations(range(5), 2)}
    for counter in range(2000):
        counts[tuple(m.sample_available(0.0, counter, 2).tolist())] += 1
    chi2 = sum((c - 200) ** 2 / 200 for c in counts.values())
    assert chi2 < 30  # 9 degrees of freedom


@pytest.mark.parametrize("overrides", [[], ["availability.kind=bernoulli", "availability.p=0.5"],
                                       ["availability.kind=diurnal", "availability.on_fraction=0.5"]])
def test_sampling_a_million_clients_looks_at_a_few_hundred(overrides, monkeypatch):
    """Drawing 100 of 10^6 clients evaluates the random order and asks about availability at
    O(k / eligible share) positions, not O(N): counted, whatever the machine's speed."""
    from raysim.system.model import SystemModel, _RandomOrder

    m = model(1_000_000, *overrides)
    exclude = np.arange(0, 1_000_000, 1000)
    positions, asked = [], []
    slice_, available = _RandomOrder.slice, SystemModel.available
    monkeypatch.setattr(_RandomOrder, "slice", lambda self, a, b: positions.append(b - a) or slice_(self, a, b))
    monkeypatch.setattr(SystemModel, "available", lambda self, ids, t, c: asked.append(len(ids)) or available(self, ids, t, c))
    for counter in range(5):
        positions.clear(), asked.clear()
        sample = m.sample_available(10.0, counter, 100, exclude=exclude)
        assert len(sample) == 100 and not np.isin(sample, exclude).any()
        assert sum(positions) <= 1000 and sum(asked) <= 1000, (positions, asked)  # share 1/2 or more: k / share ~ 200


# ---------------------------------------------------------------------------- unreliable agents


def test_unreliable_profiles():
    m = model(50_000, "unreliable.participation.kind=uniform", "unreliable.participation.low=0.2",
              "unreliable.participation.high=0.8", "unreliable.local_steps.kind=uniform_int",
              "unreliable.local_steps.low=2", "unreliable.local_steps.high=5")
    delta, steps = m.profile["participation"], m.profile["local_steps"]
    assert ((delta >= 0.2) & (delta <= 0.8)).all() and abs(delta.mean() - 0.5) < 0.01
    assert steps.dtype == np.int64 and set(np.unique(steps)) == {2, 3, 4, 5}
    assert np.abs(np.bincount(steps, minlength=6)[2:] / 50_000 - 0.25).max() < 0.02
    m = model(50_000, "unreliable.participation.value=0.5", "unreliable.local_steps.kind=poisson",
              "unreliable.local_steps.mean=4")
    assert (m.profile["participation"] == 0.5).all()
    steps = m.profile["local_steps"]
    assert steps.min() >= 1 and abs(steps.mean() - (4 + math.exp(-4))) < 0.05
    m = model(10, "unreliable.local_steps.kind=constant", "unreliable.local_steps.value=7")
    assert (m.profile["local_steps"] == 7).all()
    assert (model(10).profile["local_steps"] == 0).all() and (model(10).profile["participation"] == 1).all()


# ---------------------------------------------------------------------------- validation and summary


@pytest.mark.parametrize("overrides, key, texts", [
    (["compute.kind=gamma"], "system.compute.kind", ["gamma", "constant, lognormal, pareto, tiers, trace"]),
    (["network.kind=5g"], "system.network.kind", ["5g", "constant, lognormal, none, tiers"]),
    (["availability.kind=sometimes"], "system.availability.kind", ["always, bernoulli, diurnal, trace"]),
    (["dropout=1.5"], "system.dropout", ["1.5", "[0, 1]"]),
    (["availability.p=-0.1"], "system.availability.p", ["-0.1", "[0, 1]"]),
    (["availability.on_fraction=2"], "system.availability.on_fraction", ["[0, 1]"]),
    (["compute.sigma=-1"], "system.compute.sigma", ["-1", "[0, 20]"]),
    (["compute.speed=0"], "system.compute.speed", ["[1e-09, 1e+09]"]),
    (["compute.seconds_per_sample=0"], "system.compute.seconds_per_sample", ["(0, 1e6]"]),
    (["compute.noise=-0.5"], "system.compute.noise", ["[0, 20]"]),
    (["network.down_mbps=0"], "system.network.down_mbps", ["[1e-06, 1e+09]"]),
    (["network.latency_s=-1"], "system.network.latency_s", ["[0, 1e+06]"]),
    (["availability.period=0"], "system.availability.period", ["(0, 1e12]"]),
    (["compute.kind=tiers"], "system.compute.tiers", ["non-empty", "sum to 1"]),
    (["compute.kind=tiers", "compute.tiers=[{fraction: 0.5}, {fraction: 0.4}]"], "system.compute.tiers",
     ["sum to 1", "0.9"]),
    (["network.kind=tiers", "network.tiers=[{fraction: 1, up_mbps: 0}]"], "system.network.tiers[0].up_mbps",
     ["[1e-06, 1e+09]"]),
    (["compute.slow_fraction=1.5"], "system.compute.slow_fraction", ["[0, 1]"]),
    (["compute.slow_factor=0.5"], "system.compute.slow_factor", ["[1, 1e+06]"]),
    (["compute.kind=trace"], "system.compute.path", ["None", "an existing CSV or Parquet file"]),
    (["availability.kind=trace", "availability.path=/no/such.csv"], "system.availability.path",
     ["/no/such.csv", "an existing CSV or Parquet file"]),
    (["unreliable.weights=size"], "system.unreliable.weights", ["samples, uniform"]),
    (["unreliable.gradient_noise=cauchy"], "system.unreliable.gradient_noise", ["gaussian, laplace, none"]),
    (["unreliable.participation.value=0"], "system.unreliable.participation.value", ["(0, 1]"]),
    (["unreliable.participation.kind=poisson"], "system.unreliable.participation.kind", ["constant, uniform"]),
    (["unreliable.local_steps.kind=uniform_int", "unreliable.local_steps.low=0"],
     "system.unreliable.local_steps.low", ["positive integer"]),
    (["availability.kind=bernoulli", "availability.p=0"], "system.availability.p", ["no client is ever available"]),
    (["availability.kind=diurnal", "availability.on_fraction=0"], "system.availability.on_fraction",
     ["no client is ever available"]),
])
def test_validate_system_names_key_and_allowed(overrides, key, texts):
    with pytest.raises(ScenarioError) as info:
        validate_system(system_cfg(*overrides), 100)
    message = str(info.value)
    assert message.startswith(f"{key} = ") and "\n" not in message, message
    assert all(text in message for text in texts), message
    with pytest.raises(ScenarioError):
        model(10, *overrides)


def test_defaults_validate_and_describe_is_json():
    validate_system(SystemConfig(), None)
    validate_system(system_cfg(), 10)
    for overrides in ([], ["network.kind=lognormal", "compute.kind=pareto", "unreliable.local_steps.mean=3",
                           "unreliable.local_steps.kind=poisson", "availability.kind=diurnal"]):
        summary = model(100, *overrides).describe()
        json.dumps(summary, allow_nan=False)
        assert summary["num_clients"] == 100 and summary["speed_mean"] > 0


def test_distributions_describe_every_kind():
    for section, names in {"compute": ["constant", "tiers", "lognormal", "pareto", "trace"],
                           "network": ["none", "constant", "tiers", "lognormal"],
                           "availability": ["always", "bernoulli", "diurnal", "trace"],
                           "distribution": ["constant", "uniform", "uniform_int", "poisson"]}.items():
        for name in names:
            assert DISTRIBUTIONS[f"{section}.{name}"]


def test_sample_available_takes_a_mask_or_ids_alike():
    m = model(3000, "availability.kind=diurnal", "availability.on_fraction=0.5", seed=2)
    busy = m.sample_available(0.0, 7, 500)
    mask = np.zeros(3000, dtype=bool)
    mask[busy] = True
    for counter in range(5):
        assert np.array_equal(m.sample_available(10.0, counter, 40, exclude=busy),
                              m.sample_available(10.0, counter, 40, exclude=mask))
