"""SCAFFOLD (Karimireddy et al. 2020), option II control variates: a stateful baseline of the
FFGG paper's comparison (ALGORITHMS.md §5.3 Exp B)."""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdates, stack_params, weighted_sum
from raysim.algorithms.local_gd import local_step_size, local_steps


class Scaffold(Algorithm):
    """Client i (state: control variate c_i, zero at first): y ← y − η_l(g_i(y) − c_i + c) for
    ``local_steps`` steps (η_l as Local GD's step), c_i⁺ = c_i − c + (x − y)/(K η_l). Server:
    x ← x − η_g·Σ p_i (x − y_i) with η_g = ``server_lr``; c ← c + (|S|/N)·mean(c_i⁺ − c_i)."""

    stateful = True

    def init(self, params: torch.Tensor) -> dict:
        return {"params": params.clone(), "control": torch.zeros_like(params)}

    def payload(self, state: dict) -> dict:
        return {"params": state["params"], "control": state["control"]}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        x = stack_params(payloads, ctx.device)
        c = torch.stack([p["control"] for p in payloads]).to(x)
        c_i = torch.stack([torch.zeros_like(x[0]) if s is None else s.to(x) for s in ctx.states or [None] * len(x)])
        lr = local_step_size(self)
        y, loss, steps = local_steps(ctx, self.cfg, x, lr, correction=c - c_i)
        c_new = c_i - c + (x - y) / (steps * lr)
        return ClientUpdates(ctx.client_ids, ctx.train_sizes, loss,
                             {"delta": (x - y).cpu(), "dcontrol": (c_new - c_i).cpu(), "state": c_new.cpu()})

    def aggregate(self, state: dict, updates: ClientUpdates, weights: np.ndarray) -> dict:
        dtype = state["params"].dtype
        params = state["params"].double() - self.cfg.server_lr * weighted_sum(updates.tensors["delta"], weights)
        k = len(updates.client_ids)
        dcontrol = weighted_sum(updates.tensors["dcontrol"], np.full(k, 1.0 / self.num_clients))
        return {"params": params.to(dtype), "control": (state["control"].double() + dcontrol).to(dtype)}
