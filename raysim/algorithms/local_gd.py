"""Local GD (Khaled et al., "Tighter Theory for Local SGD on Identical and Heterogeneous Data",
2020): FedAvg with full-batch gradient steps, the non-personalised baseline of the FFGG
paper's comparison."""

from __future__ import annotations

import numpy as np

from raysim.algorithms.base import ClientContext, ClientUpdates
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import LocalGDKeys
from raysim.algorithms.local import local_train


class LocalGD(FedAvg):
    """Clients take ``local_steps`` full-batch gradient steps of size ``lr`` (with ``lr_unit:
    inverse_smoothness``: in units of 1/(L_f·τ), the paper's 1/(L_f τ) at lr = 1) on the shared
    model; the server averages as FedAvg does."""

    Keys = LocalGDKeys

    def local_lr(self) -> float:
        return self.cfg.lr * self.unit("L_f") / (1 if self.unit("L_f") == 1.0 else self.cfg.local_steps)

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        cfg = self.cfg
        start = ctx.start(payloads)
        plan = ctx.plan_from(cfg, full_batch=True)
        result = local_train(start, ctx.oracle(plan), ctx.transform(plan, self.local_lr(), weight_decay=cfg.weight_decay,
                                                                    max_grad_norm=cfg.max_grad_norm))
        return ctx.updates(result, start - result.params)

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        return self.local_samples(sizes, client_steps, full_batch=True)
