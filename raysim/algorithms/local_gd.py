"""Local GD (Khaled et al. 2019): FedAvg with local (full-batch on a quadratic) gradient steps,
the non-personalised baseline of the FFGG paper's comparison (ALGORITHMS.md §5.3 Exp B)."""

from __future__ import annotations

import torch

from raysim.algorithms.base import ClientContext, ClientUpdates, stack_params
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.gradients import LocalGradients, mean_loss


def local_steps(ctx: ClientContext, cfg, start: torch.Tensor, lr: float, correction=None):
    """Run the clients' local gradient steps from ``start`` [C, P] (``correction`` [C, P] is added
    to every gradient: SCAFFOLD's c − c_i). Returns (final [C, P], mean loss [C], steps taken)."""
    grads, losses = LocalGradients(ctx, cfg), []
    params = start.clone()
    for s in range(grads.num_steps):
        g, loss, scale = grads.at(params, s)
        if correction is not None:
            g = g + correction
        params = params - (lr * scale)[:, None] * (g + cfg.weight_decay * params)
        losses.append(loss)
    return params, mean_loss(losses), grads.num_steps


def local_step_size(algorithm) -> float:
    """``lr``, or with ``lr_unit: inverse_smoothness`` lr/(L_f·τ) (τ = ``local_steps``)."""
    cfg = algorithm.cfg
    return cfg.lr if cfg.lr_unit == "absolute" else cfg.lr * algorithm.unit("L_f") / cfg.local_steps


class LocalGD(FedAvg):
    """Clients take ``local_steps`` gradient steps of size ``lr`` (with ``lr_unit:
    inverse_smoothness``: in units of 1/(L_f·τ), the paper's 1/(L_f τ) at lr = 1) on the shared
    model; the server averages as FedAvg does (``server_lr``)."""

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        start = stack_params(payloads, ctx.device)
        final, loss, _ = local_steps(ctx, self.cfg, start, local_step_size(self))
        return ClientUpdates(ctx.client_ids, ctx.train_sizes, loss, {"delta": (start - final).cpu()})
