"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021)."""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.aggregation_rules import weighted_mean
from raysim.algorithms.context import ClientContext
from raysim.algorithms.updates import ClientUpdates
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import FedDynKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.transforms import add_correction, add_proximal


class FedDyn(FedAvg):
    """Client i keeps g_i (zero at first) and minimises its loss − ⟨g_i, v⟩ + (α/2)‖v − θ‖²
    (α = ``dyn_alpha``) by local SGD from θ, then sets g_i ← g_i − α(v_i − θ) and sends
    Δ_i = θ − v_i. The server keeps h (zero at first): h ← h + (α/N)·Σ_i Δ_i over the step's
    clients (N registered clients) and θ ← θ − server_lr·(Σ w_i Δ_i + h/α), which for
    server_lr = 1 is the paper's θ = mean(v_i) − h/α (the mean weighted by the aggregation
    weights: by samples unless ``system.unreliable.weights: uniform``)."""

    Keys = FedDynKeys
    stateful = True

    def init_extra(self, params: torch.Tensor) -> dict:
        return {"h": torch.zeros(params.shape, dtype=torch.float64)}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        theta = ctx.start(payloads)
        g_i = ctx.kept("grad", torch.zeros_like(theta))
        plan = ctx.plan_from(cfg)
        step = ctx.transform(plan, cfg.lr, add_correction(-g_i), add_proximal(cfg.dyn_alpha, theta),
                             weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)
        result = local_train(theta, ctx.oracle(plan), step)
        moved = result.params - theta
        return ctx.updates(result, -moved, states={"grad": g_i - cfg.dyn_alpha * moved})

    def server_direction(self, state, aggregate, updates, weights):
        share = np.full(len(updates.client_ids), self.cfg.dyn_alpha / self.env.num_clients)
        h = state.extra["h"] + weighted_mean(updates.vector, share)
        return aggregate + h / self.cfg.dyn_alpha, {"h": h}, {}
