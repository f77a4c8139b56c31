"""The algorithm interface every federated algorithm implements.

An algorithm is explicit server state plus pure functions (in the style of
FedJAX's ``FederatedAlgorithm`` and optax's ``GradientTransformation``):

    init(params)                      -> server state (dict of tensors)
    payload(state)                    -> what clients receive (dict of tensors)
    client_update(payloads, ctx)      -> ClientUpdates for a task of several clients (vectorized);
                                         payloads[c] is what client c received (asynchronous
                                         clients of one task may start from different versions)
    aggregate(state, updates, weights) -> new server state from updates weighted by ``weights``
                                         (a round's sample weights, or staleness weights in async)
    global_params(state)              -> the flat parameters to evaluate and save
    client_models(state, client_state) -> per-client models when the algorithm keeps them (L2GD)

Stateful algorithms (``stateful = True``: SCAFFOLD's control variates, L2GD's local
models, FFGG with ``model.personal_state: stateful``) return each client's new state as
``updates.tensors["state"]``; the scheduler keeps it and hands it back, as ``ctx.states``,
the next time that client runs. Server state may carry diagnostics (``grad_norm_sq``: an
estimate of ‖F(θ)‖²) that the scheduler logs.

Every random draw of client work comes from ``ctx.rngs`` (one stream per client
and task), so results do not depend on where or with whom a client ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.local_sgd import batch_schedule, local_sgd
from raysim.models import FlatModel


@dataclass
class ClientContext:
    """What a task of C clients sees on the host that runs it."""

    client_ids: np.ndarray  # [C]
    rngs: list  # one numpy Generator per client, seeded from (seed, stream, client, task counter)
    model: FlatModel
    features: torch.Tensor  # every row of the data set, on the host's device
    labels: torch.Tensor
    offsets: np.ndarray  # [C, 3]: train_start, test_start, test_end
    device: torch.device
    participation: np.ndarray | None = None  # [C] δ_k of unreliable clients (None: always compute)
    local_steps: np.ndarray | None = None  # [C] heterogeneous E_k (> 0 overrides the algorithm's)
    noise: tuple | None = None  # (kind, scale): perturbation of local gradients
    problem: object = None  # a QuadraticProblem: clients are its rows of sufficient statistics
    states: list | None = None  # [C] each client's kept state (a tensor, or None on a first visit)

    def schedule(self, cfg, steps=None):
        """This task's minibatch schedule under the algorithm config ``cfg`` and the system model."""
        steps = cfg.local_steps if steps is None else steps
        return batch_schedule(self.offsets[:, 0], self.train_sizes, self.rngs, cfg.batch_size,
                              cfg.local_epochs, steps, self.local_steps, self.participation)

    @property
    def gradient_noise(self):
        """(kind, scale, rngs) for local_sgd, or None."""
        return None if self.noise is None else (*self.noise, self.rngs)

    @property
    def train_sizes(self) -> np.ndarray:
        return self.offsets[:, 1] - self.offsets[:, 0]


@dataclass
class ClientUpdates:
    """Per-client results of one or more tasks, one row per client."""

    client_ids: np.ndarray  # [C] int64
    samples: np.ndarray  # [C] training samples the client holds
    train_loss: np.ndarray  # [C] mean minibatch loss of its local work
    tensors: dict = field(default_factory=dict)  # name -> [C, ...] float tensor on CPU
    compute_seconds: np.ndarray | None = None  # [C] wall seconds attributed to each client
    actor: np.ndarray | None = None  # [C] index of the actor that ran it

    def first_nonfinite(self):
        """Index of the first client (in row order) with a non-finite loss or update, or None."""
        bad = ~np.isfinite(self.train_loss)
        for tensor in self.tensors.values():
            bad |= ~tensor.reshape(len(bad), -1).isfinite().all(1).numpy()
        hits = np.flatnonzero(bad)
        return int(hits[0]) if len(hits) else None

    def split(self) -> list:
        """One ClientUpdates per row, in row order."""
        return [ClientUpdates(self.client_ids[i:i + 1], self.samples[i:i + 1], self.train_loss[i:i + 1],
                              {k: t[i:i + 1] for k, t in self.tensors.items()},
                              self.compute_seconds[i:i + 1], self.actor[i:i + 1])
                for i in range(len(self.client_ids))]

    @staticmethod
    def concat(parts: list) -> "ClientUpdates":
        """Join several tasks' results, sorted by client id (the aggregation order)."""
        ids = np.concatenate([p.client_ids for p in parts])
        order = np.argsort(ids, kind="stable")
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])[order]
        tensors = {k: torch.cat([p.tensors[k] for p in parts])[torch.from_numpy(order)] for k in parts[0].tensors}
        return ClientUpdates(ids[order], cat("samples"), cat("train_loss"), tensors,
                             cat("compute_seconds"), cat("actor"))


@dataclass
class Personalized:
    """Per-client test results after local fine-tuning."""

    client_ids: np.ndarray
    test_loss_sum: np.ndarray
    test_correct: np.ndarray
    test_rows: np.ndarray


class Algorithm:
    """Base class: holds the algorithm's config, the model's config and FlatModel (for the
    parameter split); subclasses implement the interface. ``problem`` is the QuadraticProblem of
    quadratic scenarios (its smoothness constants set step sizes with ``algorithm.lr_unit``),
    ``num_clients`` the number of registered clients and ``seed`` the scenario's seed."""

    stateful = False
    personalised = False  # partially personalised (FFGG): clients use their own fine-tuned w

    def __init__(self, cfg, model_cfg=None, model=None, problem=None, num_clients: int = 0, seed: int = 0):
        self.cfg, self.model_cfg, self.model = cfg, model_cfg, model
        self.problem, self.num_clients, self.seed = problem, num_clients, seed

    def init(self, params: torch.Tensor) -> dict:
        raise NotImplementedError

    def payload(self, state: dict) -> dict:
        raise NotImplementedError

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        raise NotImplementedError

    def aggregate(self, state: dict, updates: ClientUpdates, weights: np.ndarray) -> dict:
        raise NotImplementedError

    def global_params(self, state: dict) -> torch.Tensor:
        return state["params"]

    def unit(self, constant: str) -> float:
        """The step-size unit: 1, or 1/``constant`` (a smoothness constant of the quadratic problem:
        L, L_w or L_f) with ``algorithm.lr_unit: inverse_smoothness``."""
        if self.cfg.lr_unit == "absolute":
            return 1.0
        return 1.0 / self.problem.smoothness()[constant]

    def client_models(self, state: dict, client_state: dict):
        """[M, P] per-client models for evaluation, or None when every client uses the global one."""
        return None

    def personalize(self, payloads: list, ctx: ClientContext, steps: int, epochs: int, lr: float) -> Personalized:
        """Fine-tune the whole model (``steps`` SGD steps, or ``epochs`` local epochs when > 0) on
        each client, then test it there."""
        start = stack_params(payloads, ctx.device)
        return finetune_and_test(ctx, self._finetune_schedule(ctx, steps, epochs), start, lr,
                                 self.cfg.weight_decay)

    def _finetune_schedule(self, ctx: ClientContext, steps: int, epochs: int):
        return batch_schedule(ctx.offsets[:, 0], ctx.train_sizes, ctx.rngs, self.cfg.batch_size,
                              epochs, None if epochs > 0 else steps)


def finetune_and_test(ctx: ClientContext, schedule, start: torch.Tensor, lr: float, weight_decay: float,
                      update_mask: torch.Tensor | None = None) -> Personalized:
    """Run ``schedule`` of SGD from ``start`` ([C, P]; only ``update_mask`` entries move), then
    test each client's model on its own test rows."""
    params, _ = local_sgd(ctx.model, start, ctx.features, ctx.labels, schedule, lr, weight_decay,
                          update_mask=update_mask)
    loss_sum, correct, rows = [], [], []
    with torch.no_grad():
        for p, (_, lo, hi) in zip(params, ctx.offsets):
            logits = ctx.model.logits(p, ctx.features[lo:hi])
            y = ctx.labels[lo:hi]
            loss_sum.append(F.cross_entropy(logits, y, reduction="sum").item())
            correct.append(int((logits.argmax(1) == y).sum()))
            rows.append(int(hi - lo))
    return Personalized(ctx.client_ids, np.array(loss_sum), np.array(correct), np.array(rows))


def stack_params(payloads: list, device) -> torch.Tensor:
    """[C, P] starting parameters, one row per client's payload (shared rows when all are equal)."""
    first = payloads[0]["params"]
    if all(p["params"] is first for p in payloads):
        return first.to(device).expand(len(payloads), -1)
    return torch.stack([p["params"] for p in payloads]).to(device)


def weighted_sum(vectors: torch.Tensor, weights: np.ndarray) -> torch.Tensor:
    """Σ_k weights[k]·vectors[k] in float64, accumulated in row order (client-id order)."""
    acc = torch.zeros(vectors.shape[1:], dtype=torch.float64)
    for w, v in zip(weights.tolist(), vectors):
        acc.add_(v.double(), alpha=w)
    return acc
