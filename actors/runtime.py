"""RayRuntime: the engine's runtime protocol on Ray — ClientActors (in a placement group that
spreads or packs them over the nodes) plus a SchedulerActor."""

from __future__ import annotations

import logging
import math
import os

import psutil
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.jobs import job_address
from raysim.errors import ScenarioError


def embedded_resources(runtime_cfg) -> tuple[float, float | None]:
    """CPUs and GPUs an embedded local Ray will declare for this scenario. GPUs are None (Ray
    detects them) when ``runtime.num_gpus`` is null and actors use no GPU: the actor plan does
    not depend on them, and counting them here would import torch before Ray can start."""
    cpus = runtime_cfg.num_cpus if runtime_cfg.num_cpus is not None else os.cpu_count()
    if runtime_cfg.num_gpus is not None:
        return float(cpus), float(runtime_cfg.num_gpus)
    if runtime_cfg.gpus_per_actor == 0:
        return float(cpus), None
    import torch

    return float(cpus), float(torch.cuda.device_count())


def plan_actors(runtime_cfg, nodes: list) -> int:
    """Number of ClientActors that fit on ``nodes`` ((CPUs, GPUs) per node: an actor's share
    must fit on one node); ScenarioError if they cannot fit."""
    cpa, gpa = runtime_cfg.cpus_per_actor, runtime_cfg.gpus_per_actor
    per_node = [math.floor(c / cpa + 1e-9) if gpa == 0 else min(math.floor(c / cpa + 1e-9), math.floor(g / gpa + 1e-9))
                for c, g in nodes]
    fits = sum(per_node)
    cpus, gpus = sum(c for c, _ in nodes), sum(g for _, g in nodes)
    where = f"{len(nodes)} node(s), {cpus:g} CPUs at runtime.cpus_per_actor={cpa:g}"
    if gpa > 0:
        where += f", {gpus:g} GPUs at runtime.gpus_per_actor={gpa:g}"
    if fits < 1:
        gpu_short = gpa > 0 and all(g + 1e-9 < gpa for _, g in nodes)
        key, value = ("runtime.gpus_per_actor", gpa) if gpu_short else ("runtime.cpus_per_actor", cpa)
        raise ScenarioError(key, value, f"a share that fits the cluster ({where})")
    wanted = runtime_cfg.num_actors
    if wanted == "auto":
        return fits
    if wanted > fits:
        raise ScenarioError("runtime.num_actors", wanted, f"at most {fits} actors ({where}), or 'auto'")
    return wanted


INLINE_PAYLOAD_BYTES = 100 * 1024  # smaller payloads travel inside the call, as Ray inlines small arguments


def _bundle(runtime_cfg) -> dict:
    """One ClientActor's share of a node, as a placement-group bundle."""
    bundle = {"CPU": float(runtime_cfg.cpus_per_actor)}
    if runtime_cfg.gpus_per_actor > 0:
        bundle["GPU"] = float(runtime_cfg.gpus_per_actor)
    return bundle


class ActorPool:
    """The ClientActors as seen by the scheduler: broadcast through the object store, submit, gather.
    Picklable, so the SchedulerActor can hold it."""

    def __init__(self, actors: list, nodes: list):
        self.actors, self.nodes = actors, nodes  # nodes[i]: the node id of actor i
        self.num_actors = len(actors)

    def broadcast(self, payload: dict):
        """An object-store reference to the payload, or the payload itself when it is small
        (a fetch from the object store costs more than sending a few KB with each call)."""
        size = sum(t.numel() * t.element_size() for t in payload.values())
        return payload if size < INLINE_PAYLOAD_BYTES else ray.put(payload)

    def submit(self, actor: int, handles: dict, tasks: list):
        return self.actors[actor].run.remote(handles, tasks)

    def gather(self, pending: list) -> list:
        return ray.get(pending)


class RemoteScheduler:
    """Driver-side handle of the SchedulerActor."""

    def __init__(self, actor):
        self.actor = actor

    def advance(self, seconds: float) -> dict:
        return ray.get(self.actor.advance.remote(seconds))

    def finish(self) -> dict:
        return ray.get(self.actor.finish.remote())


class RayRuntime:
    """Starts (or joins) Ray, creates the ClientActors and the SchedulerActor."""

    def __init__(self, runtime_cfg):
        self.cfg = runtime_cfg
        self.actors = []
        self.num_actors = 0
        self.nodes = []
        self._table = None
        self._scheduler = None
        self._group = None
        self._owns_ray = False

    def start(self) -> None:
        """Start the embedded Ray (or join ``runtime.address`` / the job's cluster) unless Ray is
        already initialized in this process; a second call does nothing."""
        cfg = self.cfg
        if ray.is_initialized():
            return
        address = cfg.address or job_address()  # inside a Ray job: that job's cluster
        if address is None:
            cpus, gpus = embedded_resources(cfg)
            plan_actors(cfg, [(cpus, gpus or 0.0)])  # bad input fails before Ray starts
            ray.init(num_cpus=int(cpus), num_gpus=gpus, include_dashboard=False, logging_level=logging.WARNING)
            _stop_autoscaler_monitor()
        else:
            ray.init(address=address, logging_level=logging.WARNING)
        self._owns_ray = True

    def load(self, scenario: dict, dataset):
        from actors.client_actor import ClientActor
        from raysim.data import open_dataset

        cfg = self.cfg
        self.start()
        nodes = [(n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0)) for n in ray.nodes() if n["Alive"]]
        self.num_actors = plan_actors(cfg, nodes)
        self._table = ray.put(dataset.table)  # the data set travels once; actors map it zero-copy
        self._group = placement_group([_bundle(cfg)] * self.num_actors,
                                      strategy="SPREAD" if cfg.placement == "spread" else "PACK")
        self.actors = [ClientActor.options(
            num_cpus=cfg.cpus_per_actor, num_gpus=cfg.gpus_per_actor,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=i),
        ).remote(scenario, self._table, i) for i in range(self.num_actors)]
        self.nodes = [info["node"] for info in self.describe()]
        return open_dataset(ray.get(self._table))  # zero-copy view: the driver's own copy can go

    def scheduler(self, scenario: dict, dataset):
        """The SchedulerActor — or, with ``runtime.scheduler: driver`` (``auto`` with an embedded
        Ray), the same Scheduler in this process, which saves a process and its start-up."""
        from actors.scheduler_actor import SchedulerActor
        from raysim.engine.scheduler import Scheduler

        where = self.cfg.scheduler
        if where == "driver" or (where == "auto" and self.cfg.address is None and job_address() is None):
            return Scheduler(scenario, dataset.table, ActorPool(self.actors, self.nodes))
        self._scheduler = SchedulerActor.remote(scenario, self._table, ActorPool(self.actors, self.nodes))
        return RemoteScheduler(self._scheduler)

    def describe(self) -> list:
        return ray.get([a.info.remote() for a in self.actors])

    def close(self) -> None:
        """Shut down the embedded Ray, or only this run's actors when Ray was already running."""
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
        else:
            for actor in self.actors + ([self._scheduler] if self._scheduler is not None else []):
                ray.kill(actor)
            if self._group is not None:
                remove_placement_group(self._group)
        self.actors, self._scheduler, self._group = [], None, None


def _stop_autoscaler_monitor() -> None:
    """Kill the embedded Ray's autoscaler monitor, a child process of this driver.

    A single-node embedded Ray never autoscales, so the monitor only costs memory (~50 MB)
    and time: ``ray.shutdown()`` stops the GCS before it, and its SIGTERM handler then waits
    on the dead GCS until Ray gives up after a second and sends SIGKILL — one second of
    every run's wall time (Ray 2.60).
    """
    for child in psutil.Process().children():
        try:
            if any(arg.endswith("monitor.py") and f"{os.sep}autoscaler{os.sep}" in arg for arg in child.cmdline()):
                child.kill()
                child.wait(timeout=5)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.TimeoutExpired):
            pass
