"""Synchronous rounds: sample clients, run their updates, aggregate in client-id order."""

from __future__ import annotations

import time

import numpy as np

from raysim.algorithms import ClientUpdates
from raysim.engine import rng
from raysim.engine.dispatch import clients_per_task, make_tasks, run_tasks
from raysim.errors import DivergenceError


def sample_clients(seed: int, round_index: int, num_clients: int, k: int) -> np.ndarray:
    """The round's participants: ``k`` of ``num_clients`` uniformly without replacement, sorted."""
    return np.sort(rng.stream(seed, rng.SAMPLING, round_index).choice(num_clients, size=k, replace=False))


class SyncDriver:
    """Runs ``execution.rounds`` synchronous rounds; calls ``on_round`` after each."""

    def __init__(self, cfg, algorithm, runtime, train_sizes: np.ndarray, num_clients: int):
        self.cfg, self.algorithm, self.runtime = cfg, algorithm, runtime
        self.train_sizes, self.num_clients = train_sizes, num_clients

    def run(self, state: dict, on_round) -> dict:
        """Train from ``state``; ``on_round(round, state, updates, round_wall)`` logs each round."""
        ex = self.cfg.execution
        for r in range(ex.rounds):
            began = time.perf_counter()
            clients = sample_clients(self.cfg.seed, r, self.num_clients, ex.clients_per_round)
            handle = self.runtime.broadcast(self.algorithm.payload(state))
            tasks = make_tasks("train", clients, self.train_sizes, r, clients_per_task(self.cfg))
            updates = ClientUpdates.concat(run_tasks(self.runtime, handle, tasks, self.train_sizes))
            diverged = _first_diverged(updates)
            if diverged is None:
                state = self.algorithm.aggregate(state, updates)
            on_round(r + 1, state, updates, time.perf_counter() - began)
            if diverged is not None:
                raise DivergenceError(
                    f"round {r + 1}: client {updates.client_ids[diverged]} diverged "
                    f"(train_loss={updates.train_loss[diverged]}, non-finite update); "
                    f"try a smaller algorithm.lr (now {self.cfg.algorithm.lr})")
        return state


def _first_diverged(updates: ClientUpdates):
    """Index (in client-id order) of the first client with a non-finite loss or update, or None."""
    bad = ~np.isfinite(updates.train_loss)
    for tensor in updates.tensors.values():
        bad |= ~tensor.reshape(len(bad), -1).isfinite().all(1).numpy()
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else None
