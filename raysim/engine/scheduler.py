"""The Scheduler: owns the virtual clock, the server state and the dispatch of client tasks.

It runs the same way in-process (``runtime.backend: local``) and inside the
SchedulerActor (Ray). The driver only calls :meth:`Scheduler.advance` and writes
the rows it returns; nothing here depends on how fast the host is.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import pyarrow as pa
from raysim.scenario import Scenario

from raysim.algorithms import make_algorithm
from raysim.data import QuadraticProblem, open_dataset
from raysim.engine.asynchronous import AsyncUpdates
from raysim.scenario.schema import clients_per_task
from raysim.engine.events import event_columns
from raysim.engine.payloads import PayloadCache
from raysim.engine.progress import Progress
from raysim.engine.rounds import round_row
from raysim.engine.run_evaluation import Evaluation
from raysim.engine.run_state import RunState
from raysim.engine.selection import Selection, shares
from raysim.engine.server import Server
from raysim.engine.sync import SyncRounds
from raysim.errors import NoClientAvailable, RunError
from raysim.models import build_model
from raysim.models.flat import sha256
from raysim.pipeline.build import server_pipeline
from raysim.privacy.accounting import Accountant
from raysim.streams import Purpose, stream
from raysim.system import SystemModel
from raysim.threads import torch_threads

DURATION_SAMPLE = 10_000  # clients whose first task's duration :func:`task_durations` draws


def task_durations(scenario: Scenario, table: pa.Table) -> np.ndarray:
    """Virtual seconds of the first task of the first :data:`DURATION_SAMPLE` clients (or all), drawn
    as the scheduler draws a task's duration (:meth:`Scheduler.timing`): for ``raysim validate`` to
    show the time scale a deadline is set against."""
    scheduler = Scheduler(scenario, table, runtime=None)
    clients = np.arange(min(scheduler.dataset.num_clients, DURATION_SAMPLE))
    return scheduler.timing(clients, np.zeros(len(clients), dtype=np.int64)).duration_s


class Scheduler:
    """Virtual time, server state, dispatch; :meth:`advance` runs server steps for a while."""

    def __init__(self, cfg: Scenario, table: pa.Table, runtime):
        self.cfg = cfg
        self.runtime = runtime
        self.dataset = open_dataset(table)
        problem = self.dataset if isinstance(self.dataset, QuadraticProblem) else None
        self.train_sizes = self.dataset.train_sizes()
        self.builds_rows = self.dataset.on_demand  # hosts build client data on demand
        self.model = build_model(cfg.model, self.dataset.feature_shape, self.dataset.num_classes, cfg.seed)
        self.algorithm = make_algorithm(cfg, self.model, problem, self.dataset.num_clients)
        self.system = SystemModel(cfg.system, self.dataset.num_clients, cfg.seed)
        initial = self.model.initial_vector()
        self.task_size = clients_per_task(cfg)
        self.server = Server(server_pipeline(cfg, self.algorithm, self.system.profile["byzantine"]),
                             self.algorithm.init(initial))
        self.client_diagnostics = (*self.algorithm.client_diagnostics, *self.server.pipeline.client_diagnostics)
        self.accountant = None if cfg.privacy.mechanism == "none" else Accountant(
            cfg, self.dataset.num_clients, cfg.privacy.noise_multiplier)
        self.client_state: dict = {}  # client id -> kept state (a dict of tensors) of a stateful algorithm
        self.selection = Selection(cfg, self.train_sizes, self.uniform_weights)
        self.selection_state = self.selection.init()
        self.progress = Progress()
        self.evaluation = Evaluation(self, problem, initial)
        held_out = self.evaluation.new
        self.held_out = None  # a mask over all clients of those held out of training (eval.new_clients)
        if len(held_out):
            self.held_out = np.zeros(self.dataset.num_clients, dtype=bool)
            self.held_out[held_out] = True
        self.began = time.perf_counter()
        self.stop_version = None  # the server version the current advance must not pass (None: any)
        self._rounds: list = []
        self._events: list = []
        self.value_bytes = initial.element_size()
        self._sized: tuple = (None, None)  # (payload, its task_bytes): the last payload sized
        self.loop = SyncRounds(self) if cfg.execution.mode == "sync" else AsyncUpdates(self)
        self.payloads = PayloadCache(self.server.payload, runtime, self.loop.versions_in_use)

    @property
    def state(self):
        """The server state (parameters, optimizer state, the algorithm's state)."""
        return self.server.state

    @property
    def done(self) -> bool:
        return self.progress.done

    @property
    def version(self) -> int:
        return self.progress.version

    @property
    def clock(self) -> float:
        return self.progress.clock

    # ------------------------------------------------------------------ driver API

    def advance(self, budget_seconds: float, stop_version: int | None = None) -> dict:
        """Run server steps for about ``budget_seconds`` of wall time (at least one step), and
        never past server version ``stop_version`` (where the driver takes a checkpoint).

        Returns the rounds and events rows produced, the hosts that died (see Runtime.deaths),
        whether the run is done, the error that ended it (if any), the latest evaluation, the
        number of applied updates, the server version and the scheduler's wall seconds.
        """
        until = time.perf_counter() + budget_seconds
        error, self.stop_version = None, stop_version
        try:
            # the server's tensor work takes the clients' thread count: a wider pool only spins beside busy actors
            with torch_threads(self.cfg.runtime.torch_threads):
                while not self.done and (stop_version is None or self.version < stop_version):
                    self.loop.step()
                    if time.perf_counter() >= until:
                        break
        except RunError as exc:  # reported with the rows made so far
            self.progress.end()
            error = exc
        self._log_lost_tasks()
        events = None
        if self._events:
            events = {k: np.concatenate([e[k] for e in self._events]) for k in self._events[0]}
            nodes = np.array(list(self.runtime.nodes) + [""], dtype=object)  # actor -1: never computed
            events["node"] = nodes[events["actor"]].astype(str)
            events.update(self.system.profile_of(events["client_id"]))
        out = {"rounds": self._rounds, "events": events, "deaths": self.runtime.deaths(), "done": self.done,
               "error": error, "last_eval": dict(self.evaluation.last), "applied": self.progress.applied,
               "version": self.version,
               "wall": time.perf_counter() - self.began}
        self._rounds, self._events = [], []
        return out

    def finish(self) -> dict:
        """Final parameters, their SHA-256 and the run's virtual-time totals."""
        params = self.algorithm.global_params(self.state)
        return {"params": params.clone(), "model_sha256": sha256(params), "virtual_time": self.clock,
                "server_steps": self.version, "client_updates": self.progress.applied,
                "bytes_down": self.progress.bytes_down, "bytes_up": self.progress.bytes_up,
                "system": self.system.describe(), "selection": self.selection.describe(self.selection_state),
                **self.privacy_spent()}

    def _ledger(self) -> tuple:
        """(the privacy ledger stage, its state)."""
        ledger = self.server.pipeline.stage("privacy_ledger")
        return ledger, self.server.stage_states[ledger.name]

    def privacy_spent(self) -> dict:
        """With differential privacy: ``privacy`` (the summary's section: ε spent, accountant, events,
        assumptions) and ``privacy_ledger`` (each client's participations and ε, privacy.parquet's
        columns); nothing without."""
        if self.accountant is None:
            return {}
        (ledger, state), n = self._ledger(), self.dataset.num_clients
        counts, exposures = np.zeros(n, dtype=np.int64), np.zeros(n)
        for client, taken in ledger.entries(state):
            counts[client] = ledger.participations(taken)
            exposures[client] = self.accountant.exposure(taken, self.version)
        return {"privacy": self.accountant.describe(self.version, counts, exposures),
                "privacy_ledger": {"client_id": np.arange(n), "participations": counts,
                                   "epsilon": self.accountant.client_epsilons(self.version, exposures)}}

    def epsilon(self) -> float:
        """ε spent so far at the run's δ, by the most exposed client (NaN without differential privacy)."""
        if self.accountant is None:
            return math.nan
        ledger, state = self._ledger()
        if not ledger.versions:
            return self.accountant.epsilon(self.version, float(state["most"]))
        exposures = (self.accountant.exposure(taken, self.version) for _, taken in ledger.entries(state))
        return self.accountant.epsilon(self.version, max(exposures, default=0.0))

    def run_state(self) -> RunState:
        """Everything the run needs to continue, as one object (call it between :meth:`advance` calls)."""
        p = self.progress
        return RunState(server=self.state, client_state=dict(self.client_state), clock=float(p.clock),
                        version=p.version, counter=p.counter, applied=p.applied, last_eval=dict(self.evaluation.last),
                        done=p.done, loop=self.loop.snapshot(), pipeline=dict(self.server.stage_states),
                        bytes_down=p.bytes_down, bytes_up=p.bytes_up, selection=dict(self.selection_state))

    def restore(self, state: RunState, wall_seconds: float = 0.0) -> None:
        """Continue from ``state``, taken by :meth:`run_state` of a scheduler of the same scenario
        (rows not yet returned by :meth:`advance` are dropped); the ``wall_time`` of later rows
        goes on from ``wall_seconds`` (the wall time the state was taken at)."""
        self.began = time.perf_counter() - wall_seconds
        self.server.restore(state.server, state.pipeline)
        self.client_state = dict(state.client_state)
        self.selection_state = dict(state.selection)
        self.progress = Progress(state.version, state.clock, state.counter, state.applied, state.done,
                                 state.bytes_down, state.bytes_up)
        self.evaluation.last = dict(state.last_eval)
        self._rounds, self._events = [], []
        self.payloads.clear()
        self.loop.restore(state.loop)

    # ------------------------------------------------------------------ services for the loops

    def payload_handle(self) -> dict:
        """{version: handle} of the current model, broadcast once per version."""
        return self.payloads.handle(self.version, self.payload())

    def payload(self) -> dict:
        """What clients receive from the current server state (built once per version)."""
        return self.payloads.payload(self.version)

    def round_size(self, counter: int) -> int:
        """The clients a synchronous round draws at sampling ``counter``: ``ceil(over_selection ·
        clients_per_round)``, or under Poisson sampling a Binomial(N, clients_per_round / N) number
        of them (a uniform subset of that size: each client takes part with that probability,
        independently of the others)."""
        ex, n = self.cfg.execution, self.dataset.num_clients
        if ex.sampling == "poisson":
            return int(stream(self.cfg.seed, Purpose.POISSON_ROUND, counter).binomial(n, ex.clients_per_round / n))
        return math.ceil(ex.over_selection * ex.clients_per_round)

    def sample(self, k: int, exclude=None, excluded_count: int | None = None) -> np.ndarray:
        """Up to ``k`` clients available now and not excluded (see :meth:`SystemModel.sample_available`);
        jumps the clock while nobody is available (none, without waiting, for ``k`` = 0)."""
        if k == 0:
            self.progress.draw()
            return np.empty(0, dtype=np.int64)
        for _ in range(1000):
            clients = self.sample_at(self.clock, self.progress.counter, k, exclude, excluded_count)
            self.progress.draw()
            if len(clients):
                return clients
            wake = self.system.next_available_time(self.clock)
            if math.isinf(wake):
                raise NoClientAvailable(
                    f"at virtual time {self.clock:g}: no client is available and none will ever be "
                    "(check system.availability)")
            self.progress.wait_until(wake)
        raise NoClientAvailable(f"at virtual time {self.clock:g}: no client available after 1000 tries "
                                "(check system.availability)")

    def select(self, k: int) -> np.ndarray:
        """The ``k`` clients a synchronous round samples (sorted by id), as ``execution.selection``
        chooses them; one dispatch counter a round, whatever the policy."""
        if self.selection.kind == "uniform":
            return self.sample(k)
        counter = self.progress.counter
        clients, self.selection_state = self.selection.choose(self.selection_state, self.sample, self._available,
                                                              k, counter)
        if self.progress.counter == counter:  # the policy did not sample: the round still takes its counter
            self.progress.draw()
        return clients

    def observe_round(self, reported: np.ndarray, losses: np.ndarray, durations: np.ndarray, late: np.ndarray,
                      late_durations: np.ndarray) -> None:
        """Tell the selection policy what a round showed (:meth:`Selection.observe`)."""
        self.selection_state = self.selection.observe(self.selection_state, reported, losses, durations, late,
                                                      late_durations)

    def _available(self) -> np.ndarray:
        """The ids of every client available now (and not held out of training)."""
        ids = np.arange(self.dataset.num_clients)
        ok = self.system.available(ids, self.clock, self.progress.counter)
        return ids[ok if self.held_out is None else ok & ~self.held_out]

    @property
    def uniform_weights(self) -> bool:
        """Whether updates are averaged with equal weights (``system.unreliable.weights``, or an
        algorithm that averages without weights) rather than by their samples."""
        return self.cfg.system.unreliable.weights == "uniform" or not self.algorithm.sample_weighted

    def sample_at(self, t: float, counter: int, k: int, exclude=None, excluded_count: int | None = None) -> np.ndarray:
        """The system model's sample (:meth:`SystemModel.sample_available`) of clients that train: the
        held-out clients of new-client evaluation are never drawn (synchronous rounds)."""
        if self.held_out is not None and exclude is None:
            exclude, excluded_count = self.held_out, len(self.evaluation.new)
        return self.system.sample_available(t, counter, k, exclude, excluded_count)

    def with_states(self, tasks: list) -> list:
        """Tasks carrying each client's kept state (stateful algorithms, and client stages that keep
        state: error feedback)."""
        if not (self.algorithm.stateful or self.server.pipeline.keeps_client_state):
            return tasks
        return [replace(t, states=tuple(self.client_state.get(c) for c in t.client_ids)) for t in tasks]

    def keep_states(self, updates) -> None:
        """Store the new client states that ``updates`` carry (and take them out of the updates)."""
        if updates.states:
            for i, c in enumerate(updates.client_ids.tolist()):
                self.client_state[c] = {name: rows[i].clone() for name, rows in updates.states.items()}
            updates.states = {}

    @property
    def judges_each_update(self) -> bool:
        """Whether a non-finite update stops the run (see :attr:`ServerPipeline.judges_each_update`)."""
        return self.server.pipeline.judges_each_update

    def aggregation_weights(self, updates) -> np.ndarray:
        """Weights p_k of the updates (summing to 1): by samples, or uniform (``system.unreliable.weights``,
        or an algorithm that averages without weights); under importance sampling p_k / π_k (see
        :mod:`.selection`), which sum to 1 only in expectation."""
        chosen = self.selection.weights(updates.client_ids, self.cfg.execution.clients_per_round)
        if chosen is not None:
            return chosen
        return shares(updates.samples, self.uniform_weights)

    def timing(self, clients: np.ndarray, counters: np.ndarray, draws: np.ndarray | None = None,
               bytes_up: np.ndarray | None = None):
        """Virtual durations of training tasks for ``clients`` dispatched with ``counters``, from the
        work and message sizes the algorithm declares for the current payload (``draws``: the
        tasks' :meth:`SystemModel.task_draws`, if drawn already; ``bytes_up``: each task's upload, if
        known exactly)."""
        payload = self.payload()
        work = self.algorithm.work(self.train_sizes[clients], self.system.profile["local_steps"][clients], payload)
        down, up = self.task_bytes(payload)
        return self.system.task_timing(clients, counters, work, down, up if bytes_up is None else bytes_up, draws,
                                       self.server.pipeline.round_trips)

    def task_bytes(self, payload: dict) -> tuple[int, int]:
        """(bytes a client receives, bytes it sends) for a task from ``payload``, as the pipeline
        encodes them (:meth:`ServerPipeline.download_bytes`, :meth:`ServerPipeline.upload_bytes`)."""
        if self._sized[0] is not payload:  # asked per event under FedAsync: once per payload
            down = self.server.pipeline.download_bytes(payload)
            up = self.server.pipeline.upload_bytes(self.algorithm.upload_size(payload), self.value_bytes)
            self._sized = (payload, (down, up))
        return self._sized[1]

    def log_round(self, updates, clients: int, samples: int, round_wall: float, evaluated: dict, **counts) -> None:
        """The rounds row of the server step just taken (:func:`round_row`), with ``evaluated`` (the
        evaluation's row), ``counts`` (of :data:`~.rounds.TASK_COUNTS`) and the evaluation's
        diagnostics. Its ``eval_seconds`` (evaluation and diagnostics) count in ``wall_time`` but not
        in ``updates_per_second``: ``round_wall`` includes the evaluation, which is taken out."""
        loss = (float(np.dot(updates.samples, updates.train_loss) / updates.samples.sum())
                if updates is not None and len(updates.client_ids) else math.nan)
        diagnosing = time.perf_counter()
        diagnostics = self.evaluation.diagnostics()
        now = time.perf_counter()
        training = round_wall - evaluated["eval_seconds"]
        epsilon = self.epsilon() if self.evaluation.is_due(self.version) or self.done else math.nan
        self._rounds.append(round_row(self.algorithm.server_diagnostics, {
            "round": self.version, "virtual_time": self.clock, "wall_time": now - self.began, "train_loss": loss,
            **evaluated, "clients": clients, "samples": samples,
            "updates_per_second": clients / training if training > 0 else math.nan,
            "eval_seconds": evaluated["eval_seconds"] + now - diagnosing, "epsilon": epsilon,
            "total_bytes_down": self.progress.bytes_down, "total_bytes_up": self.progress.bytes_up, **counts,
            **diagnostics}))

    def _log_lost_tasks(self) -> None:
        """One ``retried`` event row per client of each task that was run again because the
        actor running it died (its result, computed again, is the same)."""
        for actor, task in self.runtime.lost_tasks():
            ids = np.asarray(task.client_ids, dtype=np.int64)
            n = len(ids)
            self.log_events(
                {}, round=np.asarray(task.versions) + 1, client_id=ids, actor=np.full(n, actor),
                samples=self.train_sizes[ids], train_loss=np.full(n, math.nan), compute_seconds=np.zeros(n),
                virtual_start=np.full(n, math.nan), virtual_end=np.full(n, math.nan), model_version=task.versions,
                staleness=np.zeros(n), bytes_down=np.zeros(n), bytes_up=np.zeros(n), status=np.full(n, "retried"))

    def log_events(self, numbers: dict, **columns) -> None:
        """Event rows for client tasks that ended: the events schema's ``columns`` and the
        :attr:`client_diagnostics` from ``numbers`` (see :func:`event_columns`);
        :meth:`advance` adds the clients' system profile."""
        self._events.append(event_columns(self.client_diagnostics, numbers, **columns))

    def client_numbers(self, updates) -> dict:
        """{name: float64 [C]} of :attr:`client_diagnostics`: the algorithm's and the client stages'."""
        stages = {name: updates.diagnostics[name].reshape(-1).double().numpy()
                  for name in self.server.pipeline.client_diagnostics}
        return {**self.algorithm.client_numbers(updates), **stages}

    def client_columns(self, updates, rows: np.ndarray, n: int) -> dict:
        """The columns of :attr:`client_diagnostics` for ``n`` event rows: the numbers of
        ``updates`` at positions ``rows``, NaN elsewhere."""
        columns = {}
        for name, values in self.client_numbers(updates).items():
            columns[name] = np.full(n, math.nan)
            columns[name][rows] = values
        return columns
