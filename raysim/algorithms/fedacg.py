"""FedACG (Kim et al., "Communication-Efficient Federated Learning with Accelerated Client
Gradient", CVPR 2024): server momentum, a lookahead broadcast and a proximal pull toward it."""

from __future__ import annotations

from raysim.algorithms import server_optimizers
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import FedACGKeys


class FedACG(FedAvg):
    """The server keeps θ and a momentum m (zero at first) and broadcasts the lookahead
    Φ = θ − server_lr·λ·m (λ = ``acg_lambda``; with ``acg_lookahead: false`` it sends θ).
    A client runs local SGD from Φ on its loss plus (β/2)‖v − Φ‖² (β = ``acg_beta``) and sends
    Δ = Φ − v. The server averages the Δ_k into g, then m ← λ·m + g and θ ← θ − server_lr·m,
    so that with server_lr = 1 the new model is Φ − g. (Signs: the paper's m is our −m, its
    Δ our −Δ.) λ = 0 is FedProx, β = 0 momentum with an accelerated start, both 0 FedAvg."""

    Keys = FedACGKeys
    timing_reads_payload = False  # the look-ahead moves the parameters, not the payload's sizes

    def make_server_optimizer(self) -> server_optimizers.ServerOptimizer:
        return server_optimizers.momentum(self.cfg.server_lr, self.cfg.acg_lambda)

    def proximal(self) -> float:
        return self.cfg.acg_beta

    def payload(self, state) -> dict:
        cfg = self.cfg
        if not cfg.acg_lookahead or cfg.acg_lambda == 0:
            return {"params": state.params}
        ahead = state.params.double() - cfg.server_lr * cfg.acg_lambda * state.opt["m"]
        return {"params": ahead.to(state.params.dtype)}
