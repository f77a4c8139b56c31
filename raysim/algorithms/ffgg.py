"""The FFGG family of partially personalised FL (Mishchenko et al., ALGORITHMS.md §3).

Parameters split into global θ and personal w (``model.personal``); w never leaves the
client: updates carry θ entries only. FFGG (Algorithm 1) fine-tunes w and returns the
partial gradient ∇_θ f_m(θ, w); Local FFGG (Algorithm 4) alternates local steps on w and θ
and returns θ_r − θ_loc. Asynchronous FFGG (Algorithm 3) is FFGG under
``execution.mode: async`` with ``aggregation: fedasync``: each update is applied alone.
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdates, finetune_and_test, stack_params, weighted_sum
from raysim.algorithms.gradients import LocalGradients, full_gradient, mean_loss
from raysim.algorithms.local_sgd import local_sgd
from raysim.algorithms.server_optimizer import init_server_optimizer, server_step
from raysim.models.split import init_personal


class FFGG(Algorithm):
    """Fine-tuning Followed by Global Gradient. Client: w from ``model.personal_init`` (or its
    kept w with ``personal_state: stateful``), fine-tuned by ``algorithm.finetuner`` — ``sgd``
    (``local_steps`` steps, or ``local_epochs`` epochs of minibatches; exact gradients on a
    quadratic), ``cg`` (``local_steps`` conjugate-gradient iterations) or ``exact`` (quadratic
    only) — with step γ_w = ``personal_lr`` (null: ``lr``); then Δ = ∇_θ f_m(θ, w) over its
    training data. Server: θ ← θ − γ_θ·Σ p_m Δ_m with γ_θ = ``server_lr`` through
    ``server_optimizer``. With ``lr_unit: inverse_smoothness`` γ_θ is in units of 1/L and γ_w
    of 1/L_w. ``grad_norm_sq`` (‖Σ p_m Δ_m‖², an estimate of ‖F(θ)‖²) is kept in the state."""

    personalised = True

    @property
    def stateful(self) -> bool:
        return self.model_cfg.personal_state == "stateful"

    def init(self, params: torch.Tensor) -> dict:
        return {"params": params.clone(), "grad_norm_sq": torch.tensor(float("nan"), dtype=torch.float64),
                **init_server_optimizer(self.cfg, len(self.model.global_index))}

    def payload(self, state: dict) -> dict:
        return {"params": state["params"]}

    @property
    def personal_lr(self) -> float:
        return (self.cfg.personal_lr or self.cfg.lr) * self.unit("L_w")

    def start_personal(self, ctx: ClientContext, start: torch.Tensor) -> torch.Tensor:
        """[C, P]: the payload's θ with each client's starting w (kept, or freshly initialised)."""
        model = ctx.model
        fresh = init_personal(model, model.personal, start[0], ctx.rngs, self.model_cfg.personal_init).to(start)
        params = start.clone()
        idx = model.personal_index.to(start.device)
        params[:, idx] = fresh[:, idx]
        if self.stateful and ctx.states is not None:
            for c, kept in enumerate(ctx.states):
                if kept is not None:
                    params[c, idx] = kept.to(params)
        return params

    def finetune(self, ctx: ClientContext, params: torch.Tensor) -> torch.Tensor:
        """Fine-tune the personal entries of ``params`` [C, P] with ``algorithm.finetuner``."""
        how, problem = self.cfg.finetuner, ctx.problem
        if problem is not None and how in ("cg", "exact"):
            d = problem.d_theta
            theta = params[:, :d]
            w = (problem.best_w(ctx.client_ids, theta) if how == "exact"
                 else problem.cg_w(ctx.client_ids, theta, params[:, d:], self.cfg.local_steps))
            return torch.cat([theta, w], 1)
        if problem is not None:
            d = problem.d_theta
            return torch.cat([params[:, :d], problem.gd_w(ctx.client_ids, params[:, :d], params[:, d:],
                                                           self.cfg.local_steps, self.personal_lr)], 1)
        final, _ = local_sgd(ctx.model, params, ctx.features, ctx.labels, ctx.schedule(self.cfg), self.personal_lr,
                             self.cfg.weight_decay, ctx.gradient_noise, update_mask=ctx.model.personal)
        return final

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        params = self.finetune(ctx, self.start_personal(ctx, stack_params(payloads, ctx.device)))
        grads, loss = full_gradient(ctx, params)
        return self._updates(ctx, params, loss.double().cpu().numpy(), grads[:, ctx.model.global_index])

    def _updates(self, ctx, params, loss, delta) -> ClientUpdates:
        tensors = {"delta": delta.detach().cpu()}
        if self.stateful:
            tensors["state"] = params[:, ctx.model.personal_index].detach().cpu()
        return ClientUpdates(ctx.client_ids, ctx.train_sizes, loss, tensors)

    def aggregate(self, state: dict, updates: ClientUpdates, weights: np.ndarray) -> dict:
        mean_delta = weighted_sum(updates.tensors["delta"], weights)
        return {**state, **self._apply_global(state, mean_delta, self.cfg.server_lr * self.unit("L")),
                "grad_norm_sq": mean_delta.square().sum()}

    def _apply_global(self, state: dict, mean_delta: torch.Tensor, lr: float) -> dict:
        """θ entries moved by the server optimiser; the personal entries of the server copy stay."""
        opt = {k: v for k, v in state.items() if k.startswith("adam_")}
        step, opt = server_step(self.cfg, opt, mean_delta, lr)
        params = state["params"].double().clone()
        params[self.model.global_index] -= step
        return {"params": params.to(state["params"].dtype), **opt}

    def personalize(self, payloads: list, ctx: ClientContext, steps: int, epochs: int, lr: float):
        """Fine-tune w only (from its start, as in training) on each client, then test there."""
        start = self.start_personal(ctx, stack_params(payloads, ctx.device))
        return finetune_and_test(ctx, self._finetune_schedule(ctx, steps, epochs), start, lr,
                                 self.cfg.weight_decay, update_mask=ctx.model.personal)


class LocalFFGG(FFGG):
    """Local FFGG (Algorithm 4). After ``pretrain_rounds`` rounds of plain FedAvg on the whole
    model (client lr ``pretrain_lr``), a client fine-tunes w as FFGG does, then alternates, over
    the same number of local steps, a step on w (γ_w) and a step on θ (``lr``) at the new w,
    and sends Δ = θ_r − θ_loc; the server applies Σ p_m Δ_m through ``server_optimizer`` with
    ``server_lr``. ``grad_norm_sq`` is ‖Σ p_m ∇_θ f_m(θ_r, w_m)‖² at the fine-tuned w_m (the FFGG
    direction), an estimate of ‖F(θ_r)‖²."""

    def init(self, params: torch.Tensor) -> dict:
        return {**super().init(params), "round": torch.tensor(0)}

    def payload(self, state: dict) -> dict:
        return {"params": state["params"], "pretrain": torch.tensor(int(state["round"]) < self.cfg.pretrain_rounds)}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        start = stack_params(payloads, ctx.device)
        if bool(payloads[0]["pretrain"]):
            final, loss = local_sgd(ctx.model, start, ctx.features, ctx.labels, ctx.schedule(cfg),
                                    cfg.pretrain_lr or cfg.lr, cfg.weight_decay, ctx.gradient_noise)
            return ClientUpdates(ctx.client_ids, ctx.train_sizes, loss.cpu().numpy(),
                                 {"model_delta": (start - final).cpu()})
        params = self.finetune(ctx, self.start_personal(ctx, start))
        glob = ctx.model.global_index.to(ctx.device)
        partial, _ = full_gradient(ctx, params)
        personal = ctx.model.personal.to(params)
        grads, losses = LocalGradients(ctx, cfg), []
        lr = cfg.lr * self.unit("L")
        for s in range(grads.num_steps):
            g, loss, scale = grads.at(params, s)
            params = params - (self.personal_lr * scale)[:, None] * g * personal
            g, _, scale = grads.at(params, s)
            params = params - (lr * scale)[:, None] * (g + cfg.weight_decay * params) * (1 - personal)
            losses.append(loss)
        updates = self._updates(ctx, params, mean_loss(losses), (start - params)[:, glob])
        updates.tensors["partial_grad"] = partial[:, glob].detach().cpu()
        return updates

    def aggregate(self, state: dict, updates: ClientUpdates, weights: np.ndarray) -> dict:
        step = state["round"] + 1
        if "model_delta" in updates.tensors:  # FedAvg pre-training
            params = state["params"].double() - self.cfg.server_lr * weighted_sum(updates.tensors["model_delta"], weights)
            return {**state, "params": params.to(state["params"].dtype), "round": step}
        mean_delta = weighted_sum(updates.tensors["delta"], weights)
        return {**state, **self._apply_global(state, mean_delta, self.cfg.server_lr), "round": step,
                "grad_norm_sq": weighted_sum(updates.tensors["partial_grad"], weights).square().sum()}
