"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021).

The global model w is trained by FedAvg; beside it each client k keeps a personal model v_k, a
whole model, that minimises its own loss plus a pull toward the global one:

    v_k ← v_k − η_p·(∇F_k(v_k) + λ(v_k − w))

for the personal steps of each visit, w being the model the client received. v_k starts as w
at the client's first visit and stays on the client (its kept state ``personal``); only the
FedAvg update of w is sent. Personalized evaluation tests each client's v_k.
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.context import ClientContext
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import DittoKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.oracles import StepPlan
from raysim.algorithms.transforms import add_proximal
from raysim.algorithms.updates import ClientUpdates


class Ditto(FedAvg):
    """Ditto. Client k: the FedAvg update of the received w (``local_steps`` or ``local_epochs``
    of minibatch SGD at ``lr``, sent as Δ = w − w_k); then, from its kept v_k (w on a first
    visit), ``personal_steps`` steps (null: as many as the FedAvg update) of
    v ← v − η_p(∇F_k(v) + λ(v − w)) on fresh minibatches, η_p = ``personal_lr`` (null: ``lr``),
    λ = ``ditto_lambda``; it keeps the new v_k. Weight decay, clipping, gradient noise and
    ``lr_decay`` act on both kinds of step; the unreliable-agent model's δ_k coins on the FedAvg
    update only (the one sent). Server: FedAvg's, with any aggregator and server optimizer.
    Personalized evaluation tests each client's v_k (w for a client never sampled), after
    ``eval.personalized_steps`` of plain SGD from it (0: as it is)."""

    Keys = DittoKeys
    stateful = True
    personal_models = True

    @property
    def personal_lr(self) -> float:
        return self.cfg.personal_lr or self.cfg.lr

    def adaptation_lr(self) -> float:
        return self.personal_lr

    def personal_plan(self, ctx: ClientContext) -> StepPlan:
        """The personal steps' minibatches, drawn after the FedAvg update's from the same streams."""
        cfg = self.cfg
        steps = cfg.personal_steps if cfg.personal_steps is not None else cfg.local_steps
        return ctx.plan(steps, cfg.batch_size, cfg.local_epochs, coins=False)

    def personal_step(self, ctx: ClientContext, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """[C, P]: the personal models ``v`` after this visit's personal steps toward ``w`` [C, P]."""
        cfg = self.cfg
        plan = self.personal_plan(ctx)
        terms = [add_proximal(cfg.ditto_lambda, w)] if cfg.ditto_lambda else []
        step = ctx.transform(plan, self.personal_lr, *terms, weight_decay=cfg.weight_decay,
                             max_grad_norm=cfg.max_grad_norm)
        return local_train(v, ctx.oracle(plan), step).params

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        updates = super().client_update(payloads, ctx)  # FedAvg's update of w, its steps drawn first
        w = ctx.start(payloads)
        v = self.personal_step(ctx, ctx.kept("personal", w), w)
        updates.states = {"personal": v.detach().cpu()}
        return updates

    def personal_start(self, payloads: list, ctx: ClientContext) -> torch.Tensor:
        """Each client's personal model (w where it has none yet)."""
        return ctx.kept("personal", ctx.start(payloads))

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        """The FedAvg update's samples plus the personal steps' (as many, unless ``personal_steps`` is set)."""
        shared = self.local_samples(sizes, client_steps)
        if self.cfg.personal_steps is None:
            return 2 * shared
        steps = np.where(client_steps > 0, client_steps, self.cfg.personal_steps)
        return shared + (steps * np.minimum(self.cfg.batch_size, sizes)).astype(np.float64)
