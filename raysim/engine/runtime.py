"""The runtime protocol (where client tasks and the scheduler run) and the in-process runtime.

A runtime hosts ``num_actors`` ClientHosts and the Scheduler. The scheduler
broadcasts a payload once per model version and submits lists of tasks to hosts
by index; placement never changes results, only speed. ``actors.runtime.RayRuntime``
implements the same protocol with ClientActors and a SchedulerActor.
"""

from __future__ import annotations

from typing import Any, Protocol

from raysim.engine.host import ClientHost
from raysim.engine.scheduler import Scheduler


class Runtime(Protocol):
    """What the engine needs from a runtime."""

    num_actors: int
    nodes: list  # the node of each host

    def start(self) -> None:
        """Begin what takes long and needs no data (Ray's start-up); ``load`` calls it if needed."""

    def load(self, scenario, dataset):
        """Create the hosts of ``scenario`` (the plain dataclasses of a prepared scenario); the data
        set travels once. Returns the data set the driver should use from now on (the runtime's
        shared copy)."""

    def scheduler(self, scenario, dataset) -> Any:
        """Start the scheduler; it has ``advance(seconds, stop_version)`` and ``finish()`` (see Scheduler)."""

    def broadcast(self, payload: dict) -> Any:
        """Publish a payload once; returns a handle tasks refer to."""

    def submit(self, actor: int, handles: dict, tasks: list, prepare: tuple = ()) -> Any:
        """Start ``tasks`` on host ``actor`` (``handles``: model version -> broadcast handle);
        returns a pending result. ``prepare``: clients the host will likely train next, whose
        on-demand rows it may build once these tasks are done (results never depend on it)."""

    def gather(self, pending: list) -> list:
        """Wait for pending results; one list of task results per pending item."""

    def lost_tasks(self) -> list:
        """The ``(actor_index, task)`` pairs run again since the last call because the host
        running them died (their results are the same); forgets them."""

    def deaths(self) -> list:
        """The index of each host replaced since the last call, once per death; forgets them."""

    def describe(self) -> list:
        """One dict per host: actor index, device, node, GPU ids…"""

    def close(self) -> None:
        """Release the hosts."""


class LocalRuntime:
    """Runs every task in this process on one ClientHost (no Ray); used by unit tests
    and by ``runtime.backend: local``."""

    num_actors = 1
    nodes = ["local"]

    def __init__(self):
        self.host = None

    def start(self) -> None:
        """Nothing to start in-process."""

    def load(self, scenario, dataset):
        self.host = ClientHost(scenario, dataset.table)
        return dataset

    def scheduler(self, scenario, dataset) -> Scheduler:
        return Scheduler(scenario, dataset.table, self)

    def broadcast(self, payload: dict) -> dict:
        return payload

    def submit(self, actor: int, handles: dict, tasks: list, prepare: tuple = ()) -> list:
        """Run the tasks now; ``prepare`` is not used: in one process nothing waits in between."""
        return self.host.run(handles, tasks)

    def gather(self, pending: list) -> list:
        return pending

    def lost_tasks(self) -> list:
        """An in-process host never dies: nothing is ever run again."""
        return []

    def deaths(self) -> list:
        """An in-process host never dies."""
        return []

    def describe(self) -> list:
        return [dict(self.host.info(), node="local", gpu_ids=[])]

    def close(self) -> None:
        self.host = None
