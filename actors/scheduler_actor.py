"""SchedulerActor: the Scheduler (virtual clock, event queue, server state) as a Ray actor."""

from __future__ import annotations

import ray

from raysim.loading import long_lived


@ray.remote(num_cpus=0)
class SchedulerActor:
    """Owns the virtual clock and dispatches client tasks to the ClientActors (through an
    :class:`actors.runtime.ActorPool`); the driver only calls :meth:`advance` and writes rows."""

    def __init__(self, scenario: dict, table, pool):
        with long_lived():
            from raysim.engine.scheduler import Scheduler

            self.scheduler = Scheduler(scenario, table, pool)

    def advance(self, seconds: float) -> dict:
        return self.scheduler.advance(seconds)

    def finish(self) -> dict:
        return self.scheduler.finish()
