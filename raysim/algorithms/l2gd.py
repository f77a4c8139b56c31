"""L2GD (Hanzely & Richtárik 2020), the fully personalised baseline of the FFGG paper's
comparison (ALGORITHMS.md §5.3 Exp B, §6 item 18): each client keeps its own model x_m."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from raysim.algorithms.base import Algorithm, ClientContext, ClientUpdates, stack_params, weighted_sum
from raysim.algorithms.local_gd import local_steps
from raysim.engine import rng


class L2GD(Algorithm):
    """Loopless local GD on Σ f_m(x_m) + (λ/2)Σ‖x_m − x̄‖² (λ = ``penalty``). Every iteration a
    shared coin picks, with probability p (``average_prob``, null: 1/``local_steps``), an
    averaging step x_m ← x_m − (αλ/(Mp))(x_m − x̄) and otherwise a local step
    x_m ← x_m − (α/(M(1−p)))∇f_m(x_m). A communication round is a run of averaging steps
    followed by a run of local steps (run lengths drawn per round from the seed); clients send
    x_m, the server averages them into x̄. α = ``lr`` (with ``lr_unit: inverse_smoothness``, in
    units of the paper's 1/(2𝓛), 𝓛 = max{L_f/(1−p), λ/p}/M). Needs full participation."""

    stateful = True

    @property
    def p(self) -> float:
        return self.cfg.average_prob or 1.0 / self.cfg.local_steps

    def steps(self) -> tuple[float, float]:
        """(local step size, averaging weight)."""
        p, lam, m = self.p, self.cfg.penalty, self.num_clients
        alpha = self.cfg.lr
        if self.cfg.lr_unit != "absolute":
            alpha *= m / (2 * max(self.problem.smoothness()["L_f"] / (1 - p), lam / p))
        return alpha / (m * (1 - p)), alpha * lam / (m * p)

    def init(self, params: torch.Tensor) -> dict:
        return {"params": params.clone(), "round": torch.tensor(0)}

    def payload(self, state: dict) -> dict:
        coins = rng.stream(self.seed, rng.L2GD_COINS, int(state["round"]))
        return {"params": state["params"], "averagings": torch.tensor(int(coins.geometric(1 - self.p))),
                "local_steps": torch.tensor(int(coins.geometric(self.p)))}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        mean = stack_params(payloads, ctx.device)
        x = torch.stack([mean[c] if s is None else s.to(mean) for c, s in enumerate(ctx.states or [None] * len(mean))])
        lr, weight = self.steps()
        x = mean + (1 - weight) ** int(payloads[0]["averagings"]) * (x - mean)
        x, loss, _ = local_steps(ctx, replace(self.cfg, local_steps=int(payloads[0]["local_steps"])), x, lr)
        return ClientUpdates(ctx.client_ids, ctx.train_sizes, loss, {"model": x.cpu(), "state": x.cpu()})

    def aggregate(self, state: dict, updates: ClientUpdates, weights: np.ndarray) -> dict:
        mean = weighted_sum(updates.tensors["model"], weights).to(state["params"].dtype)
        return {"params": mean, "round": state["round"] + 1}

    def client_models(self, state: dict, client_state: dict):
        return torch.stack([client_state.get(m, state["params"]) for m in range(self.num_clients)])

