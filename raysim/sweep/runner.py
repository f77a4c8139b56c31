"""Running a sweep's points: each in a fresh ``raysim run`` process (``parallel`` at a time), one
after another in this process (``in_process``) or as Ray Tune trials (``sweep.runner``,
:mod:`raysim.sweep.trials`), then writing sweep.parquet and the plots."""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from raysim.errors import RunError, ScenarioError
from raysim.sweep.plan import Sweep, cpus_per_point, ray_of
from raysim.sweep.results import MIN_STEADY_SECONDS, finished, is_done, point_row, started, too_short, write_table


def run_sweep(sweep: Sweep, in_process: bool = False, quiet: bool = False) -> int:
    """Run the points not done yet (as Ray Tune trials when ``sweep.runner`` says so), write
    ``<out>/sweep.parquet`` and the plots, print their paths; 0 when every point completed,
    RunError (exit 1) naming the points that did not."""
    on_tune = sweep.runner == "tune"
    if in_process and on_tune:
        raise ScenarioError("--in-process", True, "not with --runner tune (each trial runs in a Ray worker of its own)")
    if (in_process or on_tune) and sweep.parallel > 1:
        raise ScenarioError("--parallel", sweep.parallel, "1 with --runner tune (Tune runs as many trials at once as "
                            "the cluster holds)" if on_tune else "1 with --in-process (points run one after another)")
    todo = [p for p in sweep.points if not is_done(p)]  # ScenarioError for a directory of another scenario
    if on_tune and todo:
        from raysim.sweep.trials import Trials

        trials = Trials(todo)  # what it can check before anything runs
    else:
        _prepare(todo, 1 if in_process else sweep.parallel)
    say = (lambda line: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    for point in sweep.points:
        if point not in todo:
            say(f"skipped {point.dir.name}: completed in {point.dir}")
    with claimed(sweep.out):
        if todo and on_tune:
            try:
                trials.run(sweep.out, say)
            except KeyboardInterrupt:
                raise _stopped(sweep) from None
        elif todo:
            (_run_in_process if in_process else _run_isolated)(sweep, todo, say)
        from raysim.sweep.plots import write_plots

        combos = len(sweep.points) // sweep.repeat  # points run repeat by repeat; rows go point by point
        rows = [{**dict.fromkeys(sweep.grid), **point_row(sweep.points[i])}  # an axis of other grids: null
                for i in sorted(range(len(sweep.points)), key=lambda i: (i % combos, i))]
        table = sweep.out / "sweep.parquet"
        write_table(rows, list(sweep.grid), table)
    print(table)
    for path in write_plots(rows, sweep.grid, sweep.plots, sweep.out):
        print(path)
    short = too_short(rows)
    if short:
        print(f"warning: {len(short)} of {len(rows)} points measured their steady rate over less than "
              f"{MIN_STEADY_SECONDS:g} s of rounds ({', '.join(Path(r['output_dir']).name for r in short[:3])}"
              f"{', …' if len(short) > 3 else ''}): their updates per second and parallel efficiency are noise; "
              f"run more rounds", file=sys.stderr)
    failed = [row["output_dir"] for row in rows if row["status"] != "completed"]
    if failed:
        raise RunError(f"{len(failed)} of {len(rows)} sweep points did not complete: {', '.join(failed)}")
    return 0


@contextmanager
def claimed(out: Path):
    """Hold the sweep directory's lock (the run lock of :class:`raysim.output.OutputDir`) while
    the sweep runs: a second sweep into it is refused (ScenarioError) instead of mixing runs."""
    from raysim.output import OutputDir

    directory = OutputDir.open(str(out), create=True)
    try:
        directory.claim("sweep")
    except ScenarioError as exc:
        raise ScenarioError("--out", str(out), exc.allowed) from None
    with directory:  # released on leaving
        yield


def _prepare(points: list, parallel: int) -> None:
    """Check that Ray's workers will import raysim and that each point's actors fit its embedded
    Ray before anything runs; with ``parallel`` > 1 points at once, an embedded Ray whose
    runtime.num_cpus the scenario leaves unset gets a fair share of the CPUs."""
    embedded = [p for p in points if p.cfg.runtime.backend == "ray"]
    if not embedded:
        return
    from raysim.import_path import check_workers_import_raysim

    for point in embedded:
        check_workers_import_raysim(point.cfg.runtime)
    from actors.runtime import cluster_address, embedded_plan

    share = cpus_per_point(parallel)
    for point in embedded:
        if cluster_address(point.cfg.runtime) is not None:
            continue
        shared = parallel > 1 and point.cfg.runtime.num_cpus is None
        if shared:
            point.cfg.runtime.num_cpus = share
            point.overrides.append(f"runtime.num_cpus={share}")
        try:
            embedded_plan(point.cfg.runtime)
        except ScenarioError as exc:
            note = f"; --parallel {parallel} gives each point runtime.num_cpus={share}" if shared else ""
            raise ScenarioError(exc.key, exc.value, f"{exc.allowed} (at sweep point {point.name}{note})") from None


def _run_isolated(sweep: Sweep, todo: list, say) -> None:
    """Each point as ``python -m raysim.cli run … --quiet`` in a fresh process, measured with its
    whole process tree; ``sweep.parallel`` at once. Ctrl-C (or SIGTERM) ends the running ones
    (SIGTERM, then SIGKILL) and stops the sweep; if the sweep's process is killed outright, they
    get SIGTERM from the kernel (:func:`raysim.lifecycle.end_with_parent`)."""
    from raysim.measure import measure
    from raysim.lifecycle import END_WITH_PARENT

    files = {point.name: _scenario_file(sweep, point) for point in todo}  # written before any point starts
    running = {}  # point name -> pid of its process, while it runs
    lock, stopping = threading.Lock(), threading.Event()

    def run(point):
        def launched(proc):
            with lock:
                running[point.name] = proc.pid
                if stopping.is_set():  # started while the sweep was stopping
                    proc.terminate()

        started(say, point)
        figures = measure([sys.executable, "-m", "raysim.cli", "run", files[point.name], *point.overrides, "--quiet",
                           "--replace"],  # a point not completed yet: what an earlier try left is replaced
                          started=launched, env={**os.environ, END_WITH_PARENT: str(os.getpid())})
        with lock:
            running.pop(point.name, None)
        if stopping.is_set():  # ended by Ctrl-C: nothing to record, the point runs again next time
            return
        finished(say, point, {"returncode": figures["returncode"], "wall_seconds": figures["wall_seconds"],
                               "peak_rss_bytes": figures["peak_rss"], "mode": "isolated"})

    pool = ThreadPoolExecutor(max_workers=sweep.parallel)
    try:
        pending = {pool.submit(run, point) for point in todo}
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
    except BaseException as exc:  # Ctrl-C, SIGTERM, or an error of the sweep itself: end the running points
        import psutil

        from raysim.lifecycle import end_processes

        pool.shutdown(wait=False, cancel_futures=True)
        with lock:
            stopping.set()
            pids = list(running.values())
        alive = []
        for pid in pids:
            try:
                alive.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        end_processes(alive)
        if isinstance(exc, KeyboardInterrupt):
            raise _stopped(sweep) from None
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _scenario_file(sweep: Sweep, point) -> str:
    """The file a point's ``raysim run`` loads: its scenario file, or the sweep file's scenario
    without its sweep: section, ``<out>/sweep_scenario.yaml``."""
    if isinstance(point.source, str):
        return point.source
    from omegaconf import OmegaConf

    path = sweep.out / "sweep_scenario.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(point.source)))
    return str(path)


def _run_in_process(sweep: Sweep, todo: list, say) -> None:
    """Each point through :func:`raysim.api.execute` in this process, one after another; points
    whose scenarios declare the same Ray (address, CPUs, GPUs) share one Ray session, started
    before them (its start-up is not in their wall time), and its ClientActors
    (:class:`actors.runtime.WarmActors`): a point that wants the actors the one before had takes
    them over, with a new ClientHost each; their own runtimes find Ray running and leave it so."""
    from raysim.api import execute, make_runtime
    from raysim.measure import peak_memory
    from raysim.lifecycle import guarded

    sessions = list(dict.fromkeys(ray_of(p.cfg) for p in todo))  # points that share a Ray run together
    with guarded() if any(sessions) else nullcontext():  # no process outlives the sweep's Ray
        session, declared, warm = None, None, None
        try:
            for point in sorted(todo, key=lambda p: sessions.index(ray_of(p.cfg))):
                if session is None or ray_of(point.cfg) != declared:
                    if session is not None:
                        session.close()
                    session, declared = make_runtime(point.cfg), ray_of(point.cfg)
                    warm = None
                    if declared is None:
                        session.start()
                    else:  # torch loads while Ray starts; the actors, while the first point prepares
                        with loading_meanwhile("raysim.engine.run"):
                            session.start()
                        warm = session.warm_actors()
                        with suppress(ScenarioError):  # actors that do not fit: the point itself says so
                            warm.prestart(point.cfg.runtime)
                started(say, point)
                began = time.perf_counter()
                with peak_memory(os.getpid()) as peak:
                    try:
                        execute(point.cfg, began=began, replace=True, warm=warm)
                        code = 0
                    except (RunError, ScenarioError) as exc:
                        print(f"error: {exc}", file=sys.stderr)
                        code = 1
                    except KeyboardInterrupt:
                        raise _stopped(sweep) from None
                finished(say, point, {"returncode": code, "wall_seconds": time.perf_counter() - began,
                                       "peak_rss_bytes": peak["rss"], "mode": "in-process"})
        finally:
            if session is not None:
                session.close()


@contextmanager
def loading_meanwhile(module: str):
    """Import ``module`` in a helper thread while the block runs (a Ray start-up waits on its
    daemons' processes more than it computes); waits for it on leaving."""
    import importlib

    loader = threading.Thread(target=importlib.import_module, args=(module,), name="raysim-import", daemon=True)
    loader.start()
    try:
        yield
    finally:
        loader.join()


def _stopped(sweep: Sweep) -> KeyboardInterrupt:
    return KeyboardInterrupt(f"interrupted: the sweep stopped; run the same command again to go on (completed "
                             f"points in {sweep.out} are skipped)")
