"""The virtual-time system model: client profiles, task timings, availability and sampling.

Every draw is a pure function of (seed, client id, task counter) — never of the
number of actors, the order of calls or which other clients are in a call:

* static per-client profiles come from the streams ``(Purpose.SYSTEM_PROFILE, j)``
  (:mod:`raysim.streams`), one ``j`` per field (:data:`PROFILE_STREAMS`), drawn for all
  clients at once; client ``c`` takes draw ``c`` of each stream, so its profile does not
  depend on the number of clients either (trace files aside);
* a task's noise, dropout coin and failure point come from its own stream
  ``(Purpose.SYSTEM_TASK, client, counter)``;
* Bernoulli availability coins at dispatch ``counter``: client ``c`` is available iff the
  uniform hash of ``c`` under a key drawn from the stream ``(Purpose.SYSTEM_AVAILABILITY, counter)``
  is < p (vectorized, and computed only for the clients asked about);
* ``sample_available`` walks all clients in a random order keyed by the stream
  ``(Purpose.SYSTEM_SAMPLE, counter)`` and keeps the first ``k`` eligible ones (see
  :meth:`SystemModel.sample_available`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from raysim.streams import MAX_ID, Purpose, stream, streams
from raysim.system.config import byzantine_count
from raysim.system.traces import load_availability_trace, load_compute_trace
from raysim.system.validate import check_byzantine_ids, validate_system

COUNTERS_AT_ONCE = 64  # dispatch counters whose sampling (and Bernoulli) streams are built together

# Profile field -> j of its stream (Purpose.SYSTEM_PROFILE, j). Never renumber: add new j's.
PROFILE_STREAMS = {"speed": 0, "tier": 1, "slow": 2, "net_tier": 3, "down_mbps": 4, "up_mbps": 5,
                   "phase": 6, "participation": 7, "local_steps": 8, "byzantine": 9}


@dataclass
class TaskTiming:
    """Virtual timing of tasks, one entry per task in the order given (seconds)."""

    compute_s: np.ndarray  # work * seconds_per_sample / speed * noise factor
    comm_s: np.ndarray  # 2 * latency + bytes down and up over the bandwidths (0 without a network model)
    duration_s: np.ndarray  # compute_s + comm_s
    failed: np.ndarray  # bool: the task drops out (no update)
    fail_at_s: np.ndarray  # failed tasks: when the failure is known, in (0, duration_s); NaN otherwise

    @property
    def known_at_s(self) -> np.ndarray:
        """Seconds after dispatch at which the server learns the outcome (failure or update)."""
        return np.where(self.failed, self.fail_at_s, self.duration_s)


class SystemModel:
    """Per-client system profiles and the virtual-time services the engine needs.

    ``cfg`` is the ``system`` section (a :class:`~raysim.system.SystemConfig` or
    an omegaconf node with the same keys); it is validated here, and trace files
    are loaded and checked against ``num_clients``.
    """

    def __init__(self, cfg, num_clients: int, seed: int):
        validate_system(cfg, None)
        self.cfg, self.num_clients, self.seed = cfg, int(num_clients), int(seed)
        self.profile: dict[str, np.ndarray] = {}
        self._draw_compute()
        self._draw_network()
        self._draw_availability()
        self._draw_unreliable()
        self._draw_byzantine()
        self._by_counter: dict = {}  # purpose -> {dispatch counter: what its stream gave}, see _per_counter
        self._last_sample = (None, None)  # ((t, counter, k), sample) of the latest call without exclusions

    # ------------------------------------------------------------------ static profiles

    def _rng(self, field: str) -> np.random.Generator:
        return stream(self.seed, Purpose.SYSTEM_PROFILE, PROFILE_STREAMS[field])

    def _draw_tier(self, field: str, tiers) -> np.ndarray:
        """Each client's tier index, drawn independently with the tiers' fractions."""
        edges = np.cumsum([float(t.fraction) for t in tiers])
        u = self._rng(field).random(self.num_clients) * edges[-1]
        return np.minimum(np.searchsorted(edges, u, side="right"), len(tiers) - 1).astype(np.int64)

    def _draw_compute(self) -> None:
        c, n = self.cfg.compute, self.num_clients
        tier = _constant(-1, n)
        if c.kind == "constant":
            speed = _constant(float(c.speed), n)
        elif c.kind == "tiers":
            tier = self._draw_tier("tier", c.tiers)
            speed = np.array([float(t.speed) for t in c.tiers])[tier]
        elif c.kind == "lognormal":
            speed = self._rng("speed").lognormal(c.mu, c.sigma, n)
        elif c.kind == "pareto":
            speed = c.scale / (1.0 + self._rng("speed").pareto(c.shape, n))
        else:  # trace
            speed = load_compute_trace(c.path, n)
        if c.slow_fraction > 0:
            slow = self._rng("slow").random(n) < c.slow_fraction
            speed = np.where(slow, speed / c.slow_factor, speed)
        else:
            slow = _constant(False, n)
        self.profile.update(speed=speed, tier=tier, slow=slow)

    def _draw_network(self) -> None:
        w, n = self.cfg.network, self.num_clients
        net_tier = _constant(-1, n)
        if w.kind == "none":  # free communication: infinite bandwidth, no latency
            down, up, latency = _constant(math.inf, n), _constant(math.inf, n), _constant(0.0, n)
        elif w.kind == "tiers":
            net_tier = self._draw_tier("net_tier", w.tiers)
            down = np.array([float(t.down_mbps) for t in w.tiers])[net_tier]
            up = np.array([float(t.up_mbps) for t in w.tiers])[net_tier]
            latency = np.array([float(t.latency_s) for t in w.tiers])[net_tier]
        else:  # constant, lognormal
            down, up = _constant(float(w.down_mbps), n), _constant(float(w.up_mbps), n)
            if w.kind == "lognormal":
                down = down * np.exp(w.sigma * self._rng("down_mbps").standard_normal(n))
                up = up * np.exp(w.sigma * self._rng("up_mbps").standard_normal(n))
            latency = _constant(float(w.latency_s), n)
        self.profile.update(down_mbps=down, up_mbps=up, latency_s=latency, net_tier=net_tier)

    def _draw_availability(self) -> None:
        a, n = self.cfg.availability, self.num_clients
        self.profile["phase"] = self._rng("phase").random(n) if a.kind == "diurnal" else _constant(0.0, n)
        self._intervals = load_availability_trace(a.path, n) if a.kind == "trace" else None
        # expected share of clients available at a dispatch (trace: ever online), for describe() and batch sizes
        self._online_share = (self._intervals.clients_with_intervals / n if a.kind == "trace" else
                              {"always": 1.0, "bernoulli": float(a.p), "diurnal": float(a.on_fraction)}[a.kind])

    def _draw_unreliable(self) -> None:
        u = self.cfg.unreliable
        self.profile["participation"] = self._draw_distribution("participation", u.participation)
        self.profile["local_steps"] = (_constant(0, self.num_clients) if u.local_steps is None
                                       else self._draw_distribution("local_steps", u.local_steps).astype(np.int64))

    def _draw_byzantine(self) -> None:
        """The Byzantine clients: those listed, or the round(fraction·N) clients with the smallest
        uniforms of the profile stream (one uniform per client)."""
        b, n = self.cfg.byzantine, self.num_clients
        if b.clients is None and b.fraction == 0:
            self.profile["byzantine"] = _constant(False, n)
            return
        byzantine = np.zeros(n, dtype=bool)
        if b.clients is not None:
            check_byzantine_ids(list(b.clients), n)
            byzantine[list(b.clients)] = True
        elif b.fraction > 0:
            byzantine[np.argsort(self._rng("byzantine").random(n), kind="stable")[:byzantine_count(b, n)]] = True
        self.profile["byzantine"] = byzantine

    def _draw_distribution(self, field: str, d) -> np.ndarray:
        n = self.num_clients
        if d.kind == "constant":
            return _constant(float(d.value), n)
        if d.kind == "uniform":
            return self._rng(field).uniform(d.low, d.high, n)
        if d.kind == "uniform_int":
            return self._rng(field).integers(int(d.low), int(d.high), size=n, endpoint=True).astype(np.float64)
        return np.maximum(1, self._rng(field).poisson(d.mean, n)).astype(np.float64)  # poisson

    def profile_of(self, client_ids) -> dict[str, np.ndarray]:
        """The profile fields of the given clients (arrays aligned with ``client_ids``)."""
        ids = np.asarray(client_ids, dtype=np.int64)
        return {name: values[ids] for name, values in self.profile.items()}

    # ------------------------------------------------------------------ task timing

    def task_draws(self, client_ids, counters) -> np.ndarray:
        """[N, 3]: the random draws of each task, from its own stream ``(Purpose.SYSTEM_TASK, client,
        counter)`` in this order: a standard normal (compute noise), a uniform (dropout coin) and a
        failure point in (0, 1). A task's draws do not depend on the other tasks in the call."""
        ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
        counters = _per_task(counters, ids, np.int64)
        draws = np.empty((len(ids), 3))
        for i, rng in enumerate(streams(self.seed, Purpose.SYSTEM_TASK, np.stack([ids, counters], 1))):
            draws[i] = rng.standard_normal(), rng.random(), rng.integers(1, 2 ** 53) / 2 ** 53
        return draws

    def task_timing(self, client_ids, counters, work, bytes_down: int, bytes_up,
                    draws: np.ndarray | None = None, round_trips: int = 1) -> TaskTiming:
        """Virtual timing of tasks: client ``client_ids[i]`` dispatched with ``counters[i]``
        processing ``work[i]`` samples, receiving ``bytes_down`` and sending ``bytes_up`` bytes (one
        number, or one a task) over ``round_trips`` round trips (each two latencies).
        ``draws``: their :meth:`task_draws`, if drawn already (a task's timing is a function of
        its draws, profile, work and message sizes)."""
        ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
        work = _per_task(work, ids, np.float64)
        z, coin, frac = (self.task_draws(ids, counters) if draws is None else draws).T
        c, p = self.cfg.compute, self.profile
        compute_s = work * c.seconds_per_sample / p["speed"][ids] * np.exp(c.noise * z)
        comm_s = (2.0 * round_trips * p["latency_s"][ids] + bytes_down * 8 / (p["down_mbps"][ids] * 1e6)
                  + bytes_up * 8 / (p["up_mbps"][ids] * 1e6))
        duration_s = compute_s + comm_s
        failed = coin < self.cfg.dropout
        return TaskTiming(compute_s, comm_s, duration_s, failed, np.where(failed, frac * duration_s, np.nan))

    # ------------------------------------------------------------------ availability

    def available(self, client_ids, t: float, counter: int) -> np.ndarray:
        """Whether each client can be sampled at virtual time ``t`` by dispatch ``counter`` (bool array).

        always: True; bernoulli: a uniform < p, the client's hash under a key drawn from the stream
        ``(Purpose.SYSTEM_AVAILABILITY, counter)`` (see :func:`_uniforms`: it costs O(clients asked
        about), whatever the population); diurnal: ``(t / period +
        phase) mod 1 < on_fraction``; trace: ``t`` lies in one of the client's intervals.
        """
        ids = np.asarray(client_ids, dtype=np.int64)
        a = self.cfg.availability
        if a.kind == "always":
            return np.ones(ids.shape, dtype=bool)
        if a.kind == "bernoulli":
            key = self._per_counter(Purpose.SYSTEM_AVAILABILITY, counter,
                                    lambda rngs: [np.uint64(rng.bit_generator.random_raw()) for rng in rngs])
            return _uniforms(key, ids) < a.p
        if a.kind == "diurnal":
            return np.mod(t / a.period + self.profile["phase"][ids], 1.0) < a.on_fraction
        return self._intervals.active(ids, t)  # trace

    def sample_available(self, t: float, counter: int, k: int, exclude=None,
                         excluded_count: int | None = None) -> np.ndarray:
        """Up to ``k`` distinct clients, uniformly among those available at ``t`` and not in
        ``exclude`` (client ids, or a boolean mask over all clients with ``excluded_count`` True
        entries, counted here if not given), sorted by id (fewer, possibly none, if fewer are eligible).

        Algorithm: all clients in a random order (a keyed pseudorandom permutation
        whose keys come from the stream ``(Purpose.SYSTEM_SAMPLE, counter)``, see
        ``_RandomOrder``); the sample is the first ``k`` eligible clients in that order. The order is
        evaluated lazily in growing batches, so the result is one function of
        (seed, counter, t, k, exclude) while the cost is O(k / eligible share):
        about 1 ms for N = 1,000,000 and k = 100 when everyone is available, and
        a few passes over N (tens of ms) only when almost nobody is.
        """
        if exclude is None and self._last_sample[0] == (t, counter, k):  # a synchronous round's sample, drawn ahead
            return self._last_sample[1]
        order = self._per_counter(Purpose.SYSTEM_SAMPLE, counter, lambda rngs: _RandomOrder.keyed(self.num_clients, rngs))
        if exclude is not None and exclude.dtype == bool:  # a mask over all clients: O(1) lookups
            mask = exclude
            n_excluded = int(np.count_nonzero(exclude)) if excluded_count is None else excluded_count
        else:
            excluded = np.unique(np.asarray(exclude if exclude is not None else [], dtype=np.int64))
            mask, n_excluded = None, len(excluded)
        if k == 1 and mask is not None and order.head_clients is not None:  # an async dispatch: the head first
            candidates = order.head_clients
            ok = ~mask[candidates]
            if self.cfg.availability.kind != "always":
                ok &= self.available(candidates, t, counter)
            hits = np.flatnonzero(ok)
            if len(hits):
                return candidates[hits[:1]]
        share = self._online_share * (1.0 - n_excluded / self.num_clients) * self.num_clients / order.domain
        batch = int(min(order.domain, 1.25 * k / max(share, 1.0 / order.domain) + 16))
        chosen, need, position = [np.empty(0, dtype=np.int64)], int(k), 0
        while need > 0 and position < order.domain:
            candidates = order.slice(position, min(order.domain, position + batch))
            ok = self.available(candidates, t, counter)
            if mask is not None:
                ok &= ~mask[candidates]
            elif n_excluded:
                ok &= ~np.isin(candidates, excluded, assume_unique=True)
            chosen.append(candidates[ok][:need])
            need -= len(chosen[-1])
            position, batch = position + batch, 2 * batch
        sample = np.sort(np.concatenate(chosen))
        if exclude is None:
            sample.setflags(write=False)  # handed out again for the same arguments
            self._last_sample = ((t, counter, k), sample)
        return sample

    def _per_counter(self, purpose: Purpose, counter: int, build):
        """``build(rngs)[i]`` for ``rngs[i]``, the stream ``(purpose, counter)``. Dispatch counters come
        one after another, so the streams of the next ``COUNTERS_AT_ONCE - 1`` counters are built and
        used in the same vectorized pass, and kept until a counter outside them is asked for."""
        counter = int(counter)
        kept = self._by_counter.get(purpose, {})
        if counter not in kept:
            counters = np.arange(counter, max(counter + 1, min(counter + COUNTERS_AT_ONCE, MAX_ID + 1)))
            kept = self._by_counter[purpose] = dict(zip(counters.tolist(), build(streams(self.seed, purpose,
                                                                                         counters[:, None]))))
        return kept[counter]

    def next_available_time(self, t: float) -> float:
        """The earliest virtual time >= t at which some client is available; ``math.inf`` if never.

        always and bernoulli (p > 0): ``t``; diurnal: the nearest start of a client's
        online window; trace: the nearest start of an interval (``t`` if one is open).
        """
        a = self.cfg.availability
        if a.kind in ("always", "bernoulli"):  # validation rejects p = 0
            return float(t)
        if a.kind == "trace":
            return self._intervals.next_time(t)
        phase = self.profile["phase"]
        x = np.mod(t / a.period + phase, 1.0)
        if (x < a.on_fraction).any():
            return float(t)
        client = int(np.argmax(x))  # the client whose window opens first
        when = t + (1.0 - x[client]) * a.period
        step = a.period * 2.0 ** -52 * max(1.0, abs(when) / a.period)
        while not np.mod(when / a.period + phase[client], 1.0) < a.on_fraction:  # rounding put it just before
            when, step = when + step, 2 * step
        return float(when)

    # ------------------------------------------------------------------ summary

    def describe(self) -> dict:
        """Summary statistics of the population (JSON-friendly) for the run summary."""
        p, cfg = self.profile, self.cfg
        speed = p["speed"]
        out = {"num_clients": self.num_clients, "compute_kind": cfg.compute.kind,
               "speed_mean": float(speed.mean()), "speed_median": float(np.median(speed)),
               "speed_min": float(speed.min()), "speed_max": float(speed.max()),
               "slow_clients": int(p["slow"].sum())}
        if cfg.compute.kind == "tiers":
            out["tier_counts"] = np.bincount(p["tier"], minlength=len(cfg.compute.tiers)).tolist()
        out["network_kind"] = cfg.network.kind
        if cfg.network.kind != "none":
            out.update(down_mbps_mean=float(p["down_mbps"].mean()), up_mbps_mean=float(p["up_mbps"].mean()),
                       latency_s_mean=float(p["latency_s"].mean()))
        if cfg.network.kind == "tiers":
            out["network_tier_counts"] = np.bincount(p["net_tier"], minlength=len(cfg.network.tiers)).tolist()
        out.update(availability_kind=cfg.availability.kind, available_share=self._online_share,
                   dropout=float(cfg.dropout), participation_mean=float(p["participation"].mean()),
                   local_steps_mean=(float(p["local_steps"].mean()) if cfg.unreliable.local_steps is not None
                                     else None),
                   coin=cfg.unreliable.coin, weights=cfg.unreliable.weights,
                   gradient_noise=cfg.unreliable.gradient_noise, normalize_steps=cfg.unreliable.normalize_steps,
                   byzantine_clients=int(p["byzantine"].sum()),
                   byzantine_attack=cfg.byzantine.attack if p["byzantine"].any() else None)
        return out


def _per_task(values, ids: np.ndarray, dtype) -> np.ndarray:
    """``values`` as an array aligned with ``ids`` (one value for all of them is repeated)."""
    values = np.asarray(values, dtype=dtype)
    return values if values.shape == ids.shape else np.broadcast_to(values, ids.shape)


def _constant(value, n: int) -> np.ndarray:
    """A read-only array of ``n`` copies of ``value`` that takes no memory per client (a profile
    field every client shares)."""
    return np.broadcast_to(np.asarray(value), (n,))


_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """The SplitMix64 finalizer: a bijection of uint64 that spreads every input bit over the output."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _uniforms(key: np.uint64, ids: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per client id under ``key`` (a counter-based generator: client ``c``'s
    value depends only on ``key`` and ``c``)."""
    with np.errstate(over="ignore"):
        return (_mix((ids.astype(np.uint64) + key) * _GOLDEN) >> np.uint64(11)) * 2.0 ** -53


@functools.lru_cache(maxsize=16)
def _feistel_domain(n: int) -> tuple:
    """(domain, half, mask) of :class:`_RandomOrder` over n clients: the smallest power of 4 covering
    n (at least 4), the bits of a half and their mask (one per population, kept)."""
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    return 1 << bits, np.uint64(bits // 2), np.uint64((1 << (bits // 2)) - 1)


class _RandomOrder:
    """A keyed pseudorandom order of 0..n-1, evaluated in slices (vectorized).

    A balanced Feistel network permutes the smallest power-of-4 domain covering n
    (rounds mix with the SplitMix64 finalizer and a 64-bit key each); the order of
    the clients is that permutation with the values >= n left out, so a slice of
    domain positions costs one network evaluation and no cycle walking.
    """

    ROUNDS = 8
    HEAD = 64  # positions :meth:`keyed` evaluates up front, for the orders of several counters at once

    def __init__(self, n: int, keys: np.ndarray, head: np.ndarray | None = None,
                 head_clients: np.ndarray | None = None):
        """``keys``: the rounds' keys (uint64 ``[ROUNDS]``); ``head``: the network's values at the first
        positions, if computed already, and ``head_clients`` the clients among them."""
        self.n, (self.domain, self.half, self.mask) = n, _feistel_domain(n)
        self.keys, self.head, self.head_clients = keys, head, head_clients

    @classmethod
    def keyed(cls, n: int, rngs: list) -> list:
        """One order per generator (its keys are the generator's first ``ROUNDS`` 64-bit draws), the
        first ``HEAD`` positions of all of them evaluated in one pass."""
        # a generator's raw 64-bit outputs are its draws of integers(0, 2**64, dtype=uint64), ten times cheaper
        keys = np.stack([rng.bit_generator.random_raw(cls.ROUNDS) for rng in rngs])
        first = cls(n, keys)
        heads = first._feistel(np.arange(min(cls.HEAD, first.domain), dtype=np.uint64)[None, :])
        clients, inside = heads.astype(np.int64), heads < np.uint64(n)
        return [cls(n, k, head, row[kept]) for k, head, row, kept in zip(keys, heads, clients, inside)]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        """The network at positions ``x`` (its rows under the rows of keys, if ``keys`` has several)."""
        left, right = x >> self.half, x & self.mask
        for r in range(self.ROUNDS):
            left, right = right, left ^ (_mix((right + self.keys[..., r, None]) * _GOLDEN) & self.mask)
        return (left << self.half) | right

    def slice(self, start: int, stop: int) -> np.ndarray:
        """The clients at domain positions start..stop-1 of the order (values >= n left out)."""
        if self.head is not None and stop <= len(self.head):
            y = self.head[start:stop]
        else:
            y = self._feistel(np.arange(start, stop, dtype=np.uint64))
        return y[y < np.uint64(self.n)].astype(np.int64)
