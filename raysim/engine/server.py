"""The server: its state, the states of its pipeline's stages, and the step that moves them
(:class:`raysim.pipeline.server.ServerPipeline`)."""

from __future__ import annotations

import numpy as np

from raysim.algorithms import ServerState


class Server:
    """``state``: the ServerState; ``stage_states``: {stage name: state} of ``pipeline``'s stages."""

    def __init__(self, pipeline, state: ServerState):
        self.pipeline, self.state, self.stage_states = pipeline, state, pipeline.init()

    def payload(self) -> dict:
        """What clients receive now: the algorithm's payload of the server state, its model as the
        downlink encodes it, and what the pipeline's stages broadcast (adaptive clipping's clip norm)."""
        return self.pipeline.broadcast(self.pipeline.algorithm.payload(self.state), self.stage_states)

    def step(self, updates, weights: np.ndarray, version: int) -> None:
        """Take a server step from model ``version`` on ``updates`` (a round or a FedBuff buffer,
        client-id order) with ``weights``."""
        self.state, self.stage_states = self.pipeline.step(self.state, self.stage_states, updates, weights, version)

    def steps(self, steps: list, version: int) -> list:
        """The server states after each of ``steps`` ((updates, weights) pairs, a window's FedAsync
        steps) taken in a row from model ``version``; the stages' states move on, and the server
        state is each one in turn as the caller :meth:`adopt` s it."""
        states, self.stage_states = self.pipeline.steps(self.state, self.stage_states, steps, version)
        return states

    def adopt(self, state: ServerState) -> None:
        """Make ``state`` (one of :meth:`steps`) the server's state."""
        self.state = state

    def restore(self, state: ServerState, stage_states: dict) -> None:
        """Continue from a run state's server state and stage states."""
        self.state, self.stage_states = state, dict(stage_states)
