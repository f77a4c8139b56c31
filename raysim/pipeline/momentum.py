"""Client momentum (``algorithm.client_momentum`` β): each client sends m_i ← (1 − β)·u_i + β·m_i,
the running average of its updates, kept per client in the stage's state."""

from __future__ import annotations

from dataclasses import replace

import torch

from raysim.pipeline.stage import ServerInput, Stage


class ClientMomentum(Stage):
    """State ``{"vectors": {client id: its momentum}}``; rows are taken one by one, as a FedBuff
    buffer may hold two updates of one client."""

    name = "client_momentum"

    def __init__(self, beta: float):
        self.beta = beta

    def init(self) -> dict:
        return {"vectors": {}}

    def update(self, step: ServerInput, state: dict) -> tuple[ServerInput, dict]:
        beta, vectors, sent = self.beta, dict(state["vectors"]), []
        for i, c in enumerate(step.updates.client_ids.tolist()):
            moved = (1 - beta) * step.updates.vector[i]
            if c in vectors:
                moved += beta * vectors[c]
            vectors[c] = moved
            sent.append(moved)
        return replace(step, updates=replace(step.updates, vector=torch.stack(sent))), {"vectors": vectors}
