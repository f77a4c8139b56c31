"""Local GD (Khaled et al., "Tighter Theory for Local SGD on Identical and Heterogeneous Data",
2020): FedAvg with full-batch gradient steps, the non-personalised baseline of the FFGG
paper's comparison."""

from __future__ import annotations

import numpy as np

from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import LocalGDKeys


def local_step_size(algorithm) -> float:
    """``lr``, or with ``lr_unit: inverse_smoothness`` lr/(L_f·τ), τ = ``local_steps`` (the paper's
    1/(L_f τ) at lr = 1): the local step of Local GD and SCAFFOLD."""
    cfg = algorithm.cfg
    return cfg.lr if cfg.lr_unit == "absolute" else cfg.lr * algorithm.unit("L_f") / cfg.local_steps


class LocalGD(FedAvg):
    """Clients take ``local_steps`` full-batch gradient steps (:func:`local_step_size`) on the
    shared model; the server averages as FedAvg does."""

    Keys = LocalGDKeys
    full_batch = True
    timing_reads_payload = False

    def local_lr(self) -> float:
        return local_step_size(self)

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        return self.local_samples(sizes, client_steps, full_batch=True)
