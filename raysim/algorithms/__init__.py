"""Federated algorithms, one module per family; :func:`make_algorithm` builds one by name."""

from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdates, Personalized
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.ffgg import FFGG, LocalFFGG
from raysim.algorithms.l2gd import L2GD
from raysim.algorithms.local_gd import LocalGD
from raysim.algorithms.scaffold import Scaffold

ALGORITHMS = {"fedavg": FedAvg, "ffgg": FFGG, "local_ffgg": LocalFFGG, "localgd": LocalGD, "scaffold": Scaffold,
              "l2gd": L2GD}  # name -> class; the names and their descriptions: raysim.catalog.ALGORITHMS

__all__ = ["ALGORITHMS", "Algorithm", "ClientContext", "ClientUpdates", "Personalized", "make_algorithm"]


def make_algorithm(scenario, model, problem=None, num_clients: int = 0) -> Algorithm:
    """The algorithm that ``scenario.algorithm.name`` names (already validated), for the
    scenario's model (a FlatModel with its split), QuadraticProblem (if any) and number of clients."""
    return ALGORITHMS[scenario.algorithm.name](scenario.algorithm, scenario.model, model, problem, num_clients,
                                               scenario.seed)
