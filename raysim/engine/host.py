"""ClientHost: runs tasks of many virtual clients in one process (a ClientActor, or in-process)."""

from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
from raysim.scenario import Scenario

from raysim.algorithms import ClientContext, RowData, make_algorithm
from raysim.algorithms.oracles import Participation
from raysim.data import FederatedDataset, QuadraticProblem, open_dataset
from raysim.engine.evaluation import client_tests
from raysim.models import build_model
from raysim.pipeline import build as pipelines
from raysim.pipeline.client import run_client_stages
from raysim.streams import Purpose, streams
from raysim.system import SystemModel
from raysim.threads import torch_threads


@dataclass(frozen=True)
class Task:
    """Work for a group of clients, run together (vectorized): ``op`` is 'train', 'personalize' or
    'evaluate' (the global model on the clients' test rows); per client, ``counters`` numbers its
    dispatch (the round in synchronous mode) and seeds its RNG, and ``versions`` names the payload
    (model version) it starts from. ``states`` holds each client's kept state for stateful
    algorithms (a dict of tensors, or None on a first visit)."""

    op: str
    client_ids: tuple
    counters: tuple
    versions: tuple
    states: tuple | None = None


def deterministic_cuda() -> None:
    """Make this process's CUDA kernels deterministic, so that a client's update is the same bytes
    whichever actor (and GPU share) computes it: cuBLAS with a fixed workspace (the variable must be
    set before cuBLAS starts), cuDNN without autotuning, and an error rather than a silently
    nondeterministic kernel (``torch.use_deterministic_algorithms``)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)


class ClientHost:
    """Hosts every virtual client: the data set (a zero-copy view of the Arrow table, or a
    generator's law that builds a client's rows when it trains), the model structure and the
    algorithm's client code. Any host can run any client."""

    def __init__(self, cfg: Scenario, table: pa.Table, actor_index: int = 0, device: str = "cpu"):
        self.cfg, self.actor_index, self.device = cfg, actor_index, torch.device(device)
        if self.device.type == "cuda":
            deterministic_cuda()
        self.dataset = open_dataset(table)
        self.problem = self.dataset if isinstance(self.dataset, QuadraticProblem) else None
        self.model = build_model(cfg.model, self.dataset.feature_shape, self.dataset.num_classes,
                                 cfg.seed).to(self.device)
        self.algorithm = make_algorithm(cfg, self.model, self.problem, self.dataset.num_clients)
        self.client_stages = pipelines.client_stages(cfg)  # what clients do to their updates before upload
        profile = SystemModel(cfg.system, self.dataset.num_clients, cfg.seed).profile
        unreliable = cfg.system.unreliable
        self.participation = profile["participation"] if (profile["participation"] < 1).any() else None
        self.local_steps = profile["local_steps"] if (profile["local_steps"] > 0).any() else None
        self.noise = None if unreliable.gradient_noise == "none" else (unreliable.gradient_noise,
                                                                       unreliable.noise_scale)
        self.per_round_coins, self.normalize_steps = unreliable.coin == "round", unreliable.normalize_steps
        self.flips_labels = profile["byzantine"] if cfg.system.byzantine.attack == "label_flip" else None
        self._preparing = None  # the thread building the rows of the clients expected next
        self.table_rows = None  # a shared table's features, labels and offsets (on this host's device)
        if isinstance(self.dataset, FederatedDataset):
            with warnings.catch_warnings():  # the Arrow buffer is read-only; client code never writes to it
                warnings.simplefilter("ignore", UserWarning)
                features = torch.from_numpy(self.dataset.features())
                labels = torch.from_numpy(self.dataset.labels())
            self.table_rows = (features.reshape(-1, *self.dataset.feature_shape).to(self.device),
                               labels.to(self.device), self.dataset.offsets())

    def data(self, ids: np.ndarray):
        """The data of a task's clients: the quadratic problem (clients are rows of sufficient
        statistics), or their rows (a view of the shared table, or built on demand)."""
        if self.problem is not None:
            return self.problem
        if self.table_rows is not None:
            features, labels, offsets = self.table_rows
            return RowData(features, labels, offsets[ids])
        rows = self.dataset.rows_of(ids)
        return RowData(torch.from_numpy(rows.features).reshape(-1, *self.dataset.feature_shape).to(self.device),
                       torch.from_numpy(rows.labels).to(self.device), rows.offsets)

    def run(self, payloads: dict, tasks: list, prepare: tuple = ()) -> list:
        """Run tasks in order, each client from ``payloads[version]``; one result per task
        (ClientUpdates, or ClientTests). Then, with data built on demand, a background thread
        builds the rows of the clients in ``prepare`` (those this host will likely train next)
        while the host waits for its next call; that call waits for it first, so the data set
        is never used by two threads at once."""
        self.settle()
        with torch_threads(self.cfg.runtime.torch_threads):
            results = [self._run_one([payloads[v] for v in task.versions], task) for task in tasks]
        if prepare and self.dataset.on_demand:
            self._preparing = threading.Thread(target=self._build_rows, args=(prepare,), daemon=True,
                                               name="raysim-prepare-rows")
            self._preparing.start()
        return results

    def settle(self) -> None:
        """Wait for the background work :meth:`run` left (the rows it was building)."""
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None

    def _build_rows(self, client_ids: tuple) -> None:
        """Put the data of ``client_ids`` in the data set's cache."""
        self.dataset.clients(client_ids)

    def _run_one(self, payloads: list, task: Task):
        ids = np.asarray(task.client_ids, dtype=np.int64)
        if task.op == "evaluate":  # the global model over the clients' test rows (eval.where: actors)
            return client_tests(self.model, payloads[0]["params"].to(self.device), self.data(ids), ids)
        purpose = Purpose.CLIENT_TRAIN if task.op == "train" else Purpose.CLIENT_PERSONALIZE
        rngs = streams(self.cfg.seed, purpose, np.stack([ids, np.asarray(task.counters, dtype=np.int64)], 1))
        decay = getattr(self.cfg.algorithm, "lr_decay", 1.0)  # the local step size's, per server step
        ctx = ClientContext(ids, rngs, self.model, self.data(ids), self.device, *self._unreliable(ids, task.op),
                            states=None if task.states is None else list(task.states),
                            label_flip=self._label_flip(ids, task.op),
                            step_scale=decay ** np.asarray(task.versions, dtype=np.float64)
                            if task.op == "train" and decay != 1.0 else None)
        if task.op == "personalize":
            ev = self.cfg.eval
            return self.algorithm.personalize(payloads, ctx, ev.personalized_steps, ev.personalized_epochs,
                                              ev.personalized_lr or self.algorithm.adaptation_lr(), ev.adapt_on)
        began = time.perf_counter()
        out = run_client_stages(self.client_stages, self.algorithm.client_update(payloads, ctx), ctx, payloads)
        wall = time.perf_counter() - began
        out.compute_seconds = wall * ctx.train_sizes / ctx.train_sizes.sum()
        out.actor = np.full(len(ids), self.actor_index, dtype=np.int64)
        return out

    def _unreliable(self, ids: np.ndarray, op: str) -> tuple:
        """(participation, local steps, noise, normalized steps) of these clients under the
        unreliable-agent model (ClientContext's fields); training only."""
        if op != "train":
            return None, None, None, False
        return (None if self.participation is None else Participation(self.participation[ids], self.per_round_coins),
                None if self.local_steps is None else self.local_steps[ids], self.noise, self.normalize_steps)

    def _label_flip(self, ids: np.ndarray, op: str) -> tuple | None:
        """ClientContext's ``label_flip`` when Byzantine clients of this task train on flipped labels."""
        if op != "train" or self.flips_labels is None or not self.flips_labels[ids].any():
            return None
        return torch.from_numpy(self.flips_labels[ids]), self.dataset.num_classes

    def info(self) -> dict:
        """Where this host runs: its device and torch thread count."""
        return {"actor": self.actor_index, "device": str(self.device),
                "torch_threads": self.cfg.runtime.torch_threads}
