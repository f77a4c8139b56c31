"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", 2020), option II control variates: a stateful baseline of the FFGG paper's comparison."""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.aggregation_rules import weighted_mean
from raysim.algorithms.base import Algorithm
from raysim.algorithms.context import ClientContext
from raysim.algorithms.updates import ClientUpdates
from raysim.algorithms.keys import ScaffoldKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.local_gd import local_step_size
from raysim.algorithms.transforms import add_correction


class Scaffold(Algorithm):
    """Client i (state: control variate c_i, zero at first): y ← y − η_l(g_i(y) − c_i + c) for its
    local steps (minibatches, or exact gradients on a quadratic; η_l = ``lr``, with ``lr_unit:
    inverse_smoothness`` in units of 1/(L_f·local_steps), divided by K_i under
    ``system.unreliable.normalize_steps``), c_i⁺ = c_i − c + (x − y)/(K_i η_l) with
    K_i its number of steps; it sends x − y and c_i⁺ − c_i (two model-sized vectors). Server:
    x ← x − η_g·Σ p_i (x − y_i) through ``server_optimizer`` (η_g = ``server_lr``);
    c ← c + (1/N)·Σ_i (c_i⁺ − c_i) over the step's clients, N the number of registered clients."""

    Keys = ScaffoldKeys
    timing_reads_payload = False  # twice the update's size, whatever the values
    stateful = True
    uploads = ("dcontrol",)

    def local_lr(self) -> float:
        return local_step_size(self)

    def init_extra(self, params: torch.Tensor) -> dict:
        return {"control": torch.zeros_like(params)}

    def payload(self, state) -> dict:
        return {"params": state.params, "control": state.extra["control"]}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg, lr = self.cfg, self.local_lr()
        x = ctx.start(payloads)
        c = ctx.start(payloads, "control")
        c_i = ctx.kept("control", torch.zeros_like(x))
        plan = ctx.plan_from(cfg)
        step = ctx.transform(plan, lr, add_correction(c - c_i), weight_decay=cfg.weight_decay,
                             max_grad_norm=cfg.max_grad_norm)
        result = local_train(x, ctx.oracle(plan), step)
        steps = torch.as_tensor(result.steps, dtype=x.dtype, device=x.device).clamp_min(1)[:, None]
        eta = ctx.step_size(plan, lr)  # the step size the client took
        eta = eta if isinstance(eta, float) else eta.to(x.dtype)[:, None]
        c_new = c_i - c + (x - result.params) / (steps * eta)
        return ctx.updates(result, x - result.params, extras={"dcontrol": c_new - c_i}, states={"control": c_new})

    def server_direction(self, state, aggregate, updates, weights):
        control = state.extra["control"]
        share = np.full(len(updates.client_ids), 1.0 / self.env.num_clients)
        moved = control.double() + weighted_mean(updates.extras["dcontrol"], share)
        return aggregate, {"control": moved.to(control.dtype)}, {}

    def upload_size(self, payload: dict) -> int:
        return 2 * self.update_size()
