"""The ``system:`` section of a scenario: devices, networks, availability, dropout, unreliable agents,
Byzantine clients.

Structured omegaconf dataclasses (every key, its type, default, doc and the kinds it applies to), plus
:data:`DISTRIBUTIONS`, the one-line description of every ``kind`` (and other
named option) per section, which validation and ``raysim list`` both use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from raysim.schema import key, when

OMNISCIENT_ATTACKS = ("alie", "ipm")  # they see the honest updates of the same server step


@dataclass(frozen=True)
class _TierOf:
    """A condition (see :class:`raysim.schema.When`): a :class:`Tier` key applies only in the tiers of
    ``system.<section>`` (``holds`` gets the tier's own path, ``system.compute.tiers[i]`` or
    ``system.network.tiers[i]``)."""

    section: str

    def holds(self, cfg, section: str) -> bool:
        return section.startswith(f"system.{self.section}.tiers[")

    def describe(self, cfg, section: str) -> str:
        return f"it applies only in system.{self.section}.tiers (here a tier of {section.split('[')[0]})"


COMPUTE_TIER, NETWORK_TIER = _TierOf("compute"), _TierOf("network")


@dataclass
class Tier:
    """One device class (compute tiers: fraction, speed) or network class (network tiers: fraction,
    down_mbps, up_mbps, latency_s)."""

    fraction: float = key(1.0, "share of the clients in this tier (the tiers' fractions sum to 1)")
    speed: float = key(1.0, "compute tiers: relative device speed", when=COMPUTE_TIER)
    down_mbps: float = key(100.0, "network tiers: download bandwidth (Mbit/s)", when=NETWORK_TIER)
    up_mbps: float = key(20.0, "network tiers: upload bandwidth (Mbit/s)", when=NETWORK_TIER)
    latency_s: float = key(0.05, "network tiers: one-way latency (s)", when=NETWORK_TIER)


def _compute(*kinds: str):
    return when("system.compute.kind", *kinds)


@dataclass
class ComputeConfig:
    """Per-client device speed and the virtual compute time of a task."""

    kind: str = key("constant", "per-client speed: constant | tiers | lognormal | pareto | trace")
    speed: float = key(1.0, "constant: every client's speed", when=_compute("constant"))
    tiers: List[Tier] = key(doc="tiers: device classes, a list of {fraction, speed} (fractions sum to 1; each "
                                "client draws its tier)", factory=list, when=_compute("tiers"))
    mu: float = key(0.0, "lognormal: speed = exp(N(mu, sigma)) per client", when=_compute("lognormal"))
    sigma: float = key(1.0, "lognormal: standard deviation of log speed", when=_compute("lognormal"))
    shape: float = key(1.5, "pareto: speed = scale / (1 + Lomax(shape)) per client", when=_compute("pareto"))
    scale: float = key(1.0, "pareto: the fastest speed", when=_compute("pareto"))
    slow_fraction: float = key(0.0, "on top of any kind: this share of the clients (drawn per client) is "
                                    "slow_factor times slower")
    slow_factor: float = key(10.0, "how many times slower the slow_fraction clients are (>= 1)")
    path: Optional[str] = key(None, "trace: CSV or Parquet file with columns client_id, speed (every client once)",
                              when=_compute("trace"))
    seconds_per_sample: float = key(0.001, "virtual seconds per sample of work at speed 1")
    noise: float = key(0.0, "per-task log-normal jitter: compute time times exp(N(0, noise))")


def _network(*kinds: str):
    return when("system.network.kind", *kinds)


@dataclass
class NetworkConfig:
    """Per-client bandwidths and latency: the virtual communication time of a task."""

    kind: str = key("none", "communication time: none (free) | constant | tiers | lognormal")
    down_mbps: float = key(100.0, "constant, lognormal: download bandwidth (Mbit/s)",
                           when=_network("constant", "lognormal"))
    up_mbps: float = key(20.0, "constant, lognormal: upload bandwidth (Mbit/s)", when=_network("constant", "lognormal"))
    latency_s: float = key(0.05, "constant, lognormal: one-way latency (s)", when=_network("constant", "lognormal"))
    tiers: List[Tier] = key(doc="tiers: network classes, a list of {fraction, down_mbps, up_mbps, latency_s} "
                                "(fractions sum to 1; each client draws its tier)", factory=list,
                            when=_network("tiers"))
    sigma: float = key(0.5, "lognormal: bandwidths = down_mbps, up_mbps times exp(N(0, sigma)) per client",
                       when=_network("lognormal"))


def _availability(*kinds: str):
    return when("system.availability.kind", *kinds)


@dataclass
class AvailabilityConfig:
    """When a client can be sampled."""

    kind: str = key("always", "when a client can be sampled: always | bernoulli | diurnal | trace")
    p: float = key(1.0, "bernoulli: probability that a client is available at a dispatch",
                   when=_availability("bernoulli"))
    period: float = key(86400.0, "diurnal: virtual seconds per day", when=_availability("diurnal"))
    on_fraction: float = key(0.5, "diurnal: share of each period a client is online (phase uniform per client)",
                             when=_availability("diurnal"))
    path: Optional[str] = key(None, "trace: CSV or Parquet file with columns client_id, start, end (online "
                                    "intervals, virtual seconds)", when=_availability("trace"))


@dataclass
class DistributionConfig:
    """A per-client number drawn once (participation probability, local step count)."""

    kind: str = key("constant", "per-client law: constant | uniform | uniform_int | poisson (participation: "
                                "constant | uniform; local_steps: constant | uniform_int | poisson)")
    value: float = key(1.0, "constant: every client's value", when=when("kind", "constant"))
    low: float = key(0.0, "uniform, uniform_int: lower end of [low, high]", when=when("kind", "uniform", "uniform_int"))
    high: float = key(1.0, "uniform, uniform_int: upper end of [low, high]",
                      when=when("kind", "uniform", "uniform_int"))
    mean: float = key(1.0, "poisson: mean (every client gets at least 1)", when=when("kind", "poisson"))


@dataclass
class UnreliableConfig:
    """Unreliable agents (FedAvg with unreliable agents): participation coins, per-client local work, weights,
    noise, step normalisation."""

    participation: DistributionConfig = key(doc="δ_k in (0, 1] per client: each local step is computed with "
                                                "probability δ_k and then scaled by 1/δ_k",
                                            factory=DistributionConfig)
    coin: str = key("step", "step: one participation coin per local step; round: one coin per task decides all "
                            "of the client's local steps (both scale a computed step by 1/delta_k)")
    local_steps: Optional[DistributionConfig] = key(None, "E_k, local steps per client: {kind: constant | "
                                                          "uniform_int | poisson, value, low, high, mean} (null: "
                                                          "the algorithm's own local work)")
    weights: str = key("samples", "aggregation weights p_k of a server step's updates: samples (proportional to "
                                  "training rows) | uniform")
    gradient_noise: str = key("none", "noise added to every local gradient: none | gaussian | laplace")
    noise_scale: float = key(0.0, "gaussian: standard deviation; laplace: scale of the gradient noise",
                             when=when("gradient_noise", "none", negate=True))
    normalize_steps: bool = key(False, "each client's local step size is lr / E_k, E_k its number of local steps "
                                       "(the second-order-guarantees paper's mu·K·p_k / E_k with K·p_k = 1, as "
                                       "with weights: uniform)")


def _attack(*names: str):
    return when("system.byzantine.attack", *names)


@dataclass
class ByzantineConfig:
    """Byzantine clients: which clients are malicious and what they send instead of their update."""

    fraction: float = key(0.0, "share of the clients that are Byzantine, drawn once from the seed (the set does "
                               "not depend on the number of actors); in [0, 0.5)")
    clients: Optional[List[int]] = key(None, "ids of the Byzantine clients (instead of fraction)")
    attack: str = key("sign_flip", "what Byzantine clients send: sign_flip | gaussian | nan | label_flip | alie | ipm "
                                   "(raysim list)")
    scale: float = key(1.0, "sign_flip: send -scale times the client's honest update", when=_attack("sign_flip"))
    sigma: float = key(1.0, "gaussian: standard deviation of every coordinate", when=_attack("gaussian"))
    z: Optional[float] = key(None, "alie: honest mean - z * honest std per coordinate (null: z from the step's n "
                                   "updates and f Byzantine ones, as in Baruch et al.)", when=_attack("alie"))
    epsilon: float = key(0.1, "ipm: send -epsilon times the honest mean", when=_attack("ipm"))
    window: Optional[int] = key(None, "alie, ipm under FedAsync: the last `window` honest updates the attack sees "
                                      "(FedBuff: the buffer; sync: the round)",
                                when=(_attack(*OMNISCIENT_ATTACKS), when("execution.mode", "async"),
                                      when("execution.aggregation", "fedasync")))


def byzantine_count(cfg, num_clients: int) -> int:
    """How many of ``num_clients`` clients are Byzantine (``cfg``: the ``system.byzantine`` section):
    the listed ones, or round(fraction × N)."""
    return len(cfg.clients) if cfg.clients is not None else round(cfg.fraction * num_clients)


@dataclass
class SystemConfig:
    """Virtual-time system model: a task's virtual duration and who can be sampled when."""

    compute: ComputeConfig = field(default_factory=ComputeConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    availability: AvailabilityConfig = field(default_factory=AvailabilityConfig)
    dropout: float = key(0.0, "probability that a task fails part-way, at a uniform point of its duration (no "
                              "update; the time until the failure is spent)")
    unreliable: UnreliableConfig = field(default_factory=UnreliableConfig)
    byzantine: ByzantineConfig = field(default_factory=ByzantineConfig)


DISTRIBUTIONS: dict[str, str] = {
    "compute.constant": "every client has speed `speed`",
    "compute.tiers": "device classes: a share `fraction` of the clients (drawn per client) has the tier's `speed`",
    "compute.lognormal": "speed = exp(N(mu, sigma)) per client",
    "compute.pareto": "heavy-tailed slowness: speed = scale / (1 + Lomax(shape)) per client",
    "compute.trace": "speeds from `path` (CSV or Parquet with columns client_id, speed; every client once)",
    "network.none": "communication is free",
    "network.constant": "every client has down_mbps, up_mbps and latency_s",
    "network.tiers": "network classes: a share `fraction` of the clients has the tier's down_mbps, up_mbps, latency_s",
    "network.lognormal": "bandwidths = down_mbps, up_mbps times exp(N(0, sigma)) per client; latency_s constant",
    "availability.always": "every client is always available",
    "availability.bernoulli": "each client is available at a dispatch with probability p",
    "availability.diurnal": "each client is online a share on_fraction of every period, at a uniform random phase",
    "availability.trace": "online intervals from `path` (CSV or Parquet with columns client_id, start, end)",
    "distribution.constant": "every client gets `value`",
    "distribution.uniform": "a float uniform in [low, high] per client",
    "distribution.uniform_int": "an integer uniform in [low, high] per client",
    "distribution.poisson": "Poisson(mean) per client, at least 1",
    "weights.samples": "aggregation weight p_k proportional to the client's training samples",
    "weights.uniform": "aggregation weight p_k = 1 / (number of updates)",
    "attack.sign_flip": "send -scale times the honest update",
    "attack.gaussian": "send a vector of N(0, sigma^2) coordinates",
    "attack.nan": "send non-finite values (NaN)",
    "attack.label_flip": "train honestly on flipped labels y -> (classes - 1 - y): a data attack inside local training",
    "attack.alie": "a little is enough (Baruch et al.): honest mean - z * honest std per coordinate (omniscient)",
    "attack.ipm": "inner-product manipulation (Xie et al.): -epsilon times the honest mean (omniscient)",
    "coin.step": "one participation coin per local step",
    "coin.round": "one participation coin per task, shared by all of the client's local steps",
    "gradient_noise.none": "no perturbation of local gradients",
    "gradient_noise.gaussian": "add N(0, noise_scale^2) to every coordinate of every local gradient",
    "gradient_noise.laplace": "add Laplace(0, noise_scale) to every coordinate of every local gradient",
}


def kinds(section: str) -> list[str]:
    """The names :data:`DISTRIBUTIONS` lists for ``section`` (e.g. ``"compute"``), sorted."""
    return sorted(name.split(".", 1)[1] for name in DISTRIBUTIONS if name.startswith(section + "."))
