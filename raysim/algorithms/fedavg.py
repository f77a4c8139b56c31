"""FedAvg (McMahan et al. 2017): local minibatch SGD, sample-weighted server averaging."""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdates, stack_params, weighted_sum
from raysim.algorithms.local_sgd import local_sgd


class FedAvg(Algorithm):
    """Clients run ``local_epochs`` (or ``local_steps``) of SGD from θ and send Δ = θ − θ_k;
    the server sets θ ← θ − server_lr · Σ_k w_k Δ_k, with w_k = n_k / Σ n in a synchronous
    round. Asynchronous execution reuses it: FedAsync passes one update with its staleness
    weight, FedBuff a buffer with weights s(τ_k)/K."""

    def init(self, params: torch.Tensor) -> dict:
        return {"params": params.clone()}

    def payload(self, state: dict) -> dict:
        return {"params": state["params"]}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        start = stack_params(payloads, ctx.device)
        final, loss = local_sgd(ctx.model, start, ctx.features, ctx.labels, ctx.schedule(cfg), cfg.lr,
                                cfg.weight_decay, ctx.gradient_noise)
        return ClientUpdates(ctx.client_ids, ctx.train_sizes, loss.cpu().numpy(),
                             {"delta": (start - final).cpu()})

    def aggregate(self, state: dict, updates: ClientUpdates, weights: np.ndarray) -> dict:
        mean_delta = weighted_sum(updates.tensors["delta"], weights)
        params = (state["params"].double() - self.cfg.server_lr * mean_delta).to(state["params"].dtype)
        return {"params": params}
