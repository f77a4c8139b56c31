"""Federated algorithms, one module per family; :func:`make_algorithm` builds one by name."""

from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdates, Personalized
from raysim.algorithms.fedavg import FedAvg

ALGORITHMS = {
    "fedavg": (FedAvg, "FedAvg: local SGD (algorithm.lr, batch_size, local_epochs | local_steps, "
                       "weight_decay), sample-weighted averaging with algorithm.server_lr"),
}

__all__ = ["ALGORITHMS", "Algorithm", "ClientContext", "ClientUpdates", "Personalized", "make_algorithm"]


def make_algorithm(cfg) -> Algorithm:
    """The algorithm named by ``cfg.name`` (already validated)."""
    return ALGORITHMS[cfg.name][0](cfg)
