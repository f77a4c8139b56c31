"""Building the algorithm a scenario names."""

from __future__ import annotations

from raysim.algorithms.base import Algorithm, AlgorithmEnv
from raysim.catalog import algorithm_class
from raysim.system.config import byzantine_count


def make_algorithm(scenario, model, problem=None, num_clients: int = 0) -> Algorithm:
    """The algorithm that ``scenario.algorithm.name`` names (already validated), for the
    scenario's model (a FlatModel with its split), QuadraticProblem (if any) and number of clients."""
    share = byzantine_count(scenario.system.byzantine, num_clients) / num_clients if num_clients else 0.0
    env = AlgorithmEnv(model, scenario.model, num_clients, scenario.seed, problem, share)
    return algorithm_class(scenario.algorithm.name)(scenario.algorithm, env)
