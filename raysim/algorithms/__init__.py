"""Federated algorithms, one module per family; :func:`make_algorithm` builds one by name."""

from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdates, Personalized
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.ffgg import FFGG, LocalFFGG
from raysim.algorithms.l2gd import L2GD
from raysim.algorithms.local_gd import LocalGD
from raysim.algorithms.scaffold import Scaffold

ALGORITHMS = {
    "fedavg": (FedAvg, "FedAvg: local SGD (algorithm.lr, batch_size, local_epochs | local_steps, "
                       "weight_decay), sample-weighted averaging with algorithm.server_lr"),
    "ffgg": (FFGG, "FFGG (partial personalisation, Algorithm 1; async: Algorithm 3): fine-tune the personal "
                   "part (model.personal) with algorithm.finetuner sgd|cg|exact for local_steps at personal_lr, "
                   "send the partial gradient; server step server_lr via server_optimizer"),
    "local_ffgg": (LocalFFGG, "Local FFGG (Algorithm 4): fine-tune w, then alternate w and θ steps (personal_lr, "
                              "lr); pretrain_rounds of FedAvg first; server_optimizer sgd|adam"),
    "localgd": (LocalGD, "Local GD: local_steps gradient steps on the shared model, FedAvg averaging"),
    "scaffold": (Scaffold, "SCAFFOLD (option II control variates, stateful clients): local_steps at lr, "
                           "server_lr = η_g"),
    "l2gd": (L2GD, "L2GD (per-client models, stateful): penalty λ, average_prob p (null: 1/local_steps); "
                   "full participation"),
}

__all__ = ["ALGORITHMS", "Algorithm", "ClientContext", "ClientUpdates", "Personalized", "make_algorithm"]


def make_algorithm(scenario, model, problem=None, num_clients: int = 0) -> Algorithm:
    """The algorithm that ``scenario.algorithm.name`` names (already validated), for the
    scenario's model (a FlatModel with its split), QuadraticProblem (if any) and number of clients."""
    return ALGORITHMS[scenario.algorithm.name][0](scenario.algorithm, scenario.model, model, problem, num_clients,
                                                  scenario.seed)
