"""The contract of a pipeline stage: a pure ``(init, update)`` pair, as optax's transforms are.

A server step has two kinds of stage: update stages (:class:`Stage`) act on the step's updates
before aggregation; aggregate stages (:class:`AggregateStage`) act on the aggregate, after the
algorithm's aggregation rule and before its server optimizer. ``init()`` gives the stage's state;
``update(x, state)`` gives ``x`` (the step, or its aggregate) as the stage passes it on and the
stage's new state, and never changes either argument in place. The state is plain
content (tensors, numbers, lists, dicts; per-client state as a :mod:`.per_client` tree), so the run
state saves and loads it whole. A stage that draws numbers draws them from its own stream,
keyed by the server step (``step.version``), never from a shared generator. An update stage's
``upload_bytes`` declares what it does to the bytes a client uploads (an encoding stage: fewer; secure
aggregation's masks: more); the system model times uploads from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raysim.algorithms import ClientUpdates


@dataclass(frozen=True)
class ServerInput:
    """What flows through the server's stages: the step's updates (one row per client, client-id
    order), their aggregation weights, and the model version the step starts from (the step's
    number is ``version + 1``)."""

    updates: ClientUpdates
    weights: np.ndarray
    version: int


class Stage:
    """A server stage (see the module docstring); ``name`` keys its state in the run state."""

    name = "stage"

    def init(self) -> dict:
        """The stage's state before the first step."""
        return {}

    def update(self, step: ServerInput, state: dict) -> tuple[ServerInput, dict]:
        """(the step as this stage passes it on, the stage's new state)."""
        raise NotImplementedError

    def upload_bytes(self, nbytes: int, values: int) -> int:
        """The bytes of an upload of ``nbytes`` (``values`` numbers) once this stage has acted (the
        same, by default)."""
        return nbytes


@dataclass(frozen=True)
class Aggregate:
    """What flows through the aggregate stages: the step's aggregate (float64, one entry per entry
    of an update: what the algorithm's :meth:`server_apply` turns into the model's step) and the
    step it aggregates (as the update stages passed it on)."""

    vector: torch.Tensor
    step: ServerInput


class AggregateStage:
    """A server stage between aggregation and the server optimizer (see the module docstring);
    ``name`` keys its state in the run state."""

    name = "aggregate_stage"

    def init(self) -> dict:
        """The stage's state before the first step."""
        return {}

    def update(self, aggregate: Aggregate, state: dict) -> tuple[Aggregate, dict]:
        """(the aggregate as this stage passes it on, the stage's new state)."""
        raise NotImplementedError

    def broadcast(self, state: dict) -> dict:
        """{name: tensor} this stage sends to clients with the model (nothing, by default)."""
        return {}
