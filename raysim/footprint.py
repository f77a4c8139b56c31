"""Memory estimate of a scenario, from its keys alone: the bytes of its data set, model, kept client
state and client training, so that a scenario that cannot fit fails with one line before anything
big is allocated. Torch-free: it runs before the data set is generated and before torch loads.

The estimate aims at the peak within a factor of about 2. Its parts:

- data set: the federated table (or the quadratic problem's statistics), times what building it
  holds at once (:data:`BUILD_FACTOR`), plus the copy in Ray's object store; built on demand, the
  table of client sizes, each process's cache of built rows and the chunk of clients evaluation holds;
  for the quadratic, a client's raw draws in every process that reduces them to statistics;
- model: the parameters (counted from the model keys and the data's shape, without building the
  module) in every client host, and the server's float64 vectors (parameters, aggregate, optimizer);
- client state: per client bookkeeping, and the vector a stateful algorithm keeps per visited client;
- training: the clients in flight (a round's clients, or the async concurrency), each with a few
  parameter-sized vectors and the activations of one minibatch in its host, and, under Ray, the
  model version it started from and its update in the driver, each also serialized in Ray's store;
- client hosts: each ClientActor process an embedded Ray starts (Python, torch and Ray's worker);
- processes: the driver's own libraries (Python, torch, pyarrow), and the daemons of an embedded
  Ray (GCS, raylet, its agents, the log monitor);
- step plan: the minibatch plan each host builds for a task before it trains (every step's rows of
  every client in the task), which grows with the local steps or epochs, E_k's law and the
  personalization steps.

On a cluster (``runtime.address`` set) only the driver's parts (data set, model, its process) are checked
against this machine; client state and training live on the cluster's nodes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from omegaconf import OmegaConf

from raysim.catalog import ALGORITHMS, algorithm_class, algorithm_keys, parameter_count
from raysim.scenario.schema import Scenario, actors_that_fit, clients_per_task
from raysim.data.build import builds_on_demand
from raysim.data._checks import QUADRATIC_THREADS
from raysim.data.kinds import DATA_FILES
from raysim.data.leaf import leaf_files
from raysim.data.sizes import data_shape, quadratic_client_bytes, table_bytes
from raysim.errors import ScenarioError

SIZE_BYTES = 8  # an on-demand data set's table: train and test sizes (int32) per client
BUILD_FACTOR = {"digits": 1.0, "blobs": 4.0,  # blobs: float64 draws; generated kinds fill the table client by client
                "parquet": 7.0, "quadratic": 2.0,  # parquet: the file read whole, its features, their sorted copy
                # the files' uint8 pixels, pooled, in client order (1/4 of the table each), then float32 rows that
                # the table keeps: measured peak 1.7-1.9x the table (60,000 MNIST, 30,000 CIFAR-10 images)
                "mnist": 2.0, "fashion_mnist": 2.0, "cifar10": 2.0, "cifar100": 2.0}
# leaf: a process's memory growth while json.load parses LEAF JSON, per byte of the file. Measured with
# psutil's RSS before and after json.load of a generated FEMNIST-like file (6.8 MB: 20 users x 60 rows of
# 784 pixels, 85% of them 1.0, the rest k/255): 5.6 (a float object and a list slot per pixel). The data
# set is sized as its files' bytes times this: a whole load_leaf peaked at 7.3x for that file (parse, then
# float32 rows: 0.55x the JSON); Shakespeare-like JSON parses at 1.9x but its float32 character rows are
# 3.7x the JSON, so its load peaks at 18x and this estimate is about 3x low for it.
JSON_PARSE_FACTOR = 5.6
SERVER_VECTORS = 6  # float64: parameters, aggregate, direction, step, two optimizer moments
CLIENT_VECTORS = 8  # per client in flight: start, parameters, gradient, update, kept state, extras, copies
# per client in flight under Ray, in the driver: the model version it started from and its update, each also
# serialized in Ray's in-process store. Measured (W1 async, 10^5 clients, 12,000 updates): the process tree's
# peak PSS grew by 207 KiB per client in flight from 1,000 to 10,000 in flight, 11.7 vectors of its 4,554
# float32 parameters; CLIENT_VECTORS + DRIVER_VECTORS = 12
DRIVER_VECTORS = 4
ACTIVATION_PASSES = 3  # forward values, their gradients, the inputs' copy
# a ClientActor process: its proportional set size with torch and Ray's worker loaded, measured with psutil
# on a running W1 (2 actors, 2026-11-28): 301-304 MiB PSS (225 MiB of it its own, 472 MiB RSS)
ACTOR_PROCESS_BYTES = 300 * 2 ** 20
# the driver process before it builds anything (Python, torch, pyarrow, Ray's client), and an embedded Ray's
# daemons: W1 on 2026-11-27, by PSS: the driver 347 MiB with W1's data and model, the DashboardAgent 87, the
# RuntimeEnvAgent 54, the log monitor 51, the GCS 43 and the raylet 27 MiB
DRIVER_PROCESS_BYTES = 300 * 2 ** 20
RAY_DAEMON_BYTES = 262 * 2 ** 20
PLAN_ROW_BYTES = 28  # per row of a task's minibatch plan: the shuffled order (int64), its rows (int64), the mask
# (float32), the rows as a tensor on the device (int64)
POISSON_TAIL = 10  # a Poisson(mean) E_k is counted at mean + 10 sqrt(mean): every client's draw stays below it
CLIENT_BOOKKEEPING = 128  # bytes per registered client: sizes, offsets, system profile
KEPT_ENTRY = 512  # bytes per kept client state besides its tensors (dict, tensor objects)


@dataclass(frozen=True)
class Part:
    """Bytes of one part of the estimate and the keys it grows with, as (key, value) pairs."""

    what: str
    bytes: float
    keys: tuple


@dataclass(frozen=True)
class Footprint:
    """The estimate of a scenario: its parts (see the module doc)."""

    parts: tuple

    @property
    def total(self) -> float:
        return sum(p.bytes for p in self.parts)

    def describe(self) -> str:
        """e.g. 'about 2.4 TB (data set 2.4 TB, model 97.2 MB)'."""
        shown = ", ".join(f"{p.what} {human(p.bytes)}" for p in self.parts if p.bytes)
        return f"about {human(self.total)} ({shown})"


def human(n: float) -> str:
    """Bytes in decimal units, three significant digits: '21.3 GB'."""
    units = ["B", "kB", "MB", "GB", "TB", "PB"]
    while n >= 999.5 and len(units) > 1:
        n, units = n / 1000, units[1:]
    return f"{n:.3g} {units[0]}"


def estimate(cfg) -> Footprint:
    """The memory estimate of a validated scenario ``cfg`` (see the module doc). A custom data or
    model kind (package.module:function) adds nothing for what it builds; a Parquet data set is
    sized from its metadata and its label and client columns (bad labels raise ScenarioError), MNIST
    from its IDX headers, CIFAR from its file sizes and LEAF from its JSON files' bytes (missing or
    bad files raise ScenarioError, as the loaders do)."""
    d, m = cfg.data, cfg.model
    rows, features, classes, clients, data_keys = data_shape(d)
    actors = _actors(cfg.runtime)
    in_flight, flight_keys = _in_flight(cfg, actors)
    if not clients:  # unknown until the files are read (leaf): the clients the run may visit, or a round's
        visits = _visits(cfg)
        clients = visits if visits < math.inf else in_flight
    params, widths = parameter_count(m, features, classes)
    model_keys = _model_keys(cfg)
    itemsize = 8 if m.kind == "quadratic" else 4
    ray = cfg.runtime.backend == "ray"

    if builds_on_demand(d):  # the sizes table, each process's cache, and evaluation's chunk of clients
        table = table_bytes(d)
        evaluated = min(clients, cfg.eval.clients or clients) / clients
        test_share = (10 * clients / rows if d.kind == "gaussian_mixture" else 0.0 if d.kind == "quadratic"
                      else d.test_fraction)
        # evaluation streams: the test rows of a chunk of the evaluated clients, those whose rows fit the cache
        chunk = min(table * evaluated, d.cache_mb * 2 ** 20) * test_share
        data = clients * SIZE_BYTES * (1 + ray) + min(table, d.cache_mb * 2 ** 20) * (actors + 1) + chunk
    elif d.kind == "leaf":  # the parsed JSON dominates; its bytes stand in for the object store's copy too
        data = _leaf_bytes(d.path) * (JSON_PARSE_FACTOR + ray)
    else:
        data = table_bytes(d) * (BUILD_FACTOR.get(d.kind, 1.0) + ray)  # ray: the object store's copy
    if d.kind == "quadratic":  # one client's draws in each host, and in each thread of the start-up pass
        data += _quadratic_draws_bytes(d) * (actors + QUADRATIC_THREADS)
    model = params * (itemsize * (actors + 1) + 8 * SERVER_VECTORS)
    kept = _kept_vectors(cfg)
    visits = min(clients, _visits(cfg))
    state = clients * CLIENT_BOOKKEEPING + (visits * (KEPT_ENTRY + kept * params * itemsize) if kept else 0)
    batch = 0 if d.kind == "quadratic" else cfg.algorithm.get("batch_size") or rows / clients  # none: full batch
    per_client = (CLIENT_VECTORS * params * itemsize
                  + ACTIVATION_PASSES * 4 * batch * (math.prod(features) + sum(widths))
                  + (quadratic_client_bytes(d) if d.kind == "quadratic" else 0)
                  + (DRIVER_VECTORS * params * itemsize if ray else 0))
    parts = [Part("data set", data, data_keys), Part("model", model, model_keys),
             Part("processes", DRIVER_PROCESS_BYTES + (RAY_DAEMON_BYTES if ray and not cfg.runtime.address else 0),
                  ())]  # no key makes them smaller
    if not cfg.runtime.address:
        batch_keys = (("algorithm.batch_size", batch),) if batch else ()
        plan_rows, plan_keys = _plan_rows(cfg, rows / max(clients, 1), batch)
        parts += [Part("client state", state, data_keys[:1] + model_keys),
                  Part("training", min(in_flight, clients) * per_client, flight_keys + batch_keys + model_keys),
                  Part("step plan", actors * min(in_flight, clients_per_task(cfg)) * plan_rows * PLAN_ROW_BYTES,
                       plan_keys)]
        if ray:
            parts.append(Part("client hosts", actors * ACTOR_PROCESS_BYTES, _actor_keys(cfg.runtime)))
    return Footprint(tuple(parts))


def check_fits(cfg, available: float | None = None) -> Footprint:
    """The estimate of ``cfg``; ScenarioError naming the key that dominates it if it exceeds
    ``available`` bytes (default: this machine's available memory)."""
    import psutil

    footprint = estimate(cfg)
    available = psutil.virtual_memory().available if available is None else available
    if footprint.total > available:
        key, value = _blame(cfg, max(footprint.parts, key=lambda p: (bool(p.keys), p.bytes)))  # a part a key grows
        raise ScenarioError(key, value, f"a scenario that fits in memory: it needs {footprint.describe()}, "
                                        f"this machine has {human(available)} available")
    return footprint


def summary(cfg) -> str:
    """A short line for ``raysim validate``: 'memory: about 25 MB (data set 7.4 MB, …) of 21.3 GB available'."""
    import psutil

    return f"memory: {estimate(cfg).describe()} of {human(psutil.virtual_memory().available)} available"


def _leaf_bytes(path: str) -> int:
    """Bytes of the LEAF JSON files :func:`raysim.data.leaf.load_leaf` reads at ``path``."""
    train, test = leaf_files(path)
    return sum(os.path.getsize(f) for f in train + (test or []))


def _quadratic_draws_bytes(d) -> int:
    """One quadratic client's float64 draws H, A, B, b, y while they are reduced to its statistics."""
    return 8 * d.n * (2 * d.d_theta + d.d_w + 2)


def _model_keys(cfg) -> tuple:
    m, d = cfg.model, cfg.data
    keys = {"mlp": (("model.hidden", list(m.hidden)),), "cnn": (("model.channels", list(m.channels)),)}.get(m.kind, ())
    if d.kind == "blobs":
        keys += (("data.num_features", d.num_features), ("data.num_classes", d.num_classes))
    elif d.kind == "quadratic":
        keys += (("data.d_theta", d.d_theta), ("data.d_w", d.d_w))
    elif d.kind in DATA_FILES:  # the files decide the shape and the classes
        keys += (("data.path", d.path),)
    elif d.kind == "saddle":
        keys += (("data.dim", d.dim),)
    return keys


def _actors(r) -> int:
    """Client hosts: runtime.num_actors, or for 'auto' those that fit the CPUs (and GPUs when
    runtime.num_gpus says) an embedded Ray declares."""
    if r.backend == "local":
        return 1
    if r.num_actors != "auto":
        return r.num_actors
    return max(1, actors_that_fit(r.num_cpus or os.cpu_count() or 1, r.num_gpus, r))


def _actor_keys(r) -> tuple:
    """The key that sets how many ClientActors start: runtime.num_actors, or for 'auto' whichever of
    runtime.num_cpus (the CPUs an embedded Ray declares) and runtime.cpus_per_actor multiplies them more."""
    if r.num_actors != "auto":
        return (("runtime.num_actors", r.num_actors),)
    cpus = os.cpu_count() or 1
    if r.num_cpus and r.num_cpus / cpus > 1 / r.cpus_per_actor:
        return (("runtime.num_cpus", r.num_cpus),)
    return (("runtime.cpus_per_actor", r.cpus_per_actor),)


def _in_flight(cfg, actors: int) -> tuple:
    """(clients training at once, the keys that set it)."""
    e, r = cfg.execution, cfg.runtime
    if e.mode == "sync":
        count, keys = math.ceil(e.clients_per_round * e.over_selection), (("execution.clients_per_round",
                                                                          e.clients_per_round),)
    else:
        count, keys = e.concurrency, (("execution.concurrency", e.concurrency),)
    if r.clients_per_task != "auto":
        count = min(count, actors * r.clients_per_task)
    return count, keys


def _plan_rows(cfg, client_rows: float, batch: float) -> tuple:
    """(rows of one client's largest minibatch plan, the key that sets it): a training task's
    (``algorithm.local_steps`` or ``local_epochs``, or E_k's law ``system.unreliable.local_steps``) or a
    personalization task's (``eval.personalized_steps`` or ``personalized_epochs``)."""
    a, ev, law = cfg.algorithm, cfg.eval, cfg.system.unreliable.local_steps
    epochs = a.get("local_epochs") or 1
    plans = [(a.get("local_steps") * batch, ("algorithm.local_steps", a.get("local_steps"))) if a.get("local_steps")
             else (epochs * max(client_rows, batch), ("algorithm.local_epochs", epochs))]
    if law is not None:
        key = "system.unreliable.local_steps"
        steps, named = {"constant": (law.value, (f"{key}.value", law.value)),
                        "uniform_int": (law.high, (f"{key}.high", law.high)),
                        "poisson": (law.mean + POISSON_TAIL * math.sqrt(law.mean), (f"{key}.mean", law.mean))}[law.kind]
        plans.append((steps * batch, named))
    if ev.personalized_steps:
        plans.append((ev.personalized_steps * batch, ("eval.personalized_steps", ev.personalized_steps)))
    elif ev.personalized_epochs:
        plans.append((ev.personalized_epochs * max(client_rows, batch),
                      ("eval.personalized_epochs", ev.personalized_epochs)))
    largest, key = max(plans, key=lambda plan: plan[0])
    return largest, (key,)


def _visits(cfg) -> float:
    """An upper bound on the clients a run visits (those that may keep state)."""
    e = cfg.execution
    if e.mode == "sync":
        return e.rounds * math.ceil(e.clients_per_round * e.over_selection)
    return math.inf if e.max_updates is None else e.max_updates + e.concurrency


def _kept_vectors(cfg) -> int:
    """Parameter-sized vectors the algorithm (and error feedback's residual or EF21's estimate) keeps per
    visited client."""
    return _algorithm_kept_vectors(cfg) + int(cfg.communication.uplink.error_feedback != "none")


def _algorithm_kept_vectors(cfg) -> int:
    """Parameter-sized vectors the algorithm keeps per visited client."""
    name = cfg.algorithm.name
    if name not in ALGORITHMS:
        return int(bool(algorithm_class(name).stateful))  # imported already: its Keys were validated
    if ALGORITHMS[name].keeps_personal:  # w, at most the parameters
        return int(cfg.model.personal_state == "stateful")
    return ALGORITHMS[name].kept_vectors


def _blame(cfg, part: Part) -> tuple:
    """The (key, value) of ``part`` furthest above its default."""
    def growth(pair) -> float:
        key, value = pair
        section, _, rest = key.partition(".")
        schema = OmegaConf.structured(algorithm_keys(cfg.algorithm.name) if section == "algorithm" else Scenario)
        default = OmegaConf.select(schema, rest if section == "algorithm" else key)
        if OmegaConf.is_list(default):
            value, default = max(value, default=1), max(default, default=1)
        return value / default if isinstance(value, (int, float)) and default else 1.0

    return max(part.keys, key=growth) if part.keys else ("scenario", cfg.name)
