"""A sweep's points as Ray Tune trials (``raysim sweep --runner tune``), sharing one Ray session.

Each point not done yet is one trial of a ``tune.Tuner``; its resources are a placement group
(:func:`bundles`): bundle 0 for the trial's own process, which runs the point through
:func:`raysim.api.execute` (``runtime.torch_threads`` CPUs: the server's steps and evaluation, and
with the local backend the client work), then with the ray backend one bundle per ClientActor,
which :class:`actors.runtime.RayRuntime` finds and fills inside the trial. Ray starts a trial only
once its whole group fits, so trials pack onto the cluster and never oversubscribe a node.

Ray Tune runs the trials; raysim keeps the rest: the run directory of a point is the one
``raysim run`` writes, its row is recorded as the other modes record it (:mod:`raysim.sweep.results`)
and skip-finished is :func:`raysim.sweep.results.is_done` (Tune's experiment files, under
``<out>/.tune/``, are not read back).
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager, nullcontext

import ray
from ray import tune
from ray.tune.logger import JsonLoggerCallback

from raysim.errors import RunError, ScenarioError, last_line
from raysim.sweep.plan import ray_of
from raysim.sweep.results import finished, started

TUNE_DIR = ".tune"  # Tune's experiment files, beside the points' directories
MEASURED = ("returncode", "wall_seconds", "peak_rss_bytes", "mode", "node")  # what a trial reports
_ENV = {"RAY_AIR_NEW_OUTPUT": "0",  # with verbose=0: Tune prints no tables on stdout (the sweep's paths go there)
        "TUNE_DISABLE_SIGINT_HANDLER": "1",  # Ctrl-C raises KeyboardInterrupt, as in the other modes
        "RAY_CHDIR_TO_TRIAL_DIR": "0",  # a trial runs in the working directory, as raysim run would
        "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}  # per trial a result.json only (JsonLoggerCallback below)


class Trials:
    """The trials of ``points``: the Ray session they share (the runtime section of the ray-backend
    points, which must declare one Ray) and, when the sweep starts that Ray itself or finds it
    initialized in this process, each point's bundles, checked before anything runs (ScenarioError,
    one line); on a cluster joined (``runtime.address``, a Ray job's) they are checked once
    joined, before any trial starts."""

    def __init__(self, points: list):
        from actors.runtime import cluster_address, embedded_resources
        from raysim.import_path import check_workers_import_raysim

        self.points = points
        self.runtime_cfg = _session(points)
        for point in points:  # every trial is a Ray worker, local-backend points' too
            check_workers_import_raysim(point.cfg.runtime)
        self.starts_ray = not ray.is_initialized() and cluster_address(self.runtime_cfg) is None
        self.bundles = None
        if self.starts_ray:
            cpus, gpus = embedded_resources(self.runtime_cfg)
            self.bundles = _plan(points, [(cpus, gpus or 0.0)])
        elif ray.is_initialized():  # the caller's Ray (the Python API): its nodes are known now
            from actors.runtime import cluster_nodes

            self.bundles = _plan(points, cluster_nodes())

    def run(self, out, say) -> None:
        """Start (or join) the session, run every point as a trial (Tune's files under ``out``/.tune),
        record each as it ends; Ctrl-C (or SIGTERM) ends the session's trials with it (their points
        run again next time) and raises KeyboardInterrupt."""

        def tuner(bundles):
            factories = {p.name: placement(p.cfg, bundles[p.name]) for p in self.points}
            trainable = tune.with_resources(
                tune.with_parameters(run_point, cfgs={p.name: p.cfg for p in self.points}),
                lambda config: factories[config["point"]])
            return tune.Tuner(trainable, param_space={"point": tune.grid_search([p.name for p in self.points])},
                              run_config=run_config(out, [_Recorder(self.points, say)]))

        self.fit(tuner)

    def fit(self, make_tuner):
        """Start (or join) the session, fit the ``tune.Tuner`` that ``make_tuner(bundles)`` makes
        (``bundles``: point name -> its placement-group bundles) and return its ResultGrid; Ctrl-C
        (or SIGTERM) ends the session's trials with it and raises KeyboardInterrupt."""
        from actors.runtime import RayRuntime, cluster_nodes
        from raysim.lifecycle import guarded

        session = RayRuntime(self.runtime_cfg)
        with guarded() if self.starts_ray else nullcontext():  # no process of the sweep's own Ray outlives it
            try:
                session.start()  # nothing when Ray is initialized already
                tuner = make_tuner(self.bundles or _plan(self.points, cluster_nodes()))
                with _environment(_ENV):
                    return tuner.fit()
            finally:
                session.close()  # the Ray it started or joined: trials still running end with it


def run_config(out, callbacks: list) -> tune.RunConfig:
    """Tune's run configuration for trials under ``out``: its files in ``out``/.tune, no tables on
    stdout, ``callbacks`` and a result.json per trial."""
    return tune.RunConfig(storage_path=str((out / TUNE_DIR).resolve()), verbose=0,
                          callbacks=[*callbacks, JsonLoggerCallback()])


def placement(cfg, bundles: list) -> tune.PlacementGroupFactory:
    """A trial's resources: a placement group of ``bundles`` with the scenario's strategy."""
    return tune.PlacementGroupFactory(bundles, strategy=_strategy(cfg))


def run_point(config: dict, cfgs: dict) -> None:
    """A trial: the point ``config["point"]`` (scenario ``cfgs[…]``) through :func:`raysim.api.execute`
    in this process, reported to Tune as the figures the sweep records (:data:`MEASURED`, and
    ``error``: the one-line message of a run that failed)."""
    from raysim.api import execute
    from raysim.measure import peak_memory

    began = time.perf_counter()
    error = None
    with peak_memory(os.getpid()) as peak:
        try:
            execute(cfgs[config["point"]], began=began, replace=True)
        except (RunError, ScenarioError) as exc:
            error = str(exc)
    tune.report({"returncode": 0 if error is None else 1, "wall_seconds": time.perf_counter() - began,
                 "peak_rss_bytes": peak["rss"], "mode": "tune", "node": ray.get_runtime_context().get_node_id(),
                 **({"error": error} if error else {})})


def bundles(cfg, nodes: list) -> list[dict]:
    """A point's placement-group bundles on a cluster of ``nodes`` ((CPUs, GPUs) each): bundle 0
    for the trial's process, then (ray backend) one per ClientActor, as many as
    :func:`actors.runtime.plan_actors` plans beside bundle 0 on the largest node. ScenarioError
    when they cannot fit."""
    from actors.runtime import actor_bundle, plan_actors

    r = cfg.runtime
    head = {"CPU": float(r.torch_threads)}
    largest = max(range(len(nodes)), key=lambda i: nodes[i])
    cpus, gpus = nodes[largest]
    if cpus + 1e-9 < head["CPU"]:
        raise ScenarioError("runtime.torch_threads", r.torch_threads, f"at most the CPUs of the largest node "
                                                                      f"({cpus:g}): a trial's process holds that many")
    if r.backend == "local":
        return [head]
    beside = [*nodes[:largest], (cpus - head["CPU"], gpus), *nodes[largest + 1:]]
    try:
        actors = plan_actors(r, beside)
    except ScenarioError as exc:
        raise ScenarioError(exc.key, exc.value, f"{exc.allowed}; the trial's own process holds {head['CPU']:g} CPU "
                                                f"of the largest node") from None
    return [head] + [actor_bundle(r)] * actors


def _plan(points: list, nodes: list) -> dict:
    """Each point's bundles (:func:`bundles`), an error naming the point."""
    planned = {}
    for point in points:
        try:
            planned[point.name] = bundles(point.cfg, nodes)
        except ScenarioError as exc:
            raise ScenarioError(exc.key, exc.value, f"{exc.allowed} (at sweep point {point.name})") from None
    return planned


def _session(points: list):
    """The runtime section the sweep's Ray is started (or joined) with: that of the ray-backend
    points, the one asking most GPUs per actor (an embedded Ray then counts the GPUs), else the
    first point's. ScenarioError when they declare different Rays."""
    on_ray = [p for p in points if p.cfg.runtime.backend == "ray"]
    declared = list(dict.fromkeys(ray_of(p.cfg) for p in on_ray))
    for i, key in enumerate(("runtime.address", "runtime.num_cpus", "runtime.num_gpus")):
        values = list(dict.fromkeys(d[i] for d in declared))
        if len(values) > 1:
            raise ScenarioError(key, values, "one value for every point with --runner tune (its trials share one Ray)")
    return max(on_ray, key=lambda p: p.cfg.runtime.gpus_per_actor).cfg.runtime if on_ray else points[0].cfg.runtime


def _strategy(cfg) -> str:
    """The placement group's strategy: ``runtime.placement`` (ray backend), as RayRuntime's own group's."""
    return "SPREAD" if cfg.runtime.backend == "ray" and cfg.runtime.placement == "spread" else "PACK"


@contextmanager
def _environment(values: dict):
    """``os.environ`` with ``values`` set while the block runs."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Recorder(tune.Callback):
    """Records each trial's point as the other modes record theirs: started when Tune starts the
    trial, finished (completed, failed or errored) when it ends."""

    def __init__(self, points: list, say):
        self.points, self.say, self.began = {p.name: p for p in points}, say, {}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.began[trial.trial_id] = time.perf_counter()
        started(self.say, self.points[trial.config["point"]])

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result
        if result.get("error"):
            print(f"error: {result['error']}", file=sys.stderr)
        finished(self.say, self.points[trial.config["point"]], {k: result.get(k) for k in MEASURED})

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"error: {trial.config['point']}: {last_line(trial.get_error())}", file=sys.stderr)
        finished(self.say, self.points[trial.config["point"]],
                  {"returncode": 1, "wall_seconds": time.perf_counter() - self.began[trial.trial_id],
                   "peak_rss_bytes": None, "mode": "tune", "node": None})
