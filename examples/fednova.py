"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020), written as a user would, outside the raysim package.

Clients that take different numbers of local steps τ_i pull FedAvg toward the objectives of the
busiest clients. FedNova's clients send their update divided by τ_i; the server rescales the
weighted mean of these normalised updates by τ_eff = Σ_i p_i τ_i, p_i the step's aggregation
weights scaled to sum to 1 (asynchronous steps weight updates by staleness).
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raysim.algorithms import Algorithm
from raysim.algorithms.keys import FedAvgKeys
from raysim.algorithms.local import local_train


@dataclass
class FedNovaKeys(FedAvgKeys):
    """FedNova: FedAvg with updates normalised by each client's number of local steps."""


class FedNova(Algorithm):
    Keys = FedNovaKeys
    server_diagnostics = ("tau_eff",)  # logged in rounds.parquet's tau_eff column at every server step
    timing_reads_payload = False  # upload_size is the same whatever the payload holds

    def client_update(self, payloads, ctx):
        start = ctx.start(payloads)
        plan = ctx.plan_from(self.cfg)
        step = ctx.transform(plan, self.cfg.lr, weight_decay=self.cfg.weight_decay,
                             max_grad_norm=self.cfg.max_grad_norm)
        result = local_train(start, ctx.oracle(plan), step)
        steps = torch.as_tensor(result.steps, dtype=start.dtype).clamp_min(1)[:, None]
        return ctx.updates(result, (start - result.params) / steps, extras={"steps": steps})

    def server_direction(self, state, aggregate, updates, weights):
        steps = updates.extras["steps"][:, 0].double().numpy()
        tau_eff = float(np.dot(weights, steps) / np.sum(weights))  # asynchronous weights need not sum to 1
        return tau_eff * aggregate, state.extra, {"tau_eff": tau_eff}

    def upload_size(self, payload):
        return self.update_size() + 1  # the update and τ_i


def two_layer(feature_shape, num_classes, width=32):
    """A model factory: ``model.kind: examples.fednova:two_layer`` (``model.options.width``)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(feature_shape)), width), nn.ReLU(),
                         nn.Linear(width, num_classes))
