"""pFedMe (T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020).

Each client k looks for a personal model θ_k close to the global one: the minimiser of
f_k(θ) + (λ/2)‖θ − w‖², whose value is the Moreau envelope of f_k at w, with gradient λ(w − θ).
A client descends that envelope from the received w: at each local step it draws a minibatch,
approximates the personal model on it by K gradient steps (warm-started from the previous one),

    θ̃ ← θ̃ − η_p·(∇f(θ̃; batch) + λ(θ̃ − w_local))      (K times)
    w_local ← w_local − η·λ(w_local − θ̃)

and sends w − w_local. The server moves w ← (1 − β)·w + β·mean(w_local): FedAvg's step with
server_lr β. The last θ̃ stays on the client (its kept state ``personal``) and is what
personalized evaluation tests.
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.context import ClientContext
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import PFedMeKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.oracles import StepPlan
from raysim.algorithms.transforms import ClientTransform, add_proximal
from raysim.algorithms.updates import ClientUpdates


class MoreauOracle:
    """An oracle (see :mod:`raysim.algorithms.oracles`) whose gradient at local step ``s``, at the
    clients' local models w, is the Moreau envelope's λ(w − θ̃): θ̃ after ``inner_steps`` steps of
    ``inner_step(w)`` on step s's minibatch from the previous θ̃ (at first ``theta``); its loss is
    the mean of f over those inner steps. :attr:`theta` holds the last θ̃."""

    def __init__(self, ctx: ClientContext, plan: StepPlan, theta: torch.Tensor, lam: float, inner_steps: int,
                 inner_step):
        self.ctx, self.plan, self.theta = ctx, plan, theta
        self.lam, self.inner_steps, self.inner_step = lam, inner_steps, inner_step

    def gradient(self, params: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        inner = self.plan.repeated(s, self.inner_steps)
        result = local_train(self.theta, self.ctx.oracle(inner), self.inner_step(inner, params))
        self.theta = result.params
        return self.lam * (params - self.theta), torch.from_numpy(result.loss).to(params.device)


class PFedMe(FedAvg):
    """pFedMe. Client k, from the received w: ``local_steps`` or ``local_epochs`` of local steps,
    each on a fresh minibatch: ``inner_steps`` K steps θ̃ ← θ̃ − η_p(∇f(θ̃) + λ(θ̃ − w_local)) from the
    previous θ̃ (w at the first), η_p = ``personal_lr``, λ = ``pfedme_lambda``, then
    w_local ← w_local − ηλ(w_local − θ̃), η = ``lr``. It sends Δ = w − w_local and keeps the last θ̃.
    Weight decay, clipping and gradient noise act on the inner steps; ``lr_decay`` on both kinds;
    the unreliable-agent model's δ_k coins on the steps of w_local. Server: FedAvg's, server_lr
    being pFedMe's β. Personalized evaluation tests each client's θ̃_k (w for a client never
    sampled), after ``eval.personalized_steps`` of plain SGD from it (0: as it is)."""

    Keys = PFedMeKeys
    stateful = True
    personal_models = True

    def adaptation_lr(self) -> float:
        return self.cfg.personal_lr

    def inner_step(self, ctx: ClientContext, plan: StepPlan, anchor: torch.Tensor) -> ClientTransform:
        """An inner step toward the personal model, pulled toward ``anchor`` (the local models w_local)."""
        cfg = self.cfg
        return ctx.transform(plan, cfg.personal_lr, add_proximal(cfg.pfedme_lambda, anchor),
                             weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        w = ctx.start(payloads)
        plan = ctx.plan_from(cfg)
        oracle = MoreauOracle(ctx, plan, w, cfg.pfedme_lambda, cfg.inner_steps,
                              lambda inner, anchor: self.inner_step(ctx, inner, anchor))
        result = local_train(w, oracle, ctx.transform(plan, self.local_lr(), noise=False))
        return ctx.updates(result, w - result.params, states={"personal": oracle.theta})

    def personal_start(self, payloads: list, ctx: ClientContext) -> torch.Tensor:
        """Each client's personal model θ̃_k (w where it has none yet)."""
        return ctx.kept("personal", ctx.start(payloads))

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        """K gradients a local step, on its minibatch: ``inner_steps`` times FedAvg's samples."""
        return self.cfg.inner_steps * self.local_samples(sizes, client_steps)
