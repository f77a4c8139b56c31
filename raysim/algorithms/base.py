"""The algorithm interface: explicit server state plus pure functions, built from shared parts
(the exchanged and kept data: :mod:`.updates`; what a task sees on its host: :mod:`.context`).

In the style of FedJAX's ``FederatedAlgorithm`` and optax's transforms, an algorithm is

    init(params)                       -> ServerState (parameters, optimizer state, algorithm state)
    payload(state)                     -> what clients receive (a dict of tensors)
    client_update(payloads, ctx)       -> ClientUpdates of a task's clients (vectorized); payloads[c]
                                          is what client c received (asynchronous clients of one task
                                          may start from different model versions)
    aggregator(vectors, w, agg_state)  -> (aggregate, its new state): the mean, or a robust rule
                                          (:mod:`.aggregation`)
    server_apply(state, aggregate, ...) -> the next ServerState: the algorithm turns the aggregate
                                          into a direction (:meth:`Algorithm.server_direction`),
                                          the server optimizer steps
                                          (:mod:`raysim.algorithms.server_optimizers`)

The server step (:class:`raysim.pipeline.server.ServerPipeline`) runs its stages around the
two: update stages before the aggregator, aggregate stages between it and :meth:`server_apply`.

and declares what a task costs: :meth:`Algorithm.work` (samples processed) and
:meth:`Algorithm.upload_size` (numbers sent); the payload's size is its tensors' bytes. The
system model times tasks from these.

Client work trains through the one local loop (:func:`raysim.algorithms.local.local_train`)
with a gradient oracle and a chain of client transforms that the task's
:class:`ClientContext` builds. Every random draw of client work comes from ``ctx.rngs`` (one
stream per client and task), so results do not depend on where or with whom a client ran.

Stateful algorithms (SCAFFOLD's control variates, FedDyn's g_i, L2GD's models, FFGG with
``model.personal_state: stateful``) return each client's new state as ``updates.states``;
the scheduler keeps it and hands it back, as ``ctx.states``, the next time that client runs.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms import aggregation_rules
from raysim.algorithms import server_optimizers
from raysim.algorithms.aggregation import ServerAggregator
from raysim.algorithms.context import ClientContext
from raysim.algorithms.keys import FedAvgKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.updates import ClientTests, ClientUpdates, ServerState
from raysim.errors import RunError

AGGREGATED_AT_ONCE = 1 << 22  # numbers a window of FedAsync steps aggregates at once (32 MiB in float64)


def _descend(theta: np.ndarray, step: np.ndarray) -> np.ndarray:
    """θ − step, computed in float64 (a float32 θ or step is promoted exactly) and rounded once to
    θ's dtype; numpy, since torch's mixed-precision subtraction costs several times more on small models."""
    return np.subtract(theta, step, dtype=np.float64).astype(theta.dtype, copy=False)


@dataclass
class AlgorithmEnv:
    """What an algorithm is built with besides its keys: the model (a FlatModel with its
    personal/global split) and the scenario's ``model`` section, the number of registered
    clients, the seed, the quadratic problem when the data set is one (its smoothness
    constants set step sizes) and the share of Byzantine clients (Krum's default f)."""

    model: object
    model_cfg: object
    num_clients: int
    seed: int
    problem: object = None
    byzantine_share: float = 0.0

    @property
    def quadratic(self) -> bool:
        return self.problem is not None


class Algorithm:
    """Base class of every algorithm; subclasses write :meth:`client_update` and, where the server
    does more than apply the aggregated update, :meth:`server_direction`.

    ``Keys`` is the dataclass of the algorithm's scenario keys (a custom algorithm declares its own,
    see :mod:`raysim.algorithms.keys`); ``cfg`` holds their values. ``stateful``: clients keep state
    between visits; ``personalised``: the model has a personal part w that never leaves the client
    (``model.personal``); ``timing_reads_payload``: a task's virtual duration depends on the
    payload's values (:meth:`work` or :meth:`upload_size` reads them) or its sizes change from one
    model version to the next, so it cannot be known before the task's version exists; a class says
    so itself (false by default: asynchronous runs then time the next dispatches ahead and handle
    windows of completions at once); ``sample_weighted``: a synchronous round weights updates by the
    clients' training samples (false: a plain mean); ``server_diagnostics``: the names of the
    numbers :meth:`server_direction` reports (its third value), each logged in a rounds.parquet
    column of that name (see :meth:`diagnostics_of`); ``client_diagnostics``: the names of the
    per-client numbers :meth:`client_update` returns among its ``diagnostics``, each logged in an
    events.parquet column of that name (see :meth:`client_numbers`); ``uploads``: the names of
    the vectors a client sends beside its update (its ``extras``), which differential privacy's
    clipping and noise do not cover; ``personal_models``: clients keep models of their own (Ditto's
    v_k), which personalized evaluation tests through :meth:`personalize` even with
    ``eval.personalized_steps`` and ``personalized_epochs`` both 0."""

    Keys = FedAvgKeys
    stateful = False
    personalised = False
    timing_reads_payload = False
    sample_weighted = True
    server_diagnostics: tuple = ()
    client_diagnostics: tuple = ()
    uploads: tuple = ()
    personal_models = False

    def __init__(self, cfg, env: AlgorithmEnv):
        self.cfg, self.env, self.model = cfg, env, env.model

    # ------------------------------------------------------------------ server

    @functools.cached_property
    def aggregator(self) -> ServerAggregator:
        """The server's aggregation rule (``algorithm.aggregator``; the weighted mean without that key)."""
        return ServerAggregator(self.cfg, self.env.seed, self.env.byzantine_share)

    @functools.cached_property
    def server_optimizer(self) -> server_optimizers.ServerOptimizer:
        """Built on first use, on the server only (its step size may need the problem's constants)."""
        return self.make_server_optimizer()

    def make_server_optimizer(self) -> server_optimizers.ServerOptimizer:
        """The configured server optimizer (plain SGD at ``server_lr`` when there is no choice)."""
        lr = self.server_lr()
        if hasattr(self.cfg, "server_optimizer"):
            return server_optimizers.from_keys(self.cfg, lr)
        return server_optimizers.sgd(lr)

    def server_lr(self) -> float:
        return getattr(self.cfg, "server_lr", 1.0)

    def unit(self, constant: str) -> float:
        """The step-size unit: 1, or 1/``constant`` (a smoothness constant of the quadratic problem:
        L, L_w or L_f) with ``algorithm.lr_unit: inverse_smoothness``."""
        if getattr(self.cfg, "lr_unit", "absolute") == "absolute":
            return 1.0
        return 1.0 / self.env.problem.smoothness()[constant]

    @property
    def update_index(self) -> torch.Tensor | None:
        """Entries of the parameter vector that updates cover (None: all of them)."""
        return self.model.global_index if self.personalised else None

    def update_size(self) -> int:
        index = self.update_index
        return self.model.size if index is None else len(index)

    def init(self, params: torch.Tensor) -> ServerState:
        return ServerState(params.clone(), self.server_optimizer.init(self.update_size()), self.init_extra(params))

    def init_extra(self, params: torch.Tensor) -> dict:
        """The algorithm's own server state (SCAFFOLD's c, FedDyn's h, counters)."""
        return {}

    def payload(self, state: ServerState) -> dict:
        return {"params": state.params}

    def server_rule(self, state: ServerState):
        """(entries the update covers, server optimizer) of the next server step."""
        return self.update_index, self.server_optimizer

    def server_direction(self, state: ServerState, aggregate: torch.Tensor, updates: ClientUpdates,
                         weights: np.ndarray) -> tuple[torch.Tensor, dict, dict]:
        """(direction handed to the server optimizer, new algorithm state, diagnostics) from the
        aggregated update (float64). The default: the aggregate itself."""
        return aggregate, state.extra, {}

    def server_update(self, state: ServerState, updates: ClientUpdates, weights: np.ndarray) -> ServerState:
        """One server step of this algorithm alone (no pipeline stage): aggregate (client-id order,
        float64), then :meth:`server_apply`. The server pipeline makes the same two calls with its
        stages around them; an algorithm changes its step through :meth:`server_direction`,
        :meth:`server_rule` or :meth:`server_apply`, never here."""
        aggregate, aggregation = self.aggregator(updates.vector, weights, state.aggregation)
        return self.server_apply(state, aggregate, aggregation, updates, weights)

    def server_updates(self, state: ServerState, steps: list) -> list:
        """The states after each of ``steps`` ((updates, weights) pairs of one update each, as FedAsync
        takes them) taken in a row under the mean aggregator: the states :meth:`server_update`
        gives one step after the other. The steps' aggregates are computed at once (in chunks of
        at most ``AGGREGATED_AT_ONCE`` numbers, whatever the model's size), and so are their steps
        when the server step is the base class's with a ``rowwise`` optimizer."""
        index, optimizer = self.server_rule(state)
        rowwise = (index is None and optimizer.rowwise and type(self).server_rule is Algorithm.server_rule
                   and type(self).server_direction is Algorithm.server_direction
                   and type(self).server_apply is Algorithm.server_apply)
        rows = max(1, AGGREGATED_AT_ONCE // steps[0][0].vector[0].numel())
        states = []
        for first in range(0, len(steps), rows):
            chunk = steps[first:first + rows]
            aggregates = aggregation_rules.weighted_rows(torch.cat([u.vector for u, _ in chunk]),
                                                   np.concatenate([w for _, w in chunk]))
            if rowwise:  # θ_k = θ_{k−1} − step_k, as server_apply takes each
                theta = state.params.numpy()
                for step in optimizer.update(aggregates, state.opt)[0].numpy():
                    theta = _descend(theta, step)
                    states.append(state := ServerState(torch.from_numpy(theta), state.opt, state.extra, {},
                                                       state.aggregation))
            else:
                for (updates, weights), aggregate in zip(chunk, aggregates):
                    states.append(state := self.server_apply(state, aggregate, state.aggregation, updates, weights))
        return states

    def server_apply(self, state: ServerState, aggregate: torch.Tensor, aggregation: dict, updates: ClientUpdates,
                     weights: np.ndarray) -> ServerState:
        """The rest of a server step from its aggregate and the aggregation rule's new state:
        direction, optimizer, θ ← θ − step."""
        index, optimizer = self.server_rule(state)
        direction, extra, diagnostics = self.server_direction(state, aggregate, updates, weights)
        step, opt = optimizer.update(direction, state.opt)
        if index is None:
            params = torch.from_numpy(_descend(state.params.numpy(), step.numpy()))
        else:
            params = state.params.double().clone()
            params[index] -= step
            params = params.to(state.params.dtype)
        return ServerState(params, opt, extra, diagnostics, aggregation)

    def diagnostics_of(self, state: ServerState) -> dict:
        """{name: float} of every name in ``server_diagnostics``, from what the server step that
        made ``state`` reported (NaN where it reported nothing: a step that did not run
        :meth:`server_direction`); RunError, one line, for a name it does not declare or a value
        that is not one number."""
        reported = state.diagnostics
        if not reported and not self.server_diagnostics:  # most algorithms: once per server step, so kept cheap
            return {}
        undeclared = sorted(set(reported) - set(self.server_diagnostics))
        if undeclared:
            raise RunError(f"{type(self).__name__}.server_direction reported the diagnostic {undeclared[0]!r}, "
                           f"which {type(self).__name__}.server_diagnostics does not name "
                           f"(it names {list(self.server_diagnostics)}): declare every name it reports")
        values = {}
        for name in self.server_diagnostics:
            value = reported.get(name, math.nan)
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().numpy()
            if isinstance(value, np.ndarray) and value.size == 1:
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                shape = list(value.shape) if hasattr(value, "shape") else type(value).__name__
                raise RunError(f"{type(self).__name__}.server_direction reported the diagnostic {name!r} as "
                               f"{shape}: a diagnostic is one number (a float or a one-element tensor)")
            values[name] = float(value)
        return values

    def client_numbers(self, updates: ClientUpdates) -> dict:
        """{name: float64 [C]} of every name in ``client_diagnostics``, from ``updates.diagnostics``;
        RunError, one line, when ``client_update`` returned no such diagnostic or not one number
        per client ([C] or [C, 1])."""
        numbers = {}
        for name in self.client_diagnostics:
            value = updates.diagnostics.get(name)
            count = len(updates.client_ids)
            if value is not None:
                value = torch.as_tensor(value).detach().cpu()
            if value is None or value.numel() != count or value.dim() not in (1, 2):
                got = "none" if value is None else list(value.shape)
                raise RunError(f"{type(self).__name__}.client_update returned the client diagnostic {name!r} as "
                               f"{got} for {count} clients: one number per client ([{count}] or [{count}, 1]), as "
                               f"client_diagnostics names it")
            numbers[name] = value.reshape(count).double().numpy()
        return numbers

    def global_params(self, state: ServerState) -> torch.Tensor:
        """The flat parameters to evaluate and save."""
        return state.params

    def client_models(self, state: ServerState, client_states: dict):
        """[M, P] per-client models for evaluation, or None when every client uses the global one."""
        return None

    def deployed(self, ctx: ClientContext, start: torch.Tensor) -> torch.Tensor | None:
        """[C, P]: the model each client of ``ctx`` would put to use given the global ``start`` [C, P]
        (FFGG: θ with the w its fine-tuner leaves), or None when that is the global model itself."""
        return None

    # ------------------------------------------------------------------ client

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        raise NotImplementedError

    def local_lr(self) -> float:
        """The client's step size (``algorithm.lr``)."""
        return self.cfg.lr

    def adaptation_lr(self) -> float:
        """The step size of personalized evaluation when ``eval.personalized_lr`` is null."""
        return self.cfg.lr

    def personal_start(self, payloads: list, ctx: ClientContext) -> torch.Tensor:
        """[C, P]: the model each client's personalized evaluation starts from: the one it receives
        (an algorithm whose clients keep models of their own starts from those)."""
        return ctx.start(payloads)

    def personalize(self, payloads: list, ctx: ClientContext, steps: int, epochs: int, lr: float,
                    adapt_on: str = "train") -> ClientTests:
        """Fine-tune the whole model from :meth:`personal_start` (``steps`` SGD steps, or ``epochs``
        local epochs when > 0; none when both are 0) on each client's ``adapt_on`` rows, then test it there."""
        return self.finetune_and_test(ctx, self.personal_start(payloads, ctx), steps, epochs, lr, adapt_on=adapt_on)

    def finetune_and_test(self, ctx: ClientContext, start: torch.Tensor, steps: int, epochs: int, lr: float,
                          only: torch.Tensor | None = None, adapt_on: str = "train") -> ClientTests:
        """Fine-tune ``start`` [C, P] (only the ``only`` entries move) on minibatches of each
        client's ``adapt_on`` rows (train or test), then test each client's model on its own test rows
        (``start`` itself when ``steps`` and ``epochs`` are both 0)."""
        params = start
        if steps > 0 or epochs > 0:
            plan = ctx.plan(None if epochs > 0 else steps, getattr(self.cfg, "batch_size", 1), epochs, rows=adapt_on)
            weight_decay = getattr(self.cfg, "weight_decay", 0.0)
            params = local_train(start, ctx.oracle(plan), ctx.transform(plan, lr, weight_decay=weight_decay,
                                                                        only=only)).params
        loss_sum, correct, rows = [], [], []
        with torch.no_grad():
            for p, (_, lo, hi) in zip(params, ctx.data.offsets):
                logits = ctx.model.logits(p, ctx.data.features[lo:hi])
                y = ctx.data.labels[lo:hi]
                loss_sum.append(F.cross_entropy(logits, y, reduction="sum").item())
                correct.append(int((logits.argmax(1) == y).sum()))
                rows.append(int(hi - lo))
        return ClientTests(ctx.client_ids, np.array(loss_sum), np.array(correct), np.array(rows))

    # ------------------------------------------------------------------ cost

    def local_steps_of(self, sizes: np.ndarray, client_steps: np.ndarray) -> np.ndarray:
        """Local steps per client (E_k when the unreliable-agent model sets one), or NaN where epochs decide."""
        steps = self.cfg.local_steps
        fallback = np.full(len(sizes), np.nan if steps is None else float(steps))
        return np.where(client_steps > 0, client_steps, fallback)

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        """Samples a task processes, per client (the system model's compute time is work ÷ speed):
        the local steps' samples, one gradient each (an algorithm that takes more overrides this)."""
        return self.local_samples(sizes, client_steps)

    def local_samples(self, sizes: np.ndarray, client_steps: np.ndarray, full_batch: bool = False) -> np.ndarray:
        """Samples that one pass of local steps touches: steps × batch (the whole training set per
        step for full-batch and exact gradients), or epochs × rows."""
        steps = self.local_steps_of(sizes, client_steps)
        per_step = sizes if (full_batch or self.env.quadratic) else np.minimum(getattr(self.cfg, "batch_size", 1), sizes)
        epochs = getattr(self.cfg, "local_epochs", 1) * sizes
        return np.where(np.isnan(steps), epochs, steps * per_step).astype(np.float64, copy=False)

    def upload_size(self, payload: dict) -> int:
        """Numbers each client sends to the server per task (the update's entries)."""
        return self.update_size()
