"""The ``privacy:`` section of a scenario: which differential-privacy mechanism guards the clients'
updates, its clip norm and noise, and how the privacy it spends is accounted. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raysim.schema import key, non_negative, one_of, open_unit_interval, positive, positive_int, when

MECHANISMS = {
    "none": "no differential privacy",
    "central": "DP-FedAvg (McMahan, Ramage, Talwar, Zhang, 2018): each client clips its update to norm "
               "clip_norm; the server adds Gaussian noise of std noise_multiplier·clip_norm to their sum and "
               "divides by the expected number of participants",
    "local": "each client clips its update and adds Gaussian noise of std noise_multiplier·clip_norm to it "
             "before upload; the server aggregates as usual",
    "dp_ftrl": "DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, 2021): each client clips its update; the "
               "server adds tree-aggregation noise (std noise_multiplier·clip_norm per tree node) to the prefix sums "
               "of the clipped sums, restarting the tree every tree_restart_every steps; no sampling assumed",
}
ACCOUNTANTS = {
    "auto": "pld where dp-accounting's PLD accountant composes the run's events, rdp where it cannot "
            "(fixed-size sampling without replacement)",
    "pld": "privacy loss distributions (dp-accounting's PLDAccountant)",
    "rdp": "Rényi DP (dp-accounting's RdpAccountant)",
}
DP = when("privacy.mechanism", "central", "local", "dp_ftrl")
EVENT_COLUMNS = ("norm_before_clip", "norm_uploaded", "clip_norm")  # what the clients' privacy stages log per update
CENTRAL_SYNC = (when("privacy.mechanism", "central"), when("execution.mode", "sync"))
ADAPTIVE = when("privacy.adaptive_clip.target_quantile", None, negate=True)


@dataclass
class AdaptiveClipConfig:
    """Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with
    Adaptive Clipping", 2021): each round, the clip norm C moves toward a quantile of the clients'
    update norms, from a noised count of the updates within it."""

    target_quantile: Optional[float] = key(None, "γ: move the clip norm each round toward the γ-quantile of the "
                                                 "clients' update norms (clip_norm is its start); null: a fixed "
                                                 "clip norm", check=open_unit_interval)
    lr: float = key(0.2, "η_C: the geometric step C ← C·exp(−η_C·(b̄ − γ)), b̄ the noised share of updates "
                         "within C", check=positive, when=ADAPTIVE)
    count_noise: Optional[float] = key(None, "σ_b: std of the Gaussian noise on the count of updates within C "
                                             "(null: clients_per_round / 20, the paper's choice); the update's own "
                                             "noise shrinks so that both together spend what noise_multiplier "
                                             "alone would", check=positive, when=ADAPTIVE)


@dataclass
class PrivacyConfig:
    """Differential privacy of the clients' updates, and its accounting."""

    mechanism: str = key("none", "none | central (DP-FedAvg: noise on the server's sum) | local (each client "
                                 "noises its own update) | dp_ftrl (tree-aggregation noise on the prefix sums) "
                                 "(raysim list: privacy mechanisms)", check=one_of(*MECHANISMS))
    clip_norm: float = key(1.0, "S: each client's update is scaled to L2 norm at most S before upload",
                           check=positive, when=DP)
    noise_multiplier: Optional[float] = key(None, "z: the Gaussian noise's std is z·S (central: on the sum of a "
                                                  "server step's clipped updates; local: on each clipped update; "
                                                  "dp_ftrl: on each tree node); null: calibrated to target_epsilon",
                                            check=non_negative, when=DP)
    target_epsilon: Optional[float] = key(None, "the ε the planned run spends at delta: z is calibrated to it before "
                                                "Ray starts (raysim validate prints it); set this or noise_multiplier",
                                          check=positive, when=DP)
    tree_restart_every: Optional[int] = key(None, "dp_ftrl: server steps per aggregation tree, after which a new "
                                                  "tree starts (null: one tree for the whole run)",
                                            check=positive_int, when=when("privacy.mechanism", "dp_ftrl"))
    delta: Optional[float] = key(None, "δ of the (ε, δ) reported (null: 1/N^1.1 for N clients)",
                                 check=open_unit_interval, when=DP)
    adaptive_clip: AdaptiveClipConfig = key(doc="central DP, sync: adaptive clipping of the clients' updates",
                                            factory=AdaptiveClipConfig, when=CENTRAL_SYNC)
    accountant: str = key("auto", "auto (pld, or rdp for fixed-size sampling, which dp-accounting's PLD "
                                  "accountant cannot compose) | pld | rdp", check=one_of(*ACCOUNTANTS), when=DP)


def delta_of(privacy, num_clients: int) -> float:
    """The run's δ: ``privacy.delta``, or 1/N^1.1."""
    return privacy.delta if privacy.delta is not None else float(num_clients) ** -1.1


def expected_participants(cfg) -> int:
    """The updates a server step expects: ``clients_per_round`` (sync; Poisson sampling's mean),
    ``buffer_size`` (FedBuff) or 1 (FedAsync): central DP's fixed denominator."""
    ex = cfg.execution
    if ex.mode == "sync":
        return ex.clients_per_round
    return ex.buffer_size if ex.aggregation == "fedbuff" else 1


def update_noise_multiplier(privacy, expected: int) -> float:
    """The multiplier z_Δ of the update's own noise: z itself with a fixed clip norm; with adaptive
    clipping, z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), so that the update's noise and the count's (std σ_b on
    a sum of ±1/2 bits) together equal one Gaussian mechanism of multiplier z (Andrew et al.,
    Theorem 1). ``expected``: the clients a round expects (σ_b's default is expected / 20)."""
    z = privacy.noise_multiplier
    if privacy.adaptive_clip.target_quantile is None:
        return z
    sigma_b = count_noise(privacy, expected)
    if z == 0:
        return 0.0
    return (z ** -2 - (2 * sigma_b) ** -2) ** -0.5


def count_noise(privacy, expected: int) -> float:
    """σ_b: ``privacy.adaptive_clip.count_noise``, or ``expected`` / 20."""
    given = privacy.adaptive_clip.count_noise
    return given if given is not None else expected / 20
