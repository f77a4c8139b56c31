"""The pipelines of a scenario: which stages a server step and a client's upload go through."""

from __future__ import annotations

import numpy as np

from raysim.communication.secure_aggregation import protocol_of
from raysim.pipeline.attack import ByzantineAttack
from raysim.pipeline.compression import UplinkCompression
from raysim.pipeline.momentum import ClientMomentum
from raysim.pipeline.privacy import (CentralGaussianNoise, ClipUpdate, LocalGaussianNoise, ParticipationLedger,
                                    TreeAggregationNoise)
from raysim.pipeline.secure_aggregation import SecureQuantize, SecureSum
from raysim.pipeline.server import ServerPipeline
from raysim.privacy.config import count_noise, expected_participants, update_noise_multiplier
from raysim.system.byzantine import Attack


def client_stages(cfg) -> tuple:
    """The stages a client's updates go through before upload: the uplink's encoding
    (``communication.uplink``), then with differential privacy clipping to ``privacy.clip_norm``
    (then, local DP, the client's own noise), then under secure aggregation the quantization to
    the integers it masks."""
    stages = [] if cfg.communication.uplink.kind == "none" else [UplinkCompression(cfg.communication.uplink)]
    p = cfg.privacy
    if p.mechanism != "none":
        stages.append(ClipUpdate(p.clip_norm, adaptive=p.mechanism == "central"
                                 and p.adaptive_clip.target_quantile is not None))
    if p.mechanism == "local":
        stages.append(LocalGaussianNoise(p.noise_multiplier * p.clip_norm))
    secure = protocol_of(cfg)
    if secure is not None:
        stages.append(SecureQuantize(secure))
    return tuple(stages)


def aggregate_stages(cfg) -> tuple:
    """The stages a server step's aggregate goes through before the server optimizer: central DP's
    noise, or DP-FTRL's tree-aggregation noise."""
    p = cfg.privacy
    expected = expected_participants(cfg)
    if p.mechanism == "dp_ftrl":
        return (TreeAggregationNoise(p.noise_multiplier, p.clip_norm, expected, cfg.seed, p.tree_restart_every),)
    if p.mechanism != "central":
        return ()
    adaptive = p.adaptive_clip if p.adaptive_clip.target_quantile is not None else None
    return (CentralGaussianNoise(update_noise_multiplier(p, expected), p.clip_norm, expected, cfg.seed, adaptive,
                                 count_noise(p, expected) if adaptive is not None else 0.0),)


def server_pipeline(cfg, algorithm, byzantine: np.ndarray) -> ServerPipeline:
    """The server step of scenario ``cfg``: the privacy ledger (with differential privacy), client
    momentum (``algorithm.client_momentum`` > 0), then the Byzantine attack (when some client is
    Byzantine and the attack replaces updates),
    then secure aggregation's modular sum (``communication.secure_aggregation``), then ``algorithm``'s
    aggregation, the aggregate stages, and ``algorithm``'s server optimizer.
    ``byzantine``: [N] the clients' Byzantine flags (the system profile)."""
    mechanism = cfg.privacy.mechanism
    ledger = ParticipationLedger(len(byzantine), versions=mechanism == "dp_ftrl", squared=mechanism == "central")
    stages = [ledger] if mechanism != "none" else []
    beta = getattr(cfg.algorithm, "client_momentum", 0.0)
    if beta:
        stages.append(ClientMomentum(beta, len(byzantine)))
    attack = Attack(cfg.system.byzantine, cfg.seed)
    if byzantine.any() and attack.replaces_updates:
        ex = cfg.execution
        watches = ex.mode == "async" and ex.aggregation == "fedasync" and attack.omniscient
        advice = ("; choose a robust algorithm.aggregator (median, trimmed_mean, krum, ...)"
                  if hasattr(cfg.algorithm, "aggregator") else "")
        stages.append(ByzantineAttack(attack, byzantine, cfg.system.byzantine.window if watches else None,
                                      not algorithm.aggregator.robust, advice))
    secure = protocol_of(cfg)
    if secure is not None:
        stages.append(SecureSum(secure))
    return ServerPipeline(algorithm, tuple(stages), aggregate_stages(cfg), client_stages(cfg), byzantine, cfg,
                          cfg.communication.downlink.kind, secure)
