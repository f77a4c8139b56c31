"""Client momentum (``algorithm.client_momentum`` β): each client sends m_i ← (1 − β)·u_i + β·m_i,
the running average of its updates, kept per client in the stage's state."""

from __future__ import annotations

from dataclasses import replace

import torch

from raysim.pipeline import per_client
from raysim.pipeline.stage import ServerInput, Stage


class ClientMomentum(Stage):
    """State ``{"vectors": each client's momentum}`` (a :mod:`.per_client` tree over ``num_clients``
    clients: a step costs its clients, not all of them); rows are taken one by one, as a FedBuff
    buffer may hold two updates of one client."""

    name = "client_momentum"

    def __init__(self, beta: float, num_clients: int):
        self.beta, self.levels = beta, per_client.levels_for(num_clients)

    def init(self) -> dict:
        return {"vectors": {}}

    def update(self, step: ServerInput, state: dict) -> tuple[ServerInput, dict]:
        beta, vectors, moved = self.beta, state["vectors"], {}
        sent = []
        for i, c in enumerate(step.updates.client_ids.tolist()):
            previous = moved[c] if c in moved else per_client.value_of(vectors, c, self.levels)
            m = (1 - beta) * step.updates.vector[i]
            if previous is not None:
                m += beta * previous
            moved[c] = m
            sent.append(m)
        return (replace(step, updates=replace(step.updates, vector=torch.stack(sent))),
                {"vectors": per_client.updated(vectors, moved, self.levels)})
