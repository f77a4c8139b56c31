"""The server step as one pipeline: the update stages in order, the algorithm's aggregation rule,
the aggregate stages in order, then the algorithm's :meth:`server_apply` (its direction and server
optimizer). Synchronous rounds, FedBuff buffers and FedAsync steps, one at a time or a window of
them, all go through it."""

from __future__ import annotations

import math

import numpy as np

from raysim.algorithms import ClientUpdates, ServerState
from raysim.communication.config import download_bits
from raysim.communication.secure_aggregation import EXTRA_ROUND_TRIPS
from raysim.errors import DivergenceError
from raysim.pipeline.compression import encode_model
from raysim.pipeline.stage import Aggregate, ServerInput


class ServerPipeline:
    """``stages`` (update :class:`~.stage.Stage` objects), ``algorithm``'s aggregation rule,
    ``aggregate_stages`` (:class:`~.stage.AggregateStage` objects), then ``algorithm``'s
    :meth:`server_apply`; ``client_stages``: what clients run before upload (for the bytes they
    declare); ``downlink``: how the broadcast model is encoded (``communication.downlink.kind``);
    ``secure``: secure aggregation's protocol (its costs), or None; ``byzantine`` [N] and ``cfg``
    (the scenario) word a divergence. States are passed in and returned: the server state, and
    the stages' states as ``{stage name: state}``."""

    def __init__(self, algorithm, stages: tuple, aggregate_stages: tuple, client_stages: tuple, byzantine: np.ndarray,
                 cfg, downlink: str = "none", secure=None):
        self.algorithm, self.stages, self.aggregate_stages = algorithm, stages, aggregate_stages
        self.client_stages, self.byzantine, self.cfg = client_stages, byzantine, cfg
        self.downlink, self.secure = downlink, secure

    def init(self) -> dict:
        """The stages' states before the first step."""
        return {stage.name: stage.init() for stage in (*self.stages, *self.aggregate_stages)}

    @property
    def judges_each_update(self) -> bool:
        """Whether a non-finite update stops the run (the mean aggregator); a robust aggregator may
        absorb it, and only a non-finite model stops the run."""
        return not self.algorithm.aggregator.robust

    @property
    def takes_steps_together(self) -> bool:
        """Whether :meth:`steps` takes a run of one-update steps at once: no stage acts on the
        updates or their aggregate, and the aggregator is the mean (the model is not checked after
        each step)."""
        return not self.stages and not self.aggregate_stages and self.judges_each_update

    @property
    def client_diagnostics(self) -> tuple:
        """The events.parquet columns the client stages add (each a number per client)."""
        return tuple(dict.fromkeys(name for stage in self.client_stages for name in stage.diagnostics))

    def broadcast(self, payload: dict, states: dict) -> dict:
        """What clients receive: the algorithm's ``payload`` with its model encoded by the downlink
        (as clients decode it), and {name: tensor} the aggregate stages send with it (from their ``states``)."""
        sent = {**payload, "params": encode_model(self.downlink, payload["params"])}
        for stage in self.aggregate_stages:
            sent.update(stage.broadcast(states[stage.name]))
        return sent

    def download_bytes(self, payload: dict) -> int:
        """The bytes a client receives for ``payload`` (:meth:`broadcast`'s): its tensors at their own
        precision, the model's entries as the downlink encodes them, and secure aggregation's messages."""
        params = payload["params"]
        nbytes = sum(t.numel() * t.element_size() for name, t in payload.items() if name != "params")
        nbytes += math.ceil(download_bits(self.downlink, params.numel(), 8 * params.element_size()) / 8)
        return nbytes + (self.secure.download_bytes() if self.secure is not None else 0)

    @property
    def round_trips(self) -> int:
        """The round trips of a client's task over its network: 1 (model down, update up), and
        secure aggregation's extra ones."""
        return 1 + (EXTRA_ROUND_TRIPS if self.secure is not None else 0)

    def stage(self, name: str):
        """The update stage called ``name`` (None: not in this pipeline)."""
        return next((stage for stage in self.stages if stage.name == name), None)

    @property
    def keeps_client_state(self) -> bool:
        """Whether a client stage keeps per-client state between visits (error feedback)."""
        return any(stage.keeps for stage in self.client_stages)

    @property
    def sizes_by_content(self) -> bool:
        """Whether an upload's size depends on the update (QSGD with Elias coding)."""
        return any(stage.sizes_by_content for stage in self.client_stages)

    def upload_bytes(self, values: int, value_bytes: int) -> int:
        """The bytes a client uploads for an update of ``values`` numbers of ``value_bytes`` each, as
        the stages declare them."""
        nbytes = values * value_bytes
        for stage in (*self.client_stages, *self.stages):
            nbytes = stage.upload_bytes(nbytes, values)
        return nbytes

    def step(self, server: ServerState, states: dict, updates: ClientUpdates, weights: np.ndarray,
             version: int) -> tuple[ServerState, dict]:
        """(server state, stage states) after one server step from model ``version`` on ``updates``
        (client-id order) with ``weights``. Raises DivergenceError on a non-finite Byzantine update
        (mean aggregator) or model."""
        step, states = ServerInput(updates, weights, version), dict(states)
        for stage in self.stages:
            step, states[stage.name] = stage.update(step, states[stage.name])
        vector, aggregation = self.algorithm.aggregator(step.updates.vector, step.weights, server.aggregation)
        aggregate = Aggregate(vector, step)
        for stage in self.aggregate_stages:
            aggregate, states[stage.name] = stage.update(aggregate, states[stage.name])
        server = self.algorithm.server_apply(server, aggregate.vector, aggregation, step.updates, step.weights)
        if not self.judges_each_update and not bool(server.params.isfinite().all()):
            self._model_diverged(step)
        return server, states

    def steps(self, server: ServerState, states: dict, steps: list, version: int) -> tuple[list, dict]:
        """([server state after each step], stage states) of ``steps`` ((updates, weights) pairs)
        taken in a row from model ``version``: at once (:meth:`Algorithm.server_updates`) when
        :attr:`takes_steps_together`, else one after the other."""
        if self.takes_steps_together:
            return self.algorithm.server_updates(server, steps), states
        servers = []
        for i, (updates, weights) in enumerate(steps):
            server, states = self.step(server, states, updates, weights, version + i)
            servers.append(server)
        return servers, states

    def _model_diverged(self, step: ServerInput) -> None:
        cfg, byzantine = self.cfg, self.byzantine[step.updates.client_ids]
        why = (f"{int(byzantine.sum())} of them from Byzantine clients (system.byzantine.attack="
               f"{cfg.system.byzantine.attack}) that the rule did not absorb" if byzantine.any() else
               f"try a smaller algorithm.lr (now {cfg.algorithm.lr})")
        raise DivergenceError(
            f"server step {step.version + 1}: the model is not finite after aggregating {len(step.updates.client_ids)} "
            f"updates with algorithm.aggregator={self.algorithm.aggregator.name}; {why}")
