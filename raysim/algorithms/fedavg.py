"""FedAvg (McMahan et al. 2017): local minibatch SGD, sample-weighted server averaging."""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdates, weighted_sum
from raysim.algorithms.local_sgd import batch_schedule, local_sgd


class FedAvg(Algorithm):
    """Clients run ``local_epochs`` (or ``local_steps``) of SGD from θ and send Δ = θ − θ_k;
    the server sets θ ← θ − server_lr · Σ_k n_k Δ_k / Σ_k n_k."""

    def init(self, params: torch.Tensor) -> dict:
        return {"params": params.clone()}

    def payload(self, state: dict) -> dict:
        return {"params": state["params"]}

    def client_update(self, payload: dict, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        theta = payload["params"].to(ctx.device)
        sched = batch_schedule(ctx.offsets[:, 0], ctx.train_sizes, ctx.rngs, cfg.batch_size,
                               cfg.local_epochs, cfg.local_steps)
        start = theta.expand(len(ctx.client_ids), -1)
        final, loss = local_sgd(ctx.model, start, ctx.features, ctx.labels, sched, cfg.lr, cfg.weight_decay)
        return ClientUpdates(ctx.client_ids, ctx.train_sizes, loss.cpu().numpy(),
                             {"delta": (theta - final).cpu()})

    def aggregate(self, state: dict, updates: ClientUpdates) -> dict:
        weights = updates.samples / updates.samples.sum()
        mean_delta = weighted_sum(updates.tensors["delta"], weights)
        params = (state["params"].double() - self.cfg.server_lr * mean_delta).to(state["params"].dtype)
        return {"params": params}
