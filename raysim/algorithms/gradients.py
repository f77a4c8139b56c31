"""Client gradients shared by the full-gradient and personalised algorithms (FFGG, Local FFGG,
Local GD, SCAFFOLD, L2GD): step-by-step local gradients and each client's full gradient, for
data sets of rows (minibatches of the client's rows) and for quadratic problems (exact)."""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.local_sgd import client_forward, per_client_loss


def full_gradient(ctx, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(∇f_m at ``params`` [C, P] over each client's whole training set, f_m there) per client."""
    problem = ctx.problem
    if problem is not None:
        d = problem.d_theta
        theta, w = params[:, :d], params[:, d:]
        grads = torch.cat([problem.grad_theta(ctx.client_ids, theta, w), problem.grad_w(ctx.client_ids, theta, w)], 1)
        return grads, problem.value(ctx.client_ids, theta, w)
    sizes = torch.as_tensor(ctx.train_sizes, device=ctx.device)
    cols = torch.arange(int(sizes.max()), device=ctx.device)
    mask = (cols[None, :] < sizes[:, None]).float()
    rows = torch.as_tensor(ctx.offsets[:, 0], device=ctx.device)[:, None] + cols[None, :] * mask.long()
    return _batch_gradient(ctx.model, params, ctx.features[rows], ctx.labels[rows], mask)


def _batch_gradient(model, params, x, y, mask):
    leaf = params.detach().requires_grad_(True)
    loss = per_client_loss(client_forward(model, params.shape[0]), leaf, x, y, mask)
    (grads,) = torch.autograd.grad(loss.sum(), leaf)
    return grads, loss.detach()


class LocalGradients:
    """Gradients of each client's local objective for ``num_steps`` local steps: the minibatches
    of the task's batch schedule (``ctx.schedule``), or ``cfg.local_steps`` exact gradients of a
    quadratic problem. ``at(params, s)`` -> (grads [C, P], loss [C], step scale [C])."""

    def __init__(self, ctx, cfg):
        self.ctx = ctx
        if ctx.problem is not None:
            self.schedule, self.num_steps = None, cfg.local_steps
        else:
            self.schedule = ctx.schedule(cfg)
            self.num_steps = int(self.schedule.rows.shape[0])

    def at(self, params: torch.Tensor, s: int):
        ctx = self.ctx
        if self.schedule is None:
            grads, loss = full_gradient(ctx, params)
            return grads, loss, torch.ones(params.shape[0], dtype=params.dtype)
        rows = self.schedule.rows[s].to(ctx.device)
        mask = self.schedule.mask[s].to(ctx.device)
        grads, loss = _batch_gradient(ctx.model, params, ctx.features[rows], ctx.labels[rows], mask)
        return grads, loss, self.schedule.scale[s].to(ctx.device)


def mean_loss(losses: list) -> np.ndarray:
    """Mean of per-step losses [C] (the train_loss of ClientUpdates)."""
    return torch.stack(losses).double().mean(0).cpu().numpy()
