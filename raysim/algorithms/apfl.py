"""APFL (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", 2020).

The global model w is trained by FedAvg; beside it each client k keeps a local model v_k and a
mixing weight α_k, and its personalized model is the mixture v̄_k = α_k·v_k + (1 − α_k)·w. At
each local step, on one minibatch and from the values before the step:

    w ← w − η·∇f(w)
    v ← v − η·α·∇f(v̄)                       (∇_v f(v̄), by the chain rule)
    α ← clip[0,1](α − η_α·⟨v − w, ∇f(v̄)⟩)     (∇_α f(v̄); α fixed with adaptive_alpha false)

v_k and α_k start as the received w and ``apfl_alpha`` at the client's first visit and stay on
the client (its kept state ``personal`` and ``alpha``); only the FedAvg update of w is sent.
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.context import ClientContext
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import APFLKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.transforms import ClientTransform
from raysim.algorithms.updates import ClientUpdates


def split(stacked: torch.Tensor, size: int) -> tuple:
    """(w, v, α) of the stacked [C, 2·size + 1] rows [w, v, α]."""
    return stacked[:, :size], stacked[:, size:2 * size], stacked[:, 2 * size:]


class MixtureOracle:
    """An oracle (see :mod:`raysim.algorithms.oracles`) of the stacked [w, v, α] whose gradient at
    local step ``s`` is (∇f(w), α·∇f(v̄), ⟨v − w, ∇f(v̄)⟩), v̄ = α·v + (1 − α)·w, both gradients on
    step s's minibatch of ``oracle`` (the last part 0 unless ``adaptive``); its loss is f(w)'s."""

    def __init__(self, oracle, size: int, adaptive: bool):
        self.oracle, self.size, self.adaptive = oracle, size, adaptive
        self.plan = oracle.plan

    def gradient(self, params: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        w, v, alpha = split(params, self.size)
        g_w, loss = self.oracle.gradient(w.contiguous(), s)  # FedAvg's gradient, to the bit
        g_mixed, _ = self.oracle.gradient(alpha * v + (1 - alpha) * w, s)
        g_alpha = ((v - w) * g_mixed).sum(1, keepdim=True) if self.adaptive else torch.zeros_like(alpha)
        return torch.cat([g_w, alpha * g_mixed, g_alpha], 1), loss


def mixture_step(size: int, w_step: ClientTransform, v_step: ClientTransform,
                 alpha_step: ClientTransform) -> ClientTransform:
    """The step of the stacked [w, v, α]: each part through its own chain, α kept in [0, 1]."""
    steps = (w_step, v_step, alpha_step)

    def init(params):
        return tuple(t.init(p) for t, p in zip(steps, split(params, size)))

    def update(grads, state, params):
        moved = [t.update(g, s, p) for t, g, s, p in zip(steps, split(grads, size), state, split(params, size))]
        (u_w, s_w), (u_v, s_v), (u_alpha, s_alpha) = moved
        alpha = split(params, size)[2]
        u_alpha = alpha - (alpha - u_alpha).clamp(0.0, 1.0)
        return torch.cat([u_w, u_v, u_alpha], 1), (s_w, s_v, s_alpha)

    return ClientTransform(init, update)


class APFL(FedAvg):
    """APFL. Client k, from the received w and its kept v_k and α_k (w and ``apfl_alpha`` on a first
    visit): ``local_steps`` or ``local_epochs`` of the joint step on each minibatch,
    w ← w − η∇f(w), v ← v − ηα∇f(v̄), α ← clip[0,1](α − η_α⟨v − w, ∇f(v̄)⟩), v̄ = αv + (1 − α)w,
    η = ``lr``, η_α = ``alpha_lr`` (null: ``lr``; α fixed with ``adaptive_alpha`` false). It sends
    Δ = w − w_k, FedAvg's update to the bit, and keeps v_k and α_k. Weight decay, clipping and
    gradient noise act on the steps of w and v; ``lr_decay`` and the unreliable-agent model's δ_k
    coins on all three. Server: FedAvg's, with any aggregator and server optimizer. Personalized
    evaluation tests each client's mixture α_k·v_k + (1 − α_k)·w with the current w (w for a client
    never sampled), after ``eval.personalized_steps`` of plain SGD from it (0: as it is)."""

    Keys = APFLKeys
    stateful = True
    personal_models = True
    client_diagnostics = ("apfl_alpha",)

    @property
    def alpha_lr(self) -> float:
        return self.cfg.alpha_lr or self.cfg.lr

    def kept(self, payloads: list, ctx: ClientContext) -> tuple:
        """(w [C, P], each client's v_k [C, P] and α_k [C, 1]): w and ``apfl_alpha`` where it has none yet."""
        w = ctx.start(payloads)
        first = torch.full((len(w), 1), float(self.cfg.apfl_alpha), dtype=w.dtype, device=w.device)
        return w, ctx.kept("personal", w), ctx.kept("alpha", first)

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        w, v, alpha = self.kept(payloads, ctx)
        size = w.shape[1]
        plan = ctx.plan_from(cfg)
        model_steps = [ctx.transform(plan, self.local_lr(), weight_decay=cfg.weight_decay,
                                     max_grad_norm=cfg.max_grad_norm) for _ in range(2)]
        step = mixture_step(size, *model_steps, ctx.transform(plan, self.alpha_lr, noise=False))
        oracle = MixtureOracle(ctx.oracle(plan), size, cfg.adaptive_alpha)
        result = local_train(torch.cat([w, v, alpha], 1), oracle, step)
        w_k, v_k, alpha_k = split(result.params, size)
        alpha_k = alpha_k.clamp(0.0, 1.0)
        return ctx.updates(result, w - w_k, states={"personal": v_k, "alpha": alpha_k},
                           diagnostics={"apfl_alpha": alpha_k})

    def personal_start(self, payloads: list, ctx: ClientContext) -> torch.Tensor:
        """Each client's mixture α_k·v_k + (1 − α_k)·w with the w it receives now."""
        w, v, alpha = self.kept(payloads, ctx)
        return alpha * v + (1 - alpha) * w

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        """Two gradients a local step, at w and at v̄, on the same minibatch: twice FedAvg's samples."""
        return 2 * self.local_samples(sizes, client_steps)
