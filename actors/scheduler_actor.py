"""SchedulerActor: the Scheduler (virtual clock, event queue, server state) as a Ray actor."""

from __future__ import annotations

import ray

from raysim.long_lived import long_lived


@ray.remote(num_cpus=0)
class SchedulerActor:
    """Owns the virtual clock and dispatches client tasks to the ClientActors (through an
    :class:`actors.runtime.ClientActorGroup`); the driver calls the Scheduler's methods below (through
    :class:`actors.runtime.RemoteScheduler`) and writes rows."""

    def __init__(self, scenario, table, client_actors):
        with long_lived():
            from raysim.engine.scheduler import Scheduler

            self.scheduler = Scheduler(scenario, table, client_actors)

    def advance(self, seconds: float, stop_version: int | None = None) -> dict:
        return self.scheduler.advance(seconds, stop_version)

    def finish(self) -> dict:
        return self.scheduler.finish()

    def run_state(self):
        return self.scheduler.run_state()

    def restore(self, state, wall_seconds: float = 0.0) -> None:
        self.scheduler.restore(state, wall_seconds)

    def describe(self) -> list:
        """``ClientActor.info()`` of every ClientActor, as this actor's ClientActorGroup sees them (it
        replaces those that die)."""
        return self.scheduler.runtime.describe()
