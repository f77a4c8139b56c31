"""The FFGG family of partially personalised FL (Mishchenko et al., "Partially Personalized
Federated Learning: Breaking the Curse of Data Heterogeneity").

Parameters split into global θ and personal w (``model.personal``); w never leaves the
client: updates carry θ entries only. FFGG (Algorithm 1) fine-tunes w and returns the
partial gradient ∇_θ f_m(θ, w); Local FFGG (Algorithm 4) alternates local steps on w and θ
and returns θ_r − θ_loc. Asynchronous FFGG (Algorithm 3) is FFGG under
``execution.mode: async`` with ``aggregation: fedasync``: each update is applied alone.
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms import server_optimizers
from raysim.algorithms.aggregation_rules import weighted_mean
from raysim.algorithms.base import Algorithm
from raysim.algorithms.context import ClientContext
from raysim.algorithms.updates import ClientUpdates, ServerState
from raysim.algorithms.keys import FFGGKeys, LocalFFGGKeys
from raysim.algorithms.local import local_train
from raysim.models.split import init_personal


class FFGG(Algorithm):
    """Fine-tuning Followed by Global Gradient. Client: w from ``model.personal_init`` (or its
    kept w with ``personal_state: stateful``), fine-tuned by ``algorithm.finetuner`` — ``sgd``
    (``local_steps`` steps, or ``local_epochs`` epochs of minibatches; exact gradients on a
    quadratic), ``cg`` (``local_steps`` conjugate-gradient iterations) or ``exact`` (quadratic
    only) — with step γ_w = ``personal_lr`` (null: ``lr``); then Δ = ∇_θ f_m(θ, w) over its
    training data. Server: θ ← θ − γ_θ·Σ p_m Δ_m with γ_θ = ``server_lr`` through
    ``server_optimizer``. With ``lr_unit: inverse_smoothness`` γ_θ is in units of 1/L and γ_w
    of 1/L_w. The diagnostic ``grad_norm_sq`` is ‖Σ p_m Δ_m‖², an estimate of ‖F(θ)‖²."""

    Keys = FFGGKeys
    timing_reads_payload = False
    personalised = True
    server_diagnostics = ("grad_norm_sq",)

    @property
    def stateful(self) -> bool:
        return self.env.model_cfg.personal_state == "stateful"

    def server_lr(self) -> float:
        return self.cfg.server_lr * self.unit("L")

    @property
    def personal_lr(self) -> float:
        return (self.cfg.personal_lr or self.cfg.lr) * self.unit("L_w")

    def start_personal(self, ctx: ClientContext, start: torch.Tensor) -> torch.Tensor:
        """[C, P]: the payload's θ with each client's starting w (kept, or freshly initialised)."""
        model = ctx.model
        fresh = init_personal(model, model.personal, start[0], ctx.rngs, self.env.model_cfg.personal_init).to(start)
        params = start.clone()
        idx = model.personal_index.to(start.device)
        params[:, idx] = fresh[:, idx]
        if self.stateful:
            params[:, idx] = ctx.kept("w", params[:, idx])
        return params

    def finetune(self, ctx: ClientContext, params: torch.Tensor) -> torch.Tensor:
        """Fine-tune the personal entries of ``params`` [C, P] with ``algorithm.finetuner``."""
        if self.cfg.finetuner in ("cg", "exact"):
            return ctx.oracle().solve_personal(params, self.cfg.finetuner, self.cfg.local_steps)
        plan = ctx.plan_from(self.cfg)
        step = ctx.transform(plan, self.personal_lr, weight_decay=self.cfg.weight_decay,
                             max_grad_norm=self.cfg.max_grad_norm, only=ctx.model.personal)
        return local_train(params, ctx.oracle(plan), step).params

    def deployed(self, ctx: ClientContext, start: torch.Tensor) -> torch.Tensor:
        """θ with each client's w as training fine-tunes it (from its start, with the same fine-tuner)."""
        return self.finetune(ctx, self.start_personal(ctx, start))

    def kept_states(self, ctx: ClientContext, params: torch.Tensor) -> dict:
        return {"w": params[:, ctx.model.personal_index.to(params.device)]} if self.stateful else {}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        params = self.finetune(ctx, self.start_personal(ctx, ctx.start(payloads)))
        grads, loss = ctx.oracle().full_gradient(params)
        glob = ctx.model.global_index.to(params.device)
        return ctx.updates(loss, grads[:, glob], states=self.kept_states(ctx, params))

    def server_direction(self, state, aggregate, updates, weights):
        return aggregate, state.extra, {"grad_norm_sq": float(aggregate.square().sum())}

    def adaptation_lr(self) -> float:
        return self.cfg.personal_lr or self.cfg.lr

    def personalize(self, payloads: list, ctx: ClientContext, steps: int, epochs: int, lr: float,
                    adapt_on: str = "train"):
        """Fine-tune w only (from its start, as in training) on each client, then test there."""
        start = self.start_personal(ctx, ctx.start(payloads))
        return self.finetune_and_test(ctx, start, steps, epochs, lr, only=ctx.model.personal, adapt_on=adapt_on)

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        """The fine-tuning steps' samples plus one pass over the training rows (the partial gradient)."""
        return self.local_samples(sizes, client_steps) + sizes


class LocalFFGG(FFGG):
    """Local FFGG (Algorithm 4). After ``pretrain_rounds`` rounds of plain FedAvg on the whole
    model (client lr ``pretrain_lr``), a client fine-tunes w as FFGG does, then alternates, over
    the same number of local steps, a step on w (γ_w) and a step on θ (``lr``) at the new w,
    and sends Δ = θ_r − θ_loc; the server applies Σ p_m Δ_m through ``server_optimizer`` with
    ``server_lr``. ``grad_norm_sq`` is ‖Σ p_m ∇_θ f_m(θ_r, w_m)‖² at the fine-tuned w_m (the FFGG
    direction), an estimate of ‖F(θ_r)‖²."""

    Keys = LocalFFGGKeys
    timing_reads_payload = True  # pre-training rounds do less work

    def server_lr(self) -> float:
        return self.cfg.server_lr

    def init_extra(self, params: torch.Tensor) -> dict:
        return {"round": torch.tensor(0)}

    def pretraining(self, state: ServerState) -> bool:
        return int(state.extra["round"]) < self.cfg.pretrain_rounds

    def payload(self, state: ServerState) -> dict:
        return {"params": state.params, "pretrain": torch.tensor(self.pretraining(state))}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        start = ctx.start(payloads)
        plan = ctx.plan_from(cfg)
        if bool(payloads[0]["pretrain"]):  # FedAvg on the whole model
            step = ctx.transform(plan, cfg.pretrain_lr or cfg.lr, weight_decay=cfg.weight_decay,
                                 max_grad_norm=cfg.max_grad_norm)
            result = local_train(start, ctx.oracle(plan), step)
            return ctx.updates(result, start - result.params)
        params = self.finetune(ctx, self.start_personal(ctx, start))
        glob = ctx.model.global_index.to(ctx.device)
        partial, _ = ctx.oracle().full_gradient(params)
        personal = ctx.model.personal
        w_step = ctx.transform(plan, self.personal_lr, only=personal)
        theta_step = ctx.transform(plan, cfg.lr * self.unit("L"), weight_decay=cfg.weight_decay,
                                   max_grad_norm=cfg.max_grad_norm, only=~personal)
        result = local_train(params, ctx.oracle(plan), w_step, theta_step)
        return ctx.updates(result, (start - result.params)[:, glob], states=self.kept_states(ctx, result.params),
                           diagnostics={"partial_grad": partial[:, glob]})

    def server_rule(self, state: ServerState):
        if self.pretraining(state):
            return None, server_optimizers.sgd(self.cfg.server_lr)
        return super().server_rule(state)

    def server_direction(self, state, aggregate, updates, weights):
        extra = {"round": state.extra["round"] + 1}
        if self.pretraining(state):
            return aggregate, extra, {}
        partial = weighted_mean(updates.diagnostics["partial_grad"], weights)
        return aggregate, extra, {"grad_norm_sq": float(partial.square().sum())}

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        """Pre-training: the local steps' samples; then fine-tuning plus two gradients per
        alternating step."""
        samples = self.local_samples(sizes, client_steps)
        return samples if bool(payload["pretrain"]) else 3 * samples
