"""Local-only training, the reference point without federation: each client trains a model of its
own on its own rows and never communicates."""

from __future__ import annotations

import torch

from raysim.algorithms.base import Algorithm
from raysim.algorithms.context import ClientContext
from raysim.algorithms.keys import LocalOnlyKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.updates import ClientUpdates

NOTHING = torch.zeros(0, dtype=torch.long)


class LocalOnly(Algorithm):
    """Local-only training. Each sampled client continues training its own model v_k (kept state
    ``model``; the initial model, the same for every client, on its first visit) for ``local_steps``
    or ``local_epochs`` of minibatch SGD at ``lr``. It sends an update of no entries (0 bytes up);
    the server's model stays the initial one, and is what the payload carries (a client uses it on
    its first visit only). Personalized evaluation tests each client's v_k (the initial model for
    a client never sampled)."""

    Keys = LocalOnlyKeys
    stateful = True
    personal_models = True

    @property
    def update_index(self) -> torch.Tensor:
        return NOTHING

    def personal_start(self, payloads: list, ctx: ClientContext) -> torch.Tensor:
        """[C, P]: each client's kept model, or the model it receives (the initial one) on its first visit."""
        return ctx.kept("model", ctx.start(payloads))

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        plan = ctx.plan_from(cfg)
        step = ctx.transform(plan, self.local_lr(), weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)
        result = local_train(self.personal_start(payloads, ctx), ctx.oracle(plan), step)
        return ctx.updates(result, result.params[:, :0], states={"model": result.params})

