"""The run state: everything a run needs to continue, as one object of plain content.

:meth:`Scheduler.run_state() <raysim.engine.scheduler.Scheduler.run_state>` takes a
:class:`RunState` between two server steps (any time :meth:`Scheduler.advance` has returned);
:meth:`Scheduler.restore` puts one into a scheduler built from the same scenario, and the run
goes on exactly as if it had never stopped: the same rows (wall-clock columns aside), events and
final ``model_sha256``, on any backend and number of actors.

What it holds: the server state (parameters, server optimizer, the algorithm's own state, last
diagnostics), each client's kept state (stateful algorithms), the virtual clock, the server
version, the dispatch counter, the applied updates, the latest evaluation, whether the run is done,
the states of the server pipeline's stages (:mod:`raysim.pipeline`: each client's momentum, the
honest updates an omniscient Byzantine attack under FedAsync still sees), the client-selection
policy's state (what it knows of each client it has seen), and the execution loop's
own state (:meth:`SyncRounds.snapshot`, :meth:`AsyncUpdates.snapshot`): nothing for synchronous
rounds; for asynchronous runs the tasks in flight, the FedBuff buffer not yet applied, the busy
clients and the payloads of the model versions those tasks start from. A task in flight is kept as
what defines it, never as a pending call: client work is a pure function of (seed, client,
dispatch counter, payload, client state), so a task whose result was not yet known is computed
again after a restore, with the same result.

Caches (the broadcast payloads, the system model's availability coins) are rebuilt. Wall-clock
time is not state: rows after a restore count wall time from the restoring scheduler's start.

:meth:`RunState.content` is plain content only (tensors, numbers, strings, lists, tuples, dicts;
numpy arrays become tensors of the same dtype), which a
:class:`~raysim.engine.checkpoint.Checkpoint` writes with ``torch.save`` and reads back with
``torch.load(weights_only=True)``: every tensor keeps its dtype and bytes, every float its bits. A
state shares tensors with the run it was taken from (they are never changed in place).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch

from raysim.algorithms import ClientUpdates, ServerState


@dataclass
class RunState:
    """A run between two server steps (see the module docstring)."""

    server: ServerState  # parameters, server optimizer state, the algorithm's state, last diagnostics
    client_state: dict  # client id -> kept state (a dict of tensors) of a stateful algorithm
    clock: float  # virtual seconds
    version: int  # server model version (server steps taken)
    counter: int  # dispatches so far (seeds each task's random streams with the client id)
    applied: int  # client updates applied
    last_eval: dict  # the latest evaluation: test loss and accuracy, personalized accuracies
    done: bool  # the run has ended
    loop: dict  # the execution loop's own state: plain content, see SyncRounds/AsyncUpdates.snapshot
    pipeline: dict = field(default_factory=dict)  # server stage name -> its state (raysim.pipeline)
    bytes_down: int = 0  # bytes the clients received so far
    bytes_up: int = 0  # bytes the clients sent so far
    selection: dict = field(default_factory=dict)  # the client-selection policy's state (raysim.engine.selection)

    def content(self) -> dict:
        """The state as plain content (what :meth:`save` writes)."""
        content = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**content, "server": {f.name: getattr(self.server, f.name) for f in fields(self.server)}}

    @classmethod
    def from_content(cls, content: dict) -> RunState:
        """The state that :meth:`content` gave."""
        return cls(**{**content, "server": ServerState(**content["server"])})


def pack_updates(updates: ClientUpdates) -> dict:
    """ClientUpdates as plain content: its numpy arrays become tensors of the same dtype and bytes."""
    arrays, other = {}, {}
    for f in fields(updates):
        value = getattr(updates, f.name)
        if isinstance(value, np.ndarray):
            arrays[f.name] = torch.from_numpy(value.copy())
        else:
            other[f.name] = value
    return {"arrays": arrays, "other": other}


def unpack_updates(packed: dict) -> ClientUpdates:
    """The ClientUpdates that :func:`pack_updates` packed."""
    return ClientUpdates(**packed["other"], **{name: t.numpy() for name, t in packed["arrays"].items()})
