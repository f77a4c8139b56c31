"""FedAvg and the methods that are FedAvg with one part changed: FedProx (a proximal term) and
FedAvgM, FedAdam, FedYogi, FedAdagrad (a server optimizer, ``algorithm.server_optimizer``)."""

from __future__ import annotations

from raysim.algorithms.base import Algorithm
from raysim.algorithms.context import ClientContext
from raysim.algorithms.updates import ClientUpdates
from raysim.algorithms.keys import FedAdagradKeys, FedAdamKeys, FedAvgKeys, FedAvgMKeys, FedProxKeys, FedYogiKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.transforms import add_proximal


class FedAvg(Algorithm):
    """FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
    Data", 2017). Clients run ``local_epochs`` (or ``local_steps``) of minibatch SGD from the model
    θ they receive and send Δ = θ − θ_k; the server averages the Δ_k with weights w_k (a round's
    sample shares; FedAsync: the staleness weight; FedBuff: s(τ_k)/K) and steps with its
    optimizer: θ ← θ − server_lr·Σ w_k Δ_k for ``sgd``."""

    Keys = FedAvgKeys
    full_batch = False  # local steps on every training row (Local GD) instead of minibatches

    def proximal(self) -> float:
        """μ of the proximal term toward the received model (0: none)."""
        return 0.0

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        start = ctx.start(payloads)
        plan = ctx.plan_from(cfg, full_batch=self.full_batch)
        terms = [add_proximal(self.proximal(), start)] if self.proximal() else []
        step = ctx.transform(plan, self.local_lr(), *terms, weight_decay=cfg.weight_decay,
                             max_grad_norm=cfg.max_grad_norm)
        result = local_train(start, ctx.oracle(plan), step)
        return ctx.updates(result, start - result.params)


class FedProx(FedAvg):
    """FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", 2020): FedAvg whose
    clients minimise their loss plus (μ/2)‖v − θ‖², μ = ``prox_mu``."""

    Keys = FedProxKeys

    def proximal(self) -> float:
        return self.cfg.prox_mu


class FedAvgM(FedAvg):
    """FedAvgM (Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for
    Federated Visual Classification", 2019): FedAvg with server momentum m ← β·m + Δ,
    θ ← θ − server_lr·m (β = ``server_momentum``; ``server_nesterov`` for Nesterov's step)."""

    Keys = FedAvgMKeys


class FedAdam(FedAvg):
    """FedAdam (Reddi et al., "Adaptive Federated Optimization", 2021): FedAvg with the Adam
    server optimizer (``server_betas``, τ = ``server_eps``, ``server_lr`` η)."""

    Keys = FedAdamKeys


class FedYogi(FedAvg):
    """FedYogi (Reddi et al. 2021): FedAvg with the Yogi server optimizer."""

    Keys = FedYogiKeys


class FedAdagrad(FedAvg):
    """FedAdagrad (Reddi et al. 2021): FedAvg with the Adagrad server optimizer."""

    Keys = FedAdagradKeys
