"""A run's evaluation: when the global model is tested and by whom (the driver or the client hosts),
personalized evaluation, and the diagnostics of the server state that each rounds row holds."""

from __future__ import annotations

import math
import time
from typing import Iterable, Iterator

import numpy as np

from raysim.algorithms.base import Algorithm
from raysim.engine.dispatch import iter_tasks, run_tasks, task_chunks
from raysim.engine.evaluation import (CurvatureEvaluator, DeployedLoss, GlobalEvaluator, PooledTests,
                                      QuadraticEvaluator)
from raysim.streams import Purpose, stream

SHOWN_AFTER = 2.0  # seconds: an evaluation that lasts longer shows its own progress bar (on a terminal)
EVAL_COLUMNS = ("test_loss", "test_accuracy", "personalized_accuracy", "personalized_accuracy_mean",
                "personalized_accuracy_ci95", "personalized_accuracy_p10", "personalized_accuracy_std",
                "new_client_accuracy", "new_client_personalized_accuracy")


def new_clients(cfg, num_clients: int) -> np.ndarray:
    """The clients held out of training (``eval.new_clients`` of them, seeded), in id order."""
    k = cfg.eval.new_clients
    if not k:
        return np.empty(0, dtype=np.int64)
    return np.sort(stream(cfg.seed, Purpose.NEW_CLIENTS).choice(num_clients, k, replace=False))


def evaluated_clients(cfg, num_clients: int) -> np.ndarray:
    """The clients global and personalized evaluation test: all that train (every client but the
    held-out :func:`new_clients`), or a seeded sample of ``eval.clients`` of them (the same at every
    evaluation), in id order."""
    k, held_out = cfg.eval.clients, new_clients(cfg, num_clients)
    training = np.setdiff1d(np.arange(num_clients), held_out) if len(held_out) else np.arange(num_clients)
    if k is None or k >= len(training):
        return training
    return np.sort(training[stream(cfg.seed, Purpose.EVAL_CLIENTS).choice(len(training), k, replace=False)])


def evaluates_on_hosts(cfg) -> bool:
    """Whether the client hosts test the global model (``eval.where``; 'auto': when the actors have
    GPUs and rounds are synchronous, since an asynchronous run's evaluation calls would queue
    behind every task in flight)."""
    if cfg.eval.where == "auto":
        return cfg.runtime.gpus_per_actor > 0 and cfg.execution.mode == "sync"
    return cfg.eval.where == "actors"


class Evaluation:
    """The evaluations of the run that ``run`` (the Scheduler) moves forward: global test loss and
    accuracy and personalized accuracy every ``eval.every`` server steps and at the last, and the
    diagnostics of every server step. ``last``: the latest evaluation ({column: value} of
    :data:`EVAL_COLUMNS`), kept in the run state. ``problem``: the quadratic problem the data set is
    (None: none); ``initial``: the initial parameters."""

    def __init__(self, run, problem, initial):
        cfg, dataset, algorithm = run.cfg, run.dataset, run.algorithm
        self.run, self.cfg = run, cfg
        self.clients = evaluated_clients(cfg, dataset.num_clients)
        self.new = new_clients(cfg, dataset.num_clients)
        self.on_driver = None if problem is not None or evaluates_on_hosts(cfg) else GlobalEvaluator(
            run.model, dataset, cfg.runtime.torch_threads)  # else: the hosts test
        if problem is None:  # a chunk of tasks holds the rows of data.cache_mb (per host on the hosts)
            self.client_rows = dataset.train_sizes() + dataset.test_sizes()
            self.chunk_rows = int(cfg.data.cache_mb * 2 ** 20) // (4 * dataset.num_features + 8)
        self.quadratic = None if problem is None else QuadraticEvaluator(problem, algorithm.personalised, initial)
        deploys_own = type(algorithm).deployed is not Algorithm.deployed  # FFGG: θ with its fine-tuned w
        self.deployed = None if problem is None or not deploys_own else DeployedLoss(
            problem, run.model, algorithm, cfg.seed, cfg.runtime.torch_threads)
        self.curvature = None if not cfg.eval.curvature else CurvatureEvaluator(
            run.model, dataset, cfg.system.unreliable.weights == "uniform",
            getattr(cfg.algorithm, "weight_decay", 0.0), cfg.runtime.torch_threads)
        self.last = dict.fromkeys(EVAL_COLUMNS, math.nan)

    def is_due(self, step: int) -> bool:
        """Whether server step ``step`` is one of every ``eval.every`` (0: none but the last)."""
        every = self.cfg.eval.every
        return every > 0 and step % every == 0

    def if_due(self, step: int, final: bool = False) -> dict:
        """Evaluate the global model when ``step`` is an evaluation step (or ``final``): {column:
        value} of :data:`EVAL_COLUMNS` (NaN: not evaluated) and ``eval_seconds``, the wall time
        that took (0 when nothing was due)."""
        began = time.perf_counter()
        row = dict.fromkeys(EVAL_COLUMNS, math.nan)
        if (final or self.is_due(step)) and self.quadratic is None:
            params = self.run.algorithm.global_params(self.run.state)
            row["test_loss"], row["test_accuracy"] = self._test(params, self.clients)
            row.update(self._personalized(self.clients))
            if len(self.new):
                row["new_client_accuracy"] = self._test(params, self.new)[1]
                row["new_client_personalized_accuracy"] = self._personalized(self.new).get("personalized_accuracy",
                                                                                          math.nan)
            self.last.update(row)
        row["eval_seconds"] = time.perf_counter() - began
        return row

    def _chunks(self, op: str, clients: np.ndarray, hosts: int = 1) -> Iterator[list]:
        """``clients`` grouped into tasks (of ``op`` 'evaluate' or 'personalize', from the current
        model version), a chunk of tasks at a time: tasks whose clients' rows (train and test, what
        building them on demand takes) fit ``data.cache_mb``, per host for ``hosts``."""
        run = self.run
        tasks = iter_tasks(op, clients, run.train_sizes, 0, run.task_size, run.version)
        return task_chunks(tasks, self.client_rows, hosts * self.chunk_rows)

    def _shown(self, results: Iterable[list], what: str, clients: np.ndarray) -> Iterator[list]:
        """``results`` (a list of ClientTests per chunk), with a progress bar over ``clients`` on a
        terminal once ``what`` lasts :data:`SHOWN_AFTER` seconds."""
        from tqdm import tqdm

        with tqdm(total=len(clients), desc=what, unit="client", delay=SHOWN_AFTER, leave=False,
                  disable=None, dynamic_ncols=True) as bar:
            for tests in results:
                yield tests
                bar.update(sum(len(t.client_ids) for t in tests))

    def _test(self, params, clients: np.ndarray) -> tuple[float, float]:
        """(test loss, test accuracy) of the global model ``params`` on ``clients``: on the driver, or
        as 'evaluate' tasks on the client hosts, which give the same bits on the same kind of device."""
        run = self.run
        if self.on_driver is not None:
            results = self.on_driver.tests(params, self._chunks("evaluate", clients))
        else:
            handle = {run.version: run.runtime.broadcast({"params": params})}
            results = (run_tasks(run.runtime, handle, chunk, run.train_sizes)
                       for chunk in self._chunks("evaluate", clients, run.runtime.num_actors))
        pooled = PooledTests(clients)
        for tests in self._shown(results, "evaluating", clients):
            for client_tests in tests:
                pooled.add(client_tests)
        return pooled.result()

    def _personalized(self, clients: np.ndarray) -> dict:
        """Accuracy after each of ``clients`` adapts the global model (``eval.personalized_*``, the
        method's own adaptation, from the state it keeps; an algorithm whose clients keep models of
        their own, such as Ditto, tests those, adapted or not) and tests on its own rows: pooled over
        test rows, and over clients (those with test rows) the mean with its 95% confidence
        half-width (Student's t), the worst decile (the 10th percentile) and the standard deviation.
        Each tested client's accuracy is kept (8 bytes a client), in task order."""
        ev, run = self.cfg.eval, self.run
        if ev.personalized_steps == 0 and ev.personalized_epochs == 0 and not run.algorithm.personal_models:
            return {}
        accuracy, tested, correct, rows = np.empty(len(clients)), 0, 0, 0
        results = (run_tasks(run.runtime, run.payload_handle(), run.with_states(chunk), run.train_sizes)
                   for chunk in self._chunks("personalize", clients, run.runtime.num_actors))
        for tests in self._shown(results, "personalizing", clients):
            for p in tests:
                has_rows = p.test_rows > 0
                n = int(has_rows.sum())
                accuracy[tested:tested + n] = p.test_correct[has_rows] / p.test_rows[has_rows]
                tested, correct, rows = tested + n, correct + int(p.test_correct.sum()), rows + int(p.test_rows.sum())
        if tested == 0:
            return {}
        from scipy import stats  # only runs with personalized evaluation pay for its import

        accuracy = accuracy[:tested]
        ci = (stats.t.ppf(0.975, tested - 1) * accuracy.std(ddof=1) / math.sqrt(tested)) if tested > 1 else math.nan
        return {"personalized_accuracy": correct / rows,  # plain floats: a checkpoint
                "personalized_accuracy_mean": float(accuracy.mean()),  # holds them (torch.load, weights only)
                "personalized_accuracy_ci95": float(ci),
                "personalized_accuracy_p10": float(np.percentile(accuracy, 10)),
                "personalized_accuracy_std": float(accuracy.std(ddof=1)) if tested > 1 else math.nan}

    def diagnostics(self) -> dict:
        """The numbers the algorithm's last server step reported (its ``server_diagnostics``, such
        as FFGG's ‖F(θ)‖² estimate grad_norm_sq); rel_error, grad_norm_sq and loss_gap of the
        current server state, exact, for quadratic problems, and at the evaluation steps the loss gap
        at the models the clients deploy (deployed_loss_gap) where they fine-tune their own. With
        ``eval.curvature``, at the evaluation steps (every ``eval.every`` server steps and the last),
        the exact objective, grad_norm_sq = ‖∇J‖², hessian_min_eig and the global model's parameters."""
        run, algorithm = self.run, self.run.algorithm
        row = algorithm.diagnostics_of(run.state)
        if self.quadratic is not None:
            row.update(self.quadratic(algorithm.global_params(run.state),
                                      algorithm.client_models(run.state, run.client_state)))
        due = run.done or self.is_due(run.version)
        if self.deployed is not None and due:
            row["deployed_loss_gap"] = self.deployed(algorithm.global_params(run.state), run.version)
        if self.curvature is not None and due:
            row.update(self.curvature(algorithm.global_params(run.state)))
        return row
