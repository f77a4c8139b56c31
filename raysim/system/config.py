"""The ``system:`` section of a scenario: devices, networks, availability, dropout, unreliable agents,
Byzantine clients.

Structured omegaconf dataclasses (every key, type and default), plus
:data:`DISTRIBUTIONS`, the one-line description of every ``kind`` (and other
named option) per section, which validation and ``raysim list`` both use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from raysim.schema import key, when

OMNISCIENT_ATTACKS = ("alie", "ipm")  # they see the honest updates of the same server step


@dataclass
class Tier:
    """One device class (compute tiers) or network class (network tiers)."""

    fraction: float = 1.0  # share of the clients in this tier
    speed: float = 1.0  # compute tiers: relative device speed
    down_mbps: float = 100.0  # network tiers
    up_mbps: float = 20.0
    latency_s: float = 0.05


@dataclass
class ComputeConfig:
    """Per-client device speed and the virtual compute time of a task."""

    kind: str = "constant"  # constant | tiers | lognormal | pareto | trace
    speed: float = 1.0  # constant
    tiers: List[Tier] = field(default_factory=list)  # tiers: fractions sum to 1
    mu: float = 0.0  # lognormal: speed = exp(N(mu, sigma))
    sigma: float = 1.0
    shape: float = 1.5  # pareto: speed = scale / (1 + Lomax(shape))
    scale: float = 1.0
    slow_fraction: float = 0.0  # this share of clients (at random) is slower by slow_factor, on top of any kind
    slow_factor: float = 10.0
    path: Optional[str] = None  # trace: CSV or Parquet with columns client_id, speed
    seconds_per_sample: float = 0.001  # virtual seconds per sample at speed 1
    noise: float = 0.0  # per-task multiplicative noise exp(N(0, noise))


@dataclass
class NetworkConfig:
    """Per-client bandwidths and latency: the virtual communication time of a task."""

    kind: str = "none"  # none | constant | tiers | lognormal
    down_mbps: float = 100.0
    up_mbps: float = 20.0
    latency_s: float = 0.05
    tiers: List[Tier] = field(default_factory=list)
    sigma: float = 0.5  # lognormal: bandwidths = constants * exp(N(0, sigma)) per client


@dataclass
class AvailabilityConfig:
    """When a client can be sampled."""

    kind: str = "always"  # always | bernoulli | diurnal | trace
    p: float = 1.0  # bernoulli: chance a client is available at a dispatch
    period: float = 86400.0  # diurnal: virtual seconds per day
    on_fraction: float = 0.5  # diurnal: share of each period a client is online (uniform phase per client)
    path: Optional[str] = None  # trace: CSV or Parquet with columns client_id, start, end


@dataclass
class DistributionConfig:
    """A per-client number drawn once (participation probability, local step count)."""

    kind: str = "constant"  # constant | uniform | uniform_int | poisson
    value: float = 1.0  # constant
    low: float = 0.0  # uniform, uniform_int: [low, high]
    high: float = 1.0
    mean: float = 1.0  # poisson (at least 1)


@dataclass
class UnreliableConfig:
    """Unreliable agents (FedAvg with unreliable agents): participation coins, per-client local work, weights,
    noise, step normalisation."""

    participation: DistributionConfig = field(default_factory=DistributionConfig)  # delta_k in (0, 1]
    coin: str = key("step", "step: one participation coin per local step; round: one coin per task decides all "
                            "of the client's local steps (both scale a computed step by 1/delta_k)")
    local_steps: Optional[DistributionConfig] = None  # E_k; null: the algorithm's own setting
    weights: str = "samples"  # samples | uniform
    gradient_noise: str = "none"  # none | gaussian | laplace
    noise_scale: float = 0.0
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
    attack: str = key("sign_flip", "what Byzantine clients send: sign_flip | gaussian | nan | label_flip | alie | ipm (raysim list)")
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
    dropout: float = 0.0  # probability that a task fails part-way (no update; time until failure is spent)
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
