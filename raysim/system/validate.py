"""Validation of the ``system:`` section: every bad value is a ScenarioError naming its full key."""

from __future__ import annotations

import math

from raysim.schema import non_negative, positive, require, require_one_of, within
from raysim.system.config import kinds
from raysim.system.traces import (AVAILABILITY_KEY, COMPUTE_KEY, check_exists, load_availability_trace,
                                  load_compute_trace)

NEVER = "no client is ever available"
# the keys that scale a task's virtual duration stay within these ranges, so that no product of them (times the
# rows, steps and bytes of a run) overflows a float64 clock: a virtual time is always a finite number of seconds
SPEED = within(1e-9, 1e9)  # relative device speeds
SCALE = within(0, 1e6)  # seconds per sample, latencies, spreads of log-normal laws, slow factors
BANDWIDTH = within(1e-6, 1e9)  # Mbit/s
SPREAD = within(0, 20)  # standard deviations and means of log-normal laws (exp(20) is 4.9e8)


def _probability(key: str, value) -> None:
    require(0.0 <= value <= 1.0, key, value, "a probability in [0, 1]")


def _tiers(key: str, tiers, network: bool) -> None:
    require(len(tiers) > 0, key, [], "a non-empty list of tiers whose fractions sum to 1")
    for i, tier in enumerate(tiers):
        _probability(f"{key}[{i}].fraction", tier.fraction)
        if network:
            BANDWIDTH(f"{key}[{i}].down_mbps", tier.down_mbps)
            BANDWIDTH(f"{key}[{i}].up_mbps", tier.up_mbps)
            SCALE(f"{key}[{i}].latency_s", tier.latency_s)
        else:
            SPEED(f"{key}[{i}].speed", tier.speed)
    total = sum(tier.fraction for tier in tiers)
    require(abs(total - 1.0) <= 1e-6, key, [tier.fraction for tier in tiers],
            f"tiers whose fractions sum to 1 (they sum to {total:g})")


def _integer(value) -> bool:
    return math.isfinite(value) and float(value).is_integer()


def _participation(key: str, d) -> None:
    """delta_k: a probability in (0, 1] per client (constant or uniform)."""
    require_one_of(f"{key}.kind", d.kind, ["constant", "uniform"])
    if d.kind == "constant":
        require(0 < d.value <= 1, f"{key}.value", d.value, "a probability in (0, 1]")
    else:
        require(0 < d.low <= 1, f"{key}.low", d.low, "a probability in (0, 1]")
        require(d.low <= d.high <= 1, f"{key}.high", d.high, f"a probability in [low={d.low:g}, 1]")


def _local_steps(key: str, d) -> None:
    """E_k: a positive integer per client (constant, uniform_int or poisson)."""
    require_one_of(f"{key}.kind", d.kind, ["constant", "poisson", "uniform_int"])
    if d.kind == "constant":
        require(_integer(d.value) and d.value >= 1, f"{key}.value", d.value, "a positive integer")
    elif d.kind == "uniform_int":
        require(_integer(d.low) and d.low >= 1, f"{key}.low", d.low, "a positive integer")
        require(_integer(d.high) and d.high >= d.low, f"{key}.high", d.high, f"an integer >= low={d.low:g}")
    else:
        positive(f"{key}.mean", d.mean)


def check_byzantine_ids(ids: list, num_clients: int) -> None:
    """``system.byzantine.clients``: distinct ids of the population, fewer than half of it."""
    key = "system.byzantine.clients"
    outside = [c for c in ids if not (isinstance(c, int) and 0 <= c < num_clients)]
    require(not outside, key, ids, f"client ids in [0, {num_clients - 1}] ({outside[:5]} are not)")
    require(len(set(ids)) == len(ids), key, ids, "distinct client ids")
    require(len(ids) < num_clients / 2, key, ids, f"fewer than half of the {num_clients} clients "
                                                 f"(Byzantine clients are a minority; {len(ids)} given)")


def validate_system(system_cfg, num_clients: int | None) -> None:
    """Check the ``system`` section; raise ScenarioError (full key path) on the first bad value.

    Trace files must exist. When ``num_clients`` is known the traces are also
    loaded and their contents checked, so that a bad trace fails before anything
    starts; with ``None`` (the data decides the clients) that happens when the
    :class:`~raysim.system.SystemModel` is built.
    """
    c = system_cfg.compute
    require_one_of("system.compute.kind", c.kind, kinds("compute"))
    SPEED("system.compute.speed", c.speed)
    SPREAD("system.compute.sigma", c.sigma)
    require(abs(c.mu) <= 20, "system.compute.mu", c.mu, "a number in [-20, 20]")
    within(0.01, 1e6)("system.compute.shape", c.shape)  # below, Lomax draws make speeds that underflow
    SPEED("system.compute.scale", c.scale)
    _probability("system.compute.slow_fraction", c.slow_fraction)
    within(1, 1e6)("system.compute.slow_factor", c.slow_factor)
    require(0 < c.seconds_per_sample <= 1e6, "system.compute.seconds_per_sample", c.seconds_per_sample,
            "a number in (0, 1e6]")
    SPREAD("system.compute.noise", c.noise)
    if c.kind == "tiers":
        _tiers("system.compute.tiers", c.tiers, network=False)
    if c.kind == "trace":
        check_exists(COMPUTE_KEY, c.path)
        if num_clients is not None:
            load_compute_trace(c.path, num_clients)

    w = system_cfg.network
    require_one_of("system.network.kind", w.kind, kinds("network"))
    BANDWIDTH("system.network.down_mbps", w.down_mbps)
    BANDWIDTH("system.network.up_mbps", w.up_mbps)
    SCALE("system.network.latency_s", w.latency_s)
    SPREAD("system.network.sigma", w.sigma)
    if w.kind == "tiers":
        _tiers("system.network.tiers", w.tiers, network=True)

    a = system_cfg.availability
    require_one_of("system.availability.kind", a.kind, kinds("availability"))
    _probability("system.availability.p", a.p)
    require(0 < a.period <= 1e12, "system.availability.period", a.period, "a number in (0, 1e12]")
    _probability("system.availability.on_fraction", a.on_fraction)
    if a.kind == "bernoulli":
        require(a.p > 0, "system.availability.p", a.p, f"a probability in (0, 1] (with 0, {NEVER})")
    if a.kind == "diurnal":
        require(a.on_fraction > 0, "system.availability.on_fraction", a.on_fraction,
                f"a share in (0, 1] (with 0, {NEVER})")
    if a.kind == "trace":
        check_exists(AVAILABILITY_KEY, a.path)
        if num_clients is not None:
            load_availability_trace(a.path, num_clients)

    _probability("system.dropout", system_cfg.dropout)
    require(system_cfg.dropout < 1, "system.dropout", system_cfg.dropout,
            "a probability in [0, 1) (with 1, every task fails)")

    u = system_cfg.unreliable
    _participation("system.unreliable.participation", u.participation)
    require_one_of("system.unreliable.coin", u.coin, kinds("coin"))
    if u.local_steps is not None:
        _local_steps("system.unreliable.local_steps", u.local_steps)
    require_one_of("system.unreliable.weights", u.weights, kinds("weights"))
    require_one_of("system.unreliable.gradient_noise", u.gradient_noise, kinds("gradient_noise"))
    non_negative("system.unreliable.noise_scale", u.noise_scale)

    b = system_cfg.byzantine
    require(0 <= b.fraction < 0.5, "system.byzantine.fraction", b.fraction,
            "a share in [0, 0.5) (Byzantine clients are a minority)")
    if b.clients is not None:
        require(b.fraction == 0, "system.byzantine.fraction", b.fraction,
                "0 with system.byzantine.clients (give the Byzantine clients one way)")
        if num_clients is not None:  # otherwise checked once the data set is built
            check_byzantine_ids(list(b.clients), num_clients)
    require_one_of("system.byzantine.attack", b.attack, kinds("attack"))
    positive("system.byzantine.scale", b.scale)
    positive("system.byzantine.sigma", b.sigma)
    positive("system.byzantine.epsilon", b.epsilon)
    if b.window is not None:
        require(b.window >= 1, "system.byzantine.window", b.window, "a positive number of honest updates")
