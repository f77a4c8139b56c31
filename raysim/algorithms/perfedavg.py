"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020).

The clients look for a shared model that is good after one local gradient step: client i's
objective is F_i(v) = f_i(v − α∇f_i(v)), whose gradient is (I − α∇²f_i(v))·∇f_i(v − α∇f_i(v)).
Each local step estimates it from three independent minibatches S, S′, S″:

    ŵ = v − α·g(v; S),   u = g(ŵ; S′)
    fo:  u
    hvp: u − α·H(v; S″)·u                                   (a Hessian-vector product, double backward)
    hf:  u − α·[g(v + δu; S″) − g(v − δu; S″)] / (2δ)       (Hessian-free: a central difference)

and the client moves v ← v − β·(that estimate) through the one local loop; the server averages
the returned models without weights.
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.base import Algorithm
from raysim.algorithms.context import ClientContext
from raysim.algorithms.updates import ClientUpdates
from raysim.algorithms.keys import PerFedAvgKeys, perfedavg_batches
from raysim.algorithms.local import local_train


class MetaGradientOracle:
    """An oracle (see :mod:`raysim.algorithms.oracles`) whose gradient at local step ``s`` is
    Per-FedAvg's estimate of ∇F_i for ``variant`` (fo, hf or hvp), from the oracles of the three
    batch streams: ``inner`` (S; its plan carries the steps and participation coins), ``outer``
    (S′) and ``curvature`` (S″; None for fo). Its loss is f_i(ŵ; S′), the estimate of F_i(v)."""

    def __init__(self, inner, outer, curvature, alpha: float, variant: str, delta: float):
        self.inner, self.outer, self.curvature = inner, outer, curvature
        self.alpha, self.variant, self.delta = alpha, variant, delta
        self.plan = inner.plan

    def gradient(self, params: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        g, _ = self.inner.gradient(params, s)
        u, loss = self.outer.gradient(params - self.alpha * g, s)
        if self.variant == "fo":
            return u, loss
        if self.variant == "hvp":
            curvature = self.curvature.hvp(params, u, s)
        else:
            plus, _ = self.curvature.gradient(params + self.delta * u, s)
            minus, _ = self.curvature.gradient(params - self.delta * u, s)
            curvature = (plus - minus) / (2 * self.delta)
        return u - self.alpha * curvature, loss


class PerFedAvg(Algorithm):
    """Per-FedAvg: ``local_steps`` τ meta-steps of size ``lr`` β with adaptation step ``inner_lr`` α
    and ``variant`` fo | hf | hvp; batches ``batch_size`` D, ``outer_batch_size`` D′,
    ``hessian_batch_size`` D″. Clients send Δ = θ − v; the server steps θ ← θ − agg(Δ), the
    unweighted mean as in the paper unless ``aggregator`` names a robust rule. Personalized
    evaluation adapts with α by default."""

    Keys = PerFedAvgKeys
    sample_weighted = False
    timing_reads_payload = False

    def adaptation_lr(self) -> float:
        return self.cfg.inner_lr

    def batch_sizes(self) -> list:
        """The batch of each gradient evaluation of a local step (D, D′, then D″ once or twice)."""
        sizes = list(perfedavg_batches(self.cfg).values())
        return sizes + sizes[2:] if self.cfg.variant == "hf" else sizes

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        start = ctx.start(payloads)
        # S, S′ (and S″, which hf evaluates twice): S is drawn first, with the straggler coins
        oracles = [ctx.oracle(ctx.plan(cfg.local_steps, size, coins=i == 0))
                   for i, size in enumerate(perfedavg_batches(cfg).values())]
        inner, outer, *curvature = oracles
        oracle = MetaGradientOracle(inner, outer, curvature[0] if curvature else None, cfg.inner_lr, cfg.variant,
                                    cfg.hessian_delta)
        step = ctx.transform(oracle.plan, self.local_lr(), weight_decay=cfg.weight_decay,
                             max_grad_norm=cfg.max_grad_norm)
        result = local_train(start, oracle, step)
        return ctx.updates(result, start - result.params)

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        """Per local step, the samples of every gradient evaluation (2 for fo, 3 for hvp, counting
        the Hessian-vector product as one, 4 for hf); exact gradients touch every row."""
        steps = self.local_steps_of(sizes, client_steps)
        if self.env.quadratic:
            return steps * sizes * len(self.batch_sizes())
        return steps * sum(np.minimum(b, sizes) for b in self.batch_sizes()).astype(np.float64)
