"""What the server and clients exchange and keep: the server state, the clients' updates, their
test results, and the rows a task's clients train on."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class ServerState:
    """Everything the server keeps: the model, the server optimizer's state, the algorithm's own
    state (SCAFFOLD's control variate, FedDyn's h, round counters), the diagnostics of the
    last step (logged in rounds.parquet) and the aggregation rule's state (its step count, centered
    clipping's previous aggregate). Tensors and numbers only: it saves and loads whole."""

    params: torch.Tensor
    opt: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    aggregation: dict = field(default_factory=dict)


@dataclass
class ClientUpdates:
    """Per-client results of one or more tasks, one row per client. ``vector`` is what the
    aggregator reduces; ``extras`` are the other vectors sent to the server; ``states`` are
    the clients' new kept states (they never leave the client); ``diagnostics`` are
    measurements for the logs that are not part of the protocol (not sent, not counted)."""

    client_ids: np.ndarray  # [C] int64
    samples: np.ndarray  # [C] training samples the client holds
    train_loss: np.ndarray  # [C] mean loss of its local steps
    vector: torch.Tensor  # [C, U] float, on CPU
    extras: dict = field(default_factory=dict)  # name -> [C, ...]
    states: dict = field(default_factory=dict)  # name -> [C, ...]
    diagnostics: dict = field(default_factory=dict)  # name -> [C, ...]: read by the simulator, never sent
    compute_seconds: np.ndarray | None = None  # [C] wall seconds attributed to each client
    actor: np.ndarray | None = None  # [C] index of the actor that ran it

    def first_nonfinite(self):
        """Index of the first client (in row order) with a non-finite loss or update, or None."""
        hits = np.flatnonzero(self.nonfinite())
        return int(hits[0]) if len(hits) else None

    def nonfinite(self) -> np.ndarray:
        """[C] bool: whether each client's loss or update has a non-finite value."""
        bad = ~np.isfinite(self.train_loss)
        tensors = (self.vector, *self.extras.values())
        # a sum is finite only if every term is (a finite sum that overflows is checked row by row)
        if bad.any() or not all(math.isfinite(t.sum()) for t in tensors):
            for tensor in tensors:
                bad |= ~tensor.reshape(len(bad), -1).isfinite().all(1).numpy()
        return bad

    def __getstate__(self) -> dict:
        """Pickled with its tensors as numpy arrays: about 20 times cheaper both ways for the
        few large tensors a task returns (the tensors are on the CPU, see :meth:`ClientContext.updates`)."""
        return {k: _to_numpy(v) for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({k: _to_tensor(v) if k in _TENSOR_FIELDS else v for k, v in state.items()})

    def row(self, i: int) -> "ClientUpdates":
        """Row ``i`` alone: views of each field's rows i:i+1."""
        at = slice(i, i + 1)
        return ClientUpdates(self.client_ids[at], self.samples[at], self.train_loss[at], self.vector[at],
                             {k: t[at] for k, t in self.extras.items()}, {k: t[at] for k, t in self.states.items()},
                             {k: t[at] for k, t in self.diagnostics.items()}, self.compute_seconds[at], self.actor[at])

    @staticmethod
    def concat(parts: list) -> "ClientUpdates":
        """Join several tasks' results, sorted by client id (the aggregation order); one client's
        result is returned as it is."""
        if len(parts) == 1 and len(parts[0].client_ids) == 1:
            return parts[0]
        ids = np.concatenate([p.client_ids for p in parts])
        order = np.argsort(ids, kind="stable")
        rows = torch.from_numpy(order)
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])[order]
        joined = lambda tensors: torch.cat(tensors).index_select(0, rows)  # a copy either way: one, in id order
        tensors = lambda name: {k: joined([getattr(p, name)[k] for p in parts]) for k in getattr(parts[0], name)}
        return ClientUpdates(ids[order], cat("samples"), cat("train_loss"), joined([p.vector for p in parts]),
                             tensors("extras"), tensors("states"), tensors("diagnostics"), cat("compute_seconds"),
                             cat("actor"))


_TENSOR_FIELDS = ("vector", "extras", "states", "diagnostics")


def _to_numpy(value):
    """A tensor (or a dict of tensors) as numpy arrays; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {k: _to_numpy(v) for k, v in value.items()}
    return value


def _to_tensor(value):
    """:func:`_to_numpy` undone, on a writable copy (an unpickled array may be a read-only view of Ray's store)."""
    if isinstance(value, dict):
        return {k: _to_tensor(v) for k, v in value.items()}
    return torch.from_numpy(np.array(value))

@dataclass
class ClientTests:
    """Per-client test results: of the global model, or of each client's model after local fine-tuning."""

    client_ids: np.ndarray
    test_loss_sum: np.ndarray
    test_correct: np.ndarray
    test_rows: np.ndarray


@dataclass
class RowData:
    """The rows of a task's clients on a host: features and labels, and for each client of the
    task (in the task's order) its (train start, test start, test end) row numbers."""

    features: torch.Tensor
    labels: torch.Tensor
    offsets: np.ndarray
