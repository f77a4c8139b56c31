"""Differential privacy's stages (``privacy:``): each client clips its update (:class:`ClipUpdate`)
and, under local DP, noises it (:class:`LocalGaussianNoise`) before upload; under central DP the
server replaces the step's aggregate with the noised sum of the clipped updates over a fixed
denominator (:class:`CentralGaussianNoise`); :class:`ParticipationLedger` counts who took part in
each server step, for the accountant (:mod:`raysim.privacy.accounting`)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from raysim.algorithms import ClientContext, ClientUpdates
from raysim.pipeline import per_client
from raysim.pipeline.client import ClientStage
from raysim.pipeline.stage import Aggregate, AggregateStage, ServerInput, Stage
from raysim.privacy.accounting import tree_leaf, tree_nodes
from raysim.privacy.config import EVENT_COLUMNS
from raysim.streams import Purpose, stream


class ClipUpdate(ClientStage):
    """Each client's update scaled to L2 norm at most its clip norm (the payload's ``clip_norm`` under
    adaptive clipping, else ``clip_norm``; an update within it is sent as it is). With ``adaptive``,
    each client also sends whether its update was within the clip norm (``extras["within_clip"]``).
    Logs the norm before (``norm_before_clip``) and after (``norm_uploaded``) clipping, and the clip norm."""

    name = "clip_update"
    diagnostics = EVENT_COLUMNS

    def __init__(self, clip_norm: float, adaptive: bool = False):
        self.clip_norm, self.adaptive = clip_norm, adaptive

    def update(self, updates: ClientUpdates, ctx: ClientContext, payloads: list) -> ClientUpdates:
        norms = updates.vector.norm(dim=1, dtype=torch.float64)
        clip = torch.tensor([float(p["clip_norm"]) if self.adaptive else self.clip_norm for p in payloads],
                            dtype=torch.float64)
        scale = (clip / norms).nan_to_num(posinf=1.0).clamp(max=1.0)  # a zero update: as it is
        clipped = (updates.vector.double() * scale[:, None]).to(updates.vector.dtype)
        extras = updates.extras
        if self.adaptive:
            extras = {**extras, "within_clip": (norms <= clip).double()[:, None]}
        uploaded = clipped.norm(dim=1, dtype=torch.float64)
        return replace(updates, vector=clipped, extras=extras, diagnostics={
            **updates.diagnostics, "norm_before_clip": norms, "norm_uploaded": uploaded, "clip_norm": clip})


class LocalGaussianNoise(ClientStage):
    """Gaussian noise of std ``std`` added to each client's (clipped) update, drawn from the client's
    own task stream, so that it is the same wherever the client runs; logs the norm uploaded."""

    name = "local_gaussian_noise"
    diagnostics = ("norm_uploaded",)

    def __init__(self, std: float):
        self.std = std

    def update(self, updates: ClientUpdates, ctx: ClientContext, payloads: list) -> ClientUpdates:
        size = updates.vector.shape[1]
        noise = torch.from_numpy(np.stack([rng.standard_normal(size) for rng in ctx.rngs]))
        noised = (updates.vector.double() + self.std * noise).to(updates.vector.dtype)
        return replace(updates, vector=noised, diagnostics={**updates.diagnostics,
                                                            "norm_uploaded": noised.norm(dim=1, dtype=torch.float64)})


class CentralGaussianNoise(AggregateStage):
    """DP-FedAvg's server side: the aggregate becomes (Σ clipped updates + N(0, (z_Δ·C)²·I)) / ``denominator``
    (the expected number of participants, fixed so that one client moves it by at most
    C / denominator), whatever the aggregation rule's weights; the noise comes from the stream
    (seed, DP noise, server step). C is ``clip_norm``; with ``adaptive`` (an AdaptiveClipConfig
    whose target_quantile is set) it is the state's ``clip_norm``, moved after each step to
    C·exp(−η_C·(b̄ − γ)), b̄ = (Σ (bit − 1/2) + N(0, σ_b²)) / denominator + 1/2 from the clients'
    ``within_clip`` bits, and sent to clients with the model (:meth:`broadcast`)."""

    name = "central_gaussian_noise"

    def __init__(self, noise_multiplier: float, clip_norm: float, denominator: int, seed: int, adaptive=None,
                 count_noise: float = 0.0):
        self.z, self.clip_norm, self.denominator, self.seed = noise_multiplier, clip_norm, denominator, seed
        self.adaptive, self.count_noise = adaptive, count_noise

    def init(self) -> dict:
        return {"clip_norm": self.clip_norm} if self.adaptive is not None else {}

    def update(self, aggregate: Aggregate, state: dict) -> tuple[Aggregate, dict]:
        updates = aggregate.step.updates
        clip = state.get("clip_norm", self.clip_norm)
        total = updates.vector.sum(0, dtype=torch.float64)
        rng = stream(self.seed, Purpose.DP_NOISE, aggregate.step.version)
        noise = torch.from_numpy(rng.standard_normal(total.numel())).reshape(total.shape)
        vector = (total + self.z * clip * noise) / self.denominator
        if self.adaptive is not None:
            within = float((updates.extras["within_clip"].double() - 0.5).sum())
            within += self.count_noise * rng.standard_normal()
            share = within / self.denominator + 0.5
            state = {"clip_norm": clip * math.exp(-self.adaptive.lr * (share - self.adaptive.target_quantile))}
        return replace(aggregate, vector=vector), state

    def broadcast(self, state: dict) -> dict:
        return {"clip_norm": torch.tensor(state["clip_norm"], dtype=torch.float64)} if "clip_norm" in state else {}


class TreeAggregationNoise(AggregateStage):
    """DP-FTRL's server side: the aggregate becomes (Σ clipped updates + n(j) − n(j − 1)) / ``denominator``,
    n(j) the noise of the tree's prefix sum of leaves 1 … j (the sum of the noises of
    :func:`~raysim.privacy.accounting.tree_nodes` (j), each N(0, (z·clip_norm)²·I) from the stream
    (seed, DP tree node, tree, level, index)), the step being leaf j of its tree; a new tree starts every ``restart_every``
    steps (None: never). With server SGD the model then holds the tree's noisy prefix sum, as
    follow-the-regularized-leader does. Stateless: the tree and leaf follow from the step."""

    name = "tree_aggregation_noise"

    def __init__(self, noise_multiplier: float, clip_norm: float, denominator: int, seed: int,
                 restart_every: int | None):
        self.std, self.denominator, self.seed = noise_multiplier * clip_norm, denominator, seed
        self.restart_every = restart_every

    def update(self, aggregate: Aggregate, state: dict) -> tuple[Aggregate, dict]:
        total = aggregate.step.updates.vector.sum(0, dtype=torch.float64)
        tree, leaf = tree_leaf(aggregate.step.version, self.restart_every)
        now, before = tree_nodes(leaf), tree_nodes(leaf - 1)
        increment = torch.zeros(total.numel(), dtype=torch.float64)
        for sign, nodes in ((1.0, now - before), (-1.0, before - now)):
            for level, index in sorted(nodes):
                rng = stream(self.seed, Purpose.DP_TREE_NODE, tree, level, index)
                increment += sign * torch.from_numpy(rng.standard_normal(total.numel()))
        vector = (total + self.std * increment.reshape(total.shape)) / self.denominator
        return replace(aggregate, vector=vector), state


class ParticipationLedger(Stage):
    """Who took part in each server step, per client: ``(participations, exposure)``, exposure the
    sum over steps of its updates in the step (k), squared with ``squared`` (central DP: k clipped
    updates of one client in one sum move it by k·S, a FedBuff buffer may hold two), or added up
    (local DP: each upload is noised on its own); or with ``versions``, the tuple of the model
    versions of the steps it took part in (what DP-FTRL's accounting needs). State
    ``{"clients": per-client tree, "most": the largest exposure (or participations, with versions)}``."""

    name = "privacy_ledger"

    def __init__(self, num_clients: int, versions: bool = False, squared: bool = False):
        self.levels, self.versions, self.squared = per_client.levels_for(num_clients), versions, squared

    def init(self) -> dict:
        return {"clients": {}, "most": 0}

    def update(self, step: ServerInput, state: dict) -> tuple[ServerInput, dict]:
        ids, k = np.unique(step.updates.client_ids, return_counts=True)
        moved = {}
        for c, times in zip(ids.tolist(), k.tolist()):
            if self.versions:
                moved[c] = (*per_client.value_of(state["clients"], c, self.levels, ()), *[step.version] * times)
            else:
                taken, exposure = per_client.value_of(state["clients"], c, self.levels, (0, 0))
                moved[c] = (taken + times, exposure + (times * times if self.squared else times))
        most = max([state["most"], *(len(v) if self.versions else v[1] for v in moved.values())])
        return step, {"clients": per_client.updated(state["clients"], moved, self.levels), "most": most}

    def entries(self, state: dict):
        """(client id, ledger entry) of every client that took part, in id order."""
        return per_client.items(state["clients"], self.levels)

    def participations(self, entry) -> int:
        """A client's participations from its ledger entry."""
        return len(entry) if self.versions else entry[0]
