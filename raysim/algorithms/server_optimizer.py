"""Server optimisers applied to the aggregated client update Δ (a pseudo-gradient):
``sgd`` (θ ← θ − η·Δ) and ``adam`` (FedAdam, Reddi et al. 2021: no bias correction)."""

from __future__ import annotations

import torch


def init_server_optimizer(cfg, size: int) -> dict:
    """Server-optimiser state for ``size`` parameters (Adam's moments, float64)."""
    if cfg.server_optimizer == "adam":
        return {"adam_m": torch.zeros(size, dtype=torch.float64), "adam_v": torch.zeros(size, dtype=torch.float64)}
    return {}


def server_step(cfg, state: dict, delta: torch.Tensor, lr: float) -> tuple[torch.Tensor, dict]:
    """(step to subtract from the parameters, new optimiser state) for the float64 update ``delta``."""
    if cfg.server_optimizer == "adam":
        beta1, beta2 = cfg.server_betas
        m = beta1 * state["adam_m"] + (1 - beta1) * delta
        v = beta2 * state["adam_v"] + (1 - beta2) * delta * delta
        return lr * m / (v.sqrt() + cfg.server_eps), {"adam_m": m, "adam_v": v}
    return lr * delta, {}
