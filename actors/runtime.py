"""RayRuntime: the engine's runtime protocol on Ray — ClientActors (in a placement group that
spreads or packs them over the nodes; one that dies is replaced and its calls are sent again)
plus a SchedulerActor.

Without ``runtime.address`` (and outside a Ray job) a run starts a private local Ray of its own:
it never joins a cluster that ``ray start`` or a ``RAY_ADDRESS`` in the shell left on the host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
from dataclasses import dataclass

import ray
from ray._private import ray_constants
from ray._private.services import canonicalize_bootstrap_address
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import get_current_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.jobs import job_address
from actors.payloads import pack
from raysim.scenario.schema import actors_that_fit
from raysim.startup import STARTUP
from raysim.engine.interrupts import deferred_signals
from raysim.errors import (RunError, ScenarioError, SchedulerLost,  # SchedulerLost: what RemoteScheduler raises
                           first_line, last_line)

RAY_TOKEN = os.path.expanduser("~/.ray/auth_token")  # where a local ray.init() looks for its token
ACTOR_REPLACEMENTS = 3  # a ClientActor that dies is replaced (and its calls sent again) at most this many times


def cluster_address(runtime_cfg) -> str | None:
    """The cluster a run joins: ``runtime.address``, or inside a Ray job that job's cluster.
    None: the run starts a private embedded Ray (a ``RAY_ADDRESS`` exported in the shell is
    not a job's)."""
    return runtime_cfg.address or job_address()


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """ScenarioError naming ``runtime.address`` unless something answers at the cluster's GCS
    (``ray.init`` would retry for minutes): ``host:port``, ``ray://host:port`` (Ray Client), or
    ``auto``, resolved as Ray resolves it (``RAY_ADDRESS``, else the last cluster ``ray start``
    recorded, which may be long gone). A job server's ``http://`` address is refused: it is
    ``raysim submit``'s."""
    allowed = "host:port of a running Ray cluster's head (GCS), ray://host:port, or auto"
    target = address
    if address == "auto":
        try:
            target = canonicalize_bootstrap_address("auto")
        except Exception as exc:  # no cluster recorded or running
            raise ScenarioError("runtime.address", address, f"{allowed}: no running Ray cluster was found "
                                f"({first_line(exc)}); leave runtime.address unset for an embedded Ray") from None
    elif address.startswith("ray://"):
        target = address.removeprefix("ray://")
    elif "://" in address:
        raise ScenarioError("runtime.address", address, f"{allowed} ({address.split('://')[0]}:// is a job server's "
                            "address: raysim submit --address takes it)")
    host, _, port = (target or "").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        found = f" (auto found {target})" if address == "auto" else ""
        raise ScenarioError("runtime.address", address, f"{allowed}: nothing answers at {target}{found} ({exc})"
                            ) from None


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
    fits = sum(actors_that_fit(c, g, runtime_cfg) for c, g in nodes)
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


def cluster_nodes() -> list:
    """(CPUs, GPUs) of each alive node of the Ray this process is connected to."""
    return [(n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0)) for n in ray.nodes() if n["Alive"]]


def embedded_plan(runtime_cfg) -> int | None:
    """The number of ClientActors of the run's private embedded Ray, checked before Ray starts
    (ScenarioError, one line, when ``runtime.num_actors`` exceeds its CPUs or GPUs); None when
    the run joins a cluster, whose size only the cluster knows. ``raysim validate`` calls it too."""
    if cluster_address(runtime_cfg) is not None:
        return None
    cpus, gpus = embedded_resources(runtime_cfg)
    return plan_actors(runtime_cfg, [(cpus, gpus or 0.0)])


INLINE_PAYLOAD_BYTES = 100 * 1024  # smaller payloads travel inside the call, as Ray inlines small arguments


def actor_bundle(runtime_cfg) -> dict:
    """One ClientActor's share of a node, as a placement-group bundle."""
    bundle = {"CPU": float(runtime_cfg.cpus_per_actor)}
    if runtime_cfg.gpus_per_actor > 0:
        bundle["GPU"] = float(runtime_cfg.gpus_per_actor)
    return bundle


def actor_options(runtime_cfg) -> dict:
    """A ClientActor's Ray options: its CPUs and GPUs."""
    return dict(num_cpus=runtime_cfg.cpus_per_actor, num_gpus=runtime_cfg.gpus_per_actor)


def own_group(runtime_cfg, num_actors: int):
    """A placement group of ``num_actors`` ClientActors' bundles, spread or packed over the nodes as
    ``runtime.placement`` says."""
    return placement_group([actor_bundle(runtime_cfg)] * num_actors,
                           strategy="SPREAD" if runtime_cfg.placement == "spread" else "PACK")


@dataclass
class Pending:
    """A call to a ClientActor, kept with its arguments until its result is in, so that it can be
    sent again if the actor dies; ``generation``: how many times that actor had been replaced
    when it was sent."""

    actor: int
    method: str
    args: tuple
    generation: int
    ref: ray.ObjectRef


class ClientActorGroup:
    """The ClientActors as seen by the scheduler: broadcast through the object store, submit, gather.

    Creates ``num_actors`` actors of ``actor_class`` (ClientActor), actor i from ``i`` with Ray
    ``options``, in bundle ``first_bundle + i`` of placement group ``group``; :meth:`load` gives
    them a run, and may give the same actors another run later. One that dies (its process killed,
    its node lost) is replaced by a new one in the same bundle, loaded as the others, at most
    :data:`ACTOR_REPLACEMENTS` times a run, and its calls are sent again (a task is a pure function
    of its inputs, so the results are the same); :meth:`lost_tasks` reports those tasks. Picklable,
    so the SchedulerActor can hold it (the actors it creates there are that actor's)."""

    def __init__(self, actor_class, options: dict, group, num_actors: int, first_bundle: int = 0):
        self._spawn = (actor_class, options, group, first_bundle)
        self._run = None  # the arguments of the run the actors hold (load's)
        self.actors = [self._create(i) for i in range(num_actors)]
        self.num_actors = num_actors
        self.nodes = [""] * num_actors  # nodes[i]: the node id of actor i (set by describe)
        self._replaced = [0] * num_actors
        self._lost = []
        self._deaths = []

    def load(self, *run) -> None:
        """Give every actor the run ``run`` (ClientActor.load's arguments) and wait until each holds
        it; the run's count of replacements, lost tasks and deaths starts afresh. RunError (one line)
        when an actor cannot load it."""
        self._run = run
        self._replaced, self._lost, self._deaths = [0] * self.num_actors, [], []
        try:
            self.gather([self._send(i, "load", run) for i in range(self.num_actors)])
        except RayTaskError as exc:  # what the ClientHost raised: its last line
            raise RunError(f"a ClientActor could not load the run: {last_line(exc)}") from None

    def broadcast(self, payload: dict):
        """An object-store reference to the payload, or the payload itself when it is small (a
        fetch from the object store costs more than sending a few KB with each call), its tensors
        as numpy arrays: pickling a small tensor costs about 20 times more than pickling its array
        (the ClientActor turns them back into tensors)."""
        size = sum(t.numel() * t.element_size() for t in payload.values())
        return {k: t.numpy() for k, t in payload.items()} if size < INLINE_PAYLOAD_BYTES else ray.put(payload)

    def submit(self, actor: int, handles: dict, tasks: list, prepare: tuple = ()) -> Pending:
        """Start ``tasks`` on actor ``actor`` (which then builds the on-demand rows of the
        clients in ``prepare`` while it waits for its next call); returns the pending call."""
        payloads = pack(handles)
        return self._send(actor, "run", (payloads, tasks, prepare) if prepare else (payloads, tasks))

    def gather(self, pending: list) -> list:
        """The results of pending calls; the calls of an actor that died run again on its
        replacement (RunError, one line, when it died too often)."""
        try:
            return ray.get([p.ref for p in pending])
        except RayActorError:
            return [self._result(p) for p in pending]

    def describe(self) -> list:
        """``info()`` of every actor (waits until each is up); also refreshes :attr:`nodes`."""
        infos = self.gather([self._send(i, "info", ()) for i in range(self.num_actors)])
        self.nodes = [info["node"] for info in infos]
        return infos

    def lost_tasks(self) -> list:
        """``(actor_index, task)`` pairs run again because their actor died; forgets them."""
        lost, self._lost = self._lost, []
        return lost

    def deaths(self) -> list:
        """The index of each actor replaced since the last call, once per death; forgets them."""
        deaths, self._deaths = self._deaths, []
        return deaths

    def _create(self, actor: int):
        """A new actor ``actor`` in its bundle, sent the run the others hold (an actor runs its calls in
        the order they were sent: the load before anything else)."""
        actor_class, options, group, first_bundle = self._spawn
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=first_bundle + actor)
        handle = actor_class.options(**options, scheduling_strategy=strategy).remote(actor)
        if self._run is not None:
            handle.load.remote(*self._run)
        return handle

    def close(self) -> None:
        """End the actors."""
        for actor in self.actors:
            ray.kill(actor)

    def _send(self, actor: int, method: str, args: tuple) -> Pending:
        ref = getattr(self.actors[actor], method).remote(*args)
        return Pending(actor, method, args, self._replaced[actor], ref)

    def _result(self, pending: Pending):
        while True:
            try:
                return ray.get(pending.ref)
            except RayActorError as exc:
                if pending.generation == self._replaced[pending.actor]:  # not replaced since it was sent
                    self._replace(pending.actor, exc)
                resent = self._send(pending.actor, pending.method, pending.args)
                pending.generation, pending.ref = resent.generation, resent.ref
                if pending.method == "run":
                    self._lost += [(pending.actor, task) for task in pending.args[1]]

    def _replace(self, actor: int, exc: RayActorError) -> None:
        """A new actor in place of ``actor``, which ``exc`` says died; RunError (one line) if it
        failed in its constructor or was replaced :data:`ACTOR_REPLACEMENTS` times already."""
        if exc.actor_init_failed:  # Ray's message ends with the line of what the constructor raised
            raise RunError(f"ClientActor {actor} failed to start: {last_line(exc)}")
        if self._replaced[actor] >= ACTOR_REPLACEMENTS:
            raise RunError(f"ClientActor {actor} died {self._replaced[actor] + 1} times "
                           f"(replaced at most {ACTOR_REPLACEMENTS} times): {first_line(exc)}")
        ray.kill(self.actors[actor])  # in case it is only unreachable
        self.actors[actor] = self._create(actor)
        self._replaced[actor] += 1
        self._deaths.append(actor)


def keep_token_private(path: str = RAY_TOKEN) -> None:
    """Ray's token for the clusters this user starts (whoever reads it may run code on them) readable by
    this user only: created so where it is missing (Ray would write it with the umask's mode, usually
    world-readable), made so where this user owns it. Nothing when the token comes from elsewhere."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token" or \
            {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ):
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        created = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with contextlib.suppress(OSError):
            held = os.stat(path)
            if held.st_uid == os.getuid() and held.st_mode & 0o077:
                os.chmod(path, 0o600)
        return
    except OSError:  # a read-only home: Ray says what it needs
        return
    with os.fdopen(created, "w") as f:
        f.write(secrets.token_hex(32))  # as Ray makes one: 256 random bits


class RemoteScheduler:
    """Driver-side handle of the SchedulerActor: the Scheduler's methods, raising SchedulerLost
    when the actor is gone (its process was killed or its node lost)."""

    def __init__(self, actor):
        self.actor = actor

    def advance(self, seconds: float, stop_version: int | None = None) -> dict:
        return self._call("advance", seconds, stop_version)

    def finish(self) -> dict:
        return self._call("finish")

    def run_state(self):
        return self._call("run_state")

    def restore(self, state, wall_seconds: float = 0.0) -> None:
        return self._call("restore", state, wall_seconds)

    def _call(self, method: str, *args):
        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except RayActorError as exc:
            raise SchedulerLost(f"the SchedulerActor was lost: {first_line(exc)}") from None


class RayRuntime:
    """Starts a private Ray (or joins ``runtime.address`` / the job's cluster), creates the
    ClientActors and the SchedulerActor.

    Run inside a placement group (a Ray Tune trial's: ``raysim sweep --runner tune``), the ClientActors
    take that group's bundles after the first, which holds this process, one actor per bundle;
    elsewhere the runtime plans them over the cluster's nodes and creates a group of its own."""

    def __init__(self, runtime_cfg, warm: WarmActors | None = None):
        if runtime_cfg.address and not ray.is_initialized():
            _check_reachable(runtime_cfg.address)  # before the run claims its directory
        self.cfg = runtime_cfg
        self.warm = warm  # where this run's ClientActors come from and go back to, if it takes warm ones
        self._lent = None  # the WarmActors this runtime lends to the runs that share its Ray session
        self.client_actors = None
        self.num_actors = 0
        self._table = None
        self._scheduler = None
        self._group = None
        self._owns_ray = False

    @property
    def nodes(self) -> list:
        return self.client_actors.nodes if self.client_actors is not None else []

    def start(self) -> None:
        """Start a private embedded Ray (or join ``runtime.address`` / the job's cluster) unless
        Ray is already initialized in this process; a second call does nothing."""
        if ray.is_initialized():
            return
        address = cluster_address(self.cfg)
        if address is None:
            embedded_plan(self.cfg)  # bad input fails before Ray starts
            cpus, gpus = embedded_resources(self.cfg)
            # Ray enables token authentication for a new local cluster (unless RAY_AUTH_MODE says
            # otherwise) and warns that it did: this cluster is the run's own, the warning is noise
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            options = dict(address="local", num_cpus=int(cpus), num_gpus=gpus, include_dashboard=False)
            keep_token_private()
            STARTUP.info(f"starting Ray ({int(cpus)} CPUs{f', {gpus:g} GPUs' if gpus else ''}) …")
        else:
            options = dict(address=address)
            STARTUP.info(f"joining the Ray cluster at {address} …")
        try:
            # Ctrl-C waits for ray.init to return: raised inside it, KeyboardInterrupt can leave a
            # lock of the logging module held, and the clean-up below then hangs on it
            with _signal_handlers_kept(), deferred_signals(), \
                    _without_idle_daemons() if address is None else contextlib.nullcontext():
                ray.init(**options, logging_level=logging.WARNING)
        except BaseException as exc:  # e.g. Ctrl-C, or its raylet lost as it started: end what ray.init had started
            with contextlib.suppress(Exception):
                ray.shutdown()
            if isinstance(exc, Exception):
                raise RunError(f"Ray did not start: {first_line(exc)}") from None
            raise
        self._owns_ray = True

    def load(self, scenario, dataset):
        from actors.client_actor import ClientActor
        from raysim.data import open_dataset

        cfg = self.cfg
        self.start()
        group = get_current_placement_group()  # a trial's: bundle 0 holds this process
        if group is not None:
            self.num_actors = _bundles_for_actors(group, cfg)
        else:
            self.num_actors = plan_actors(cfg, cluster_nodes())
        plural = "s" if self.num_actors != 1 else ""
        if group is None and self.warm is not None:
            STARTUP.info(f"loading the run into {self.num_actors} warm client actor{plural} …")
            self.client_actors = self.warm.take(cfg, self.num_actors)
        else:
            STARTUP.info(f"starting {self.num_actors} client actor{plural} …")
            if group is None:
                self._group = group = own_group(cfg, self.num_actors)
            self.client_actors = ClientActorGroup(ClientActor, actor_options(cfg), group, self.num_actors,
                                                  first_bundle=0 if self._group is not None else 1)
        self._table = ray.put(dataset.table)  # the data set travels once; actors map it zero-copy
        self.client_actors.load(scenario, self._table)  # waits until every actor holds the run
        self.client_actors.describe()
        return open_dataset(ray.get(self._table))  # zero-copy view: the driver's own copy can go

    def scheduler(self, scenario, dataset):
        """The SchedulerActor — or, with ``runtime.scheduler: driver`` (``auto`` with an embedded
        Ray), the same Scheduler in this process, which saves a process and its start-up.
        Called again (after :class:`SchedulerLost`), a new one over the same ClientActors; a
        previous SchedulerActor still alive is killed."""
        from actors.scheduler_actor import SchedulerActor
        from raysim.engine.scheduler import Scheduler

        if self._scheduler is not None:
            ray.kill(self._scheduler)
            self._scheduler = None
        where = self.cfg.scheduler
        if where == "driver" or (where == "auto" and cluster_address(self.cfg) is None):
            return Scheduler(scenario, dataset.table, self.client_actors)
        self._scheduler = SchedulerActor.remote(scenario, self._table, self.client_actors)
        return RemoteScheduler(self._scheduler)

    def describe(self) -> list:
        """One dict per ClientActor (see ClientActor.info), as the ClientActorGroup that replaces dead ones
        sees them: the SchedulerActor's when there is one."""
        if self._scheduler is not None:
            return ray.get(self._scheduler.describe.remote())
        return self.client_actors.describe()

    def warm_actors(self) -> WarmActors:
        """ClientActors to lend to the runs that share this runtime's Ray session; :meth:`close`
        ends them."""
        if self._lent is None:
            self._lent = WarmActors()
        return self._lent

    def close(self) -> None:
        """Shut down the embedded Ray, or only this run's actors (and its placement group, not the
        one it ran inside) when Ray was already running; warm ClientActors stay, for the next run."""
        if self._lent is not None:
            self._lent.close()
            self._lent = None
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
        else:
            if self._scheduler is not None:
                ray.kill(self._scheduler)
            if self.client_actors is not None and self.warm is None:
                self.client_actors.close()
            if self._group is not None:
                remove_placement_group(self._group)
        self.client_actors, self._scheduler, self._group = None, None, None


class WarmActors:
    """ClientActors kept from one run to the next in one Ray session (``raysim sweep --in-process``).

    A run takes them over (:meth:`take`) when it wants as many with the same share of a node and
    the same placement: they are up, with torch and raysim's engine loaded, and the run loads its
    own scenario and data set into them (a new ClientHost each; nothing of an earlier run stays).
    A run that wants others gets new ones, and the old ones end."""

    def __init__(self):
        self._actors = None  # the ClientActorGroup kept
        self._group = None  # its placement group
        self._kind = None  # what it was made for: (bundle, number of actors, placement)

    def prestart(self, runtime_cfg) -> None:
        """Start the ClientActors ``runtime_cfg`` plans on the cluster Ray runs, without waiting
        for them: they load torch while this process prepares its first run."""
        self.take(runtime_cfg, plan_actors(runtime_cfg, cluster_nodes()))

    def take(self, runtime_cfg, num_actors: int) -> ClientActorGroup:
        """The kept ClientActors if they are what ``runtime_cfg`` and ``num_actors`` ask for, else new ones."""
        from actors.client_actor import ClientActor

        kind = (tuple(sorted(actor_bundle(runtime_cfg).items())), num_actors, runtime_cfg.placement)
        if kind != self._kind:
            self.close()
            self._group = own_group(runtime_cfg, num_actors)
            self._actors = ClientActorGroup(ClientActor, actor_options(runtime_cfg), self._group, num_actors)
            self._kind = kind
        return self._actors

    def close(self) -> None:
        """End the kept actors and their placement group."""
        if self._actors is not None:
            self._actors.close()
            remove_placement_group(self._group)
        self._actors, self._group, self._kind = None, None, None


def _bundles_for_actors(group, runtime_cfg) -> int:
    """The ClientActors of a run inside placement group ``group``: one per bundle after the first;
    RunError (one line) when those bundles are not ClientActors' shares (the group is not one
    that ``raysim sweep --runner tune`` planned for this scenario)."""
    shares = group.bundle_specs[1:]
    if not shares or any(b != actor_bundle(runtime_cfg) for b in shares):
        raise RunError(f"this run lies in a placement group whose bundles after the first ({shares}) are not "
                       f"ClientActors' shares ({actor_bundle(runtime_cfg)} each): run it outside the group, or plan "
                       f"the group as raysim sweep --runner tune does")
    return len(shares)




@contextlib.contextmanager
def _signal_handlers_kept():
    """Keep this process's SIGTERM handling through ``ray.init``.

    ``ray.init`` replaces the SIGTERM handler with one that exits with status 15
    (``ray/_private/worker.py``, ``init``: ``sigterm_handler``), and the driver's core worker
    installs a C++ failure-signal handler that prints a stack dump on SIGTERM unless
    ``ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` (read when ``ray.init`` creates it;
    set here for this process only, workers keep theirs). The handler in place before is put
    back, and a SIGTERM that Ray's handler caught meanwhile is delivered to it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        signal.signal(signal.SIGTERM, before)
        signal.raise_signal(signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def _without_idle_daemons():
    """Start an embedded single-node Ray (``ray.init`` inside the block) without the two daemons
    of its head that a run never uses (this process's ``ray.init`` only: the two Ray functions
    that start them are swapped for the block).

    * The autoscaler monitor: a single-node embedded Ray never autoscales, so the monitor only
      costs memory (~50 MB) and time: ``ray.shutdown()`` stops the GCS before it, and its SIGTERM
      handler then waits on the dead GCS until Ray gives up after a second and sends SIGKILL —
      one second of every run's wall time (Ray 2.60).
    * The dashboard head: with ``include_dashboard=False`` Ray still starts it, to run only its
      usage-statistics module (about 80 MiB PSS, 6% of W1's process tree), and ``ray.init``
      polls until it is up: about a second of a 2-core machine's start-up. Nothing of Ray's
      that a run calls needs it; the node's own agents (``DashboardAgent``,
      ``RuntimeEnvAgent``) are the raylet's and start as ever.
    """
    from ray._private import node, services

    swapped = [(owner, name, stand_in) for owner, name, stand_in in (
        (node.Node, "start_monitor", lambda self: None),
        (services, "start_api_server", lambda *args, **kwargs: (None, None)))  # (no URL, no process)
        if hasattr(owner, name)]  # a Ray that names them otherwise starts them (tests/test_startup.py says so)
    kept = [(owner, name, getattr(owner, name)) for owner, name, _ in swapped]
    for owner, name, stand_in in swapped:
        setattr(owner, name, stand_in)
    try:
        yield
    finally:
        for owner, name, original in kept:
            setattr(owner, name, original)
