"""The Byzantine attack as a server stage: the Byzantine clients' rows of a step's updates are
replaced by what they send (:class:`raysim.system.byzantine.Attack`). Under FedAsync an omniscient
attack sees the last ``window`` honest updates, the stage's state."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from raysim.errors import DivergenceError
from raysim.pipeline.stage import ServerInput, Stage
from raysim.system.byzantine import Attack


class ByzantineAttack(Stage):
    """``byzantine``: [N] the clients' Byzantine flags; ``window``: the honest updates an omniscient
    attack remembers (None: it sees the honest rows of the step itself); ``judges_each_update``: a
    non-finite update sent stops the run (the mean aggregator), with ``advice`` in the message."""

    name = "byzantine_attack"

    def __init__(self, attack: Attack, byzantine: np.ndarray, window: int | None, judges_each_update: bool,
                 advice: str = ""):
        self.attack, self.byzantine, self.window = attack, byzantine, window
        self.judges_each_update, self.advice = judges_each_update, advice

    def init(self) -> dict:
        return {"seen": []}  # the last `window` honest updates (window only)

    def update(self, step: ServerInput, state: dict) -> tuple[ServerInput, dict]:
        updates, seen = step.updates, state["seen"]
        byzantine = self.byzantine[updates.client_ids]
        if byzantine.any():
            watched = torch.stack(seen) if self.window is not None and seen else None
            updates = replace(updates, vector=self.attack(updates.vector, byzantine, step.version, watched))
            bad = updates.first_nonfinite() if self.judges_each_update else None
            if bad is not None:
                raise DivergenceError(
                    f"server step {step.version + 1}: Byzantine client {updates.client_ids[bad]} sent a non-finite "
                    f"update (system.byzantine.attack={self.attack.cfg.attack}) and the mean cannot absorb "
                    f"it{self.advice}")
        if self.window is not None and not byzantine.all():
            honest = updates.vector[torch.from_numpy(np.flatnonzero(~byzantine))]
            seen = (seen + list(honest))[-self.window:]
        return replace(step, updates=updates), {"seen": seen}
