"""L2GD (Hanzely & Richtárik, "Federated Learning of a Mixture of Global and Local Models",
2020), the fully personalised baseline of the FFGG paper's comparison: each client keeps its
own model x_m."""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.base import Algorithm
from raysim.algorithms.context import ClientContext
from raysim.algorithms.updates import ClientUpdates, ServerState
from raysim.algorithms.keys import L2GDKeys
from raysim.algorithms.local import local_train
from raysim.streams import Purpose, stream


class L2GD(Algorithm):
    """Loopless local GD on Σ f_m(x_m) + (λ/2)Σ‖x_m − x̄‖² (λ = ``penalty``). Every iteration a
    shared coin picks, with probability p (``average_prob``, null: 1/``local_steps``), an
    averaging step x_m ← x_m − (αλ/(Mp))(x_m − x̄) and otherwise a local step
    x_m ← x_m − (α/(M(1−p)))∇f_m(x_m). A communication round is a run of averaging steps
    followed by a run of local steps (run lengths drawn per round from the seed); clients send
    x_m, the server averages them into x̄. α = ``lr`` (with ``lr_unit: inverse_smoothness``, in
    units of the paper's 1/(2𝓛), 𝓛 = max{L_f/(1−p), λ/p}/M). Needs full participation."""

    Keys = L2GDKeys
    stateful = True
    timing_reads_payload = True  # each round's local steps come with the payload

    @property
    def p(self) -> float:
        return self.cfg.average_prob or 1.0 / self.cfg.local_steps

    def steps(self) -> tuple[float, float]:
        """(local step size, averaging weight)."""
        p, lam, m = self.p, self.cfg.penalty, self.env.num_clients
        alpha = self.cfg.lr
        if self.cfg.lr_unit != "absolute":
            alpha *= m / (2 * max(self.env.problem.smoothness()["L_f"] / (1 - p), lam / p))
        return alpha / (m * (1 - p)), alpha * lam / (m * p)

    def init_extra(self, params: torch.Tensor) -> dict:
        return {"round": torch.tensor(0)}

    def payload(self, state: ServerState) -> dict:
        coins = stream(self.env.seed, Purpose.L2GD_COINS, int(state.extra["round"]))
        return {"params": state.params, "averagings": torch.tensor(int(coins.geometric(1 - self.p))),
                "local_steps": torch.tensor(int(coins.geometric(self.p)))}

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        mean = ctx.start(payloads)
        lr, weight = self.steps()
        x = ctx.kept("model", mean)
        x = mean + (1 - weight) ** int(payloads[0]["averagings"]) * (x - mean)
        plan = ctx.plan(int(payloads[0]["local_steps"]), self.cfg.batch_size)
        result = local_train(x, ctx.oracle(plan), ctx.transform(plan, lr, weight_decay=self.cfg.weight_decay,
                                                                max_grad_norm=self.cfg.max_grad_norm))
        return ctx.updates(result, result.params, states={"model": result.params})

    def server_apply(self, state: ServerState, aggregate: torch.Tensor, aggregation: dict, updates: ClientUpdates,
                     weights: np.ndarray) -> ServerState:
        """x̄ ← the aggregate: the weighted mean of the clients' models (no server optimizer)."""
        return ServerState(aggregate.to(state.params.dtype), state.opt, {"round": state.extra["round"] + 1}, {},
                           aggregation)

    def client_models(self, state: ServerState, client_states: dict):
        return torch.stack([client_states[m]["model"] if m in client_states else state.params
                            for m in range(self.env.num_clients)])

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        steps = np.where(client_steps > 0, client_steps, int(payload["local_steps"]))
        per_step = sizes if self.env.quadratic else np.minimum(self.cfg.batch_size, sizes)
        return (steps * per_step).astype(np.float64)
