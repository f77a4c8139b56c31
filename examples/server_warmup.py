"""FedAvg whose server step grows linearly over its first rounds: an example of an algorithm that
keeps its own server-side state (``init_extra`` and ``state.extra``), saved and restored with every
checkpoint."""

from dataclasses import dataclass

import torch

from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.keys import FedAvgKeys
from raysim.schema import key, positive_int


@dataclass
class WarmupKeys(FedAvgKeys):
    warmup_steps: int = key(5, "server steps over which the server step grows to its full size",
                            check=positive_int)


class FedAvgWarmup(FedAvg):
    Keys = WarmupKeys
    server_diagnostics = ("warmup",)

    def init_extra(self, params):
        return {"steps": torch.zeros((), dtype=torch.int64)}  # tensors and numbers only

    def server_direction(self, state, aggregate, updates, weights):
        taken = state.extra["steps"]
        factor = min(1.0, (int(taken) + 1) / self.cfg.warmup_steps)
        return factor * aggregate, {"steps": taken + 1}, {"warmup": factor}  # a new dict, never edited in place
