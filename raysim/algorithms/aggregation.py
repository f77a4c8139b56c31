"""The server's aggregation rule, from an algorithm's keys (``algorithm.aggregator`` and its keys).

Binds a rule of :mod:`raysim.algorithms.aggregation_rules` (or a custom ``package.module:function``) to its
parameters, optional bucketing, and its state between server steps, kept in
``ServerState.aggregation``: the number of aggregations so far (it seeds bucketing's
permutation, stream ``(Purpose.BUCKETING, aggregations)``) and, for centered clipping, the
previous centre it starts from (before the weights' total scales it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from raysim.algorithms import aggregation_rules
from raysim.algorithms.aggregator_catalog import RULES
from raysim.errors import RunError
from raysim.importing import USER_CODE_ERRORS, import_object, raised_in
from raysim.robust_f import capped_f, default_f
from raysim.streams import Purpose, stream


class ServerAggregator:
    """``(vectors [K, U], weights [K], state) -> (aggregate [U] float64, new state)``.

    ``byzantine_share``: the share of Byzantine clients, for Krum's and Bulyan's f when
    ``algorithm.byzantine_f`` is null (:func:`~raysim.robust_f.default_f`); f is capped
    where a step has too few inputs for it (a deadline round, FedBuff's last partial buffer, few
    buckets)."""

    def __init__(self, cfg, seed: int, byzantine_share: float = 0.0):
        self.name = getattr(cfg, "aggregator", "mean")
        self.bucket_size = getattr(cfg, "bucket_size", 1)
        self.seed, self.share, self.cfg = int(seed), float(byzantine_share), cfg
        declared = RULES.get(self.name)
        self.takes_f = declared is not None and declared.takes_f
        if declared is None:
            self.rule = CheckedRule(self.name, import_object("algorithm.aggregator", self.name, "an aggregator"))
            self.params = dict(cfg.aggregator_options)
        else:  # the rule's keyword arguments from its keys (AggregatorKeys; their defaults live there)
            self.rule = import_object("algorithm.aggregator", declared.function, "an aggregator")
            self.params = {arg: getattr(cfg, name) for arg, name in declared.params.items()}

    @property
    def robust(self) -> bool:
        """Whether a non-finite update may be absorbed (anything but the mean): divergence is then
        judged on the model, not per update."""
        return self.name != "mean"

    def _f(self, updates: int, inputs: int) -> int:
        """f for a step of ``updates`` updates reduced as ``inputs`` inputs (buckets)."""
        f = self.cfg.byzantine_f if self.cfg.byzantine_f is not None else default_f(self.share, updates)
        return capped_f(inputs, f, self.name)

    def __call__(self, vectors: torch.Tensor, weights: np.ndarray, state: dict) -> tuple[torch.Tensor, dict]:
        if self.name == "mean":
            return aggregation_rules.weighted_mean(vectors, weights), state
        step = state.get("steps", 0)
        params = dict(self.params)
        inputs = -(-len(vectors) // self.bucket_size)
        if self.takes_f:
            params["f"] = self._f(len(vectors), inputs)
        if self.name == "multi_krum" and params["m"] is not None:
            params["m"] = min(params["m"], inputs - params["f"])
        weights = torch.as_tensor(np.asarray(weights, dtype=np.float64))
        clipping = self.name == "centered_clipping"
        if clipping:  # it starts from its previous centre, kept before the weights' total scales it
            params["start"] = state.get("previous")
        given = None if clipping else weights
        if self.bucket_size > 1:
            aggregate = aggregation_rules.bucketing(vectors, given, rule=self.rule, bucket_size=self.bucket_size,
                                              rng=stream(self.seed, Purpose.BUCKETING, step), **params)
        else:
            aggregate = self.rule(vectors, given, **params)
        new_state = {"steps": step + 1}
        if clipping:
            new_state["previous"] = aggregate.detach().clone()
            aggregate = aggregate * math.fsum(weights.tolist())
        return aggregate.double(), new_state


@dataclass(frozen=True)
class CheckedRule:
    """A custom aggregator (``algorithm.aggregator: package.module:function``) as the server step
    calls it: what it raises, or a result other than one aggregate of the inputs' length, ends the
    run with one line that names it (:class:`~raysim.errors.RunError`: the metrics so far stay)."""

    name: str
    rule: object

    def __call__(self, vectors: torch.Tensor, weights, **params) -> torch.Tensor:
        expected = (f"algorithm.aggregator = {self.name!r}: expected a function returning the aggregate of "
                    f"{len(vectors)} inputs, a tensor of shape [{vectors.shape[1]}]")
        try:
            aggregate = self.rule(vectors, weights, **params)
        except USER_CODE_ERRORS as exc:
            raise RunError(f"{expected} ({raised_in(exc)})") from None
        if not isinstance(aggregate, torch.Tensor) or tuple(aggregate.shape) != (vectors.shape[1],):
            got = list(aggregate.shape) if isinstance(aggregate, torch.Tensor) else type(aggregate).__name__
            raise RunError(f"{expected} (it returned {got})")
        return aggregate
