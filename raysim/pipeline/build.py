"""The pipelines of a scenario: which stages a server step and a client's upload go through."""

from __future__ import annotations

import numpy as np

from raysim.pipeline.attack import ByzantineAttack
from raysim.pipeline.momentum import ClientMomentum
from raysim.pipeline.server import ServerPipeline
from raysim.system.byzantine import Attack


def client_stages(cfg) -> tuple:
    """The stages a client's updates go through before upload (none yet)."""
    return ()


def aggregate_stages(cfg) -> tuple:
    """The stages a server step's aggregate goes through before the server optimizer (none yet)."""
    return ()


def server_pipeline(cfg, algorithm, byzantine: np.ndarray) -> ServerPipeline:
    """The server step of scenario ``cfg``: client momentum (``algorithm.client_momentum`` > 0),
    then the Byzantine attack (when some client is Byzantine and the attack replaces updates),
    then ``algorithm``'s aggregation, the aggregate stages, and ``algorithm``'s server optimizer.
    ``byzantine``: [N] the clients' Byzantine flags (the system profile)."""
    stages = []
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
    return ServerPipeline(algorithm, tuple(stages), aggregate_stages(cfg), client_stages(cfg), byzantine, cfg)
