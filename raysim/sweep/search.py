"""A search over scenario keys as Ray Tune trials (``raysim tune``), with ASHA early stopping.

Each trial is a normal raysim run in ``<out>/trial_<i>_<params>/`` (report, resume), run by
:class:`SearchTrial` in a Tune actor whose resources are those of a sweep's trial
(:mod:`raysim.sweep.trials`, which also holds the Ray session). The run's rounds.parquet rows that
carry the metric are reported to Tune as they are logged (:func:`raysim.api.execute`'s ``on_round``
hook), with ``round``; when Tune's scheduler (ASHA) stops the trial, the run ends at that round
with a checkpoint and ``status: stopped``. Tune's own searchers sample: random and grid
(``BasicVariantGenerator``, seeded) and optuna (``OptunaSearch``, TPE seeded). At the end:
``<out>/search.parquet`` (one row per trial) and ``<out>/best.yaml`` (the best trial's scenario).

A trial whose directory holds its run, completed or stopped, is not run again: its logged rows are
reported again (so that ASHA sees them), and it keeps its status.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from omegaconf import OmegaConf
from ray import tune

from raysim.errors import RunError, RunStopped, ScenarioError
from raysim.sweep.plan import Point, dir_name
from raysim.sweep.results import _json, value_text
from raysim.sweep.search_plan import Search

FINISHED = ("completed", "stopped")  # a trial directory with a run that ended so is not run again


def trial_params(config: dict) -> dict:
    """A trial's searched values (a grid trial's config holds them under ``grid``) as plain Python."""
    params = config.get("grid", config)
    return {k: v.item() if hasattr(v, "item") else v for k, v in params.items()}


def trial_name(index, params: dict) -> str:
    """A trial's directory name: ``trial_<i>_<key leaf>=<value>,…`` (floats to 4 significant digits)."""
    short = ",".join(f"{k.rsplit('.', 1)[-1]}={f'{v:.4g}' if isinstance(v, float) else value_text(v)}"
                     for k, v in params.items())
    return dir_name(f"trial_{index}_{short}")


def trial_point(search: Search, name: str, params: dict) -> Point:
    """The run of a trial: the scenario with its searched values, in ``<out>/<name>``."""
    from raysim.scenario import load_scenario

    directory = search.out / name
    overrides = [*search.overrides, *(f"{k}={value_text(v)}" for k, v in params.items()),
                 f"output.dir={value_text(str(directory))}"]
    return Point(name, params, 0, directory, search.scenario, overrides, load_scenario(search.scenario, overrides))


class SearchTrial(tune.Trainable):
    """A trial: its run goes on in a thread of this actor through :func:`raysim.api.execute`; each
    logged row that carries the metric is a result of :meth:`step` (``round`` and the metric), and
    the run waits for the next ``step`` before it goes on, so that a stop ends it at that round.
    :meth:`cleanup` (Tune stopped the trial, or it ended) waits for the run's summary."""

    def setup(self, config: dict, search: Search = None):
        # Tune saves an empty checkpoint as a trial pauses or ends and says so at INFO: noise on the sweep's stderr
        logging.getLogger("ray.train").setLevel(logging.WARNING)
        self.search, self.results, self.go = search, queue.Queue(), threading.Semaphore(0)
        self.stopping, self.stepped = False, False
        self.last = None  # the metric's value reported last
        self.point = trial_point(search, Path(self.logdir).name, trial_params(config))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def step(self) -> dict:
        if self.stepped:
            self.go.release()  # the run goes on past the row reported last
        self.stepped = True
        result = self.results.get()
        if isinstance(result, BaseException):
            raise result
        return {**result, "node": ray.get_runtime_context().get_node_id()}

    def cleanup(self):
        self.stopping = True
        self.go.release()
        self.thread.join()

    def save_checkpoint(self, checkpoint_dir: str):
        """Nothing for Tune to keep: the run's own checkpoint.pt is what resumes it."""
        return None

    def _run(self) -> None:
        from raysim.api import execute
        from raysim.sweep.results import code_version, is_done, save_measured

        search, point = self.search, self.point
        try:
            if is_done(point, FINISHED):  # run before by this search: its rows again, for the scheduler
                summary = _json(point.dir / "summary.json")
                for row in pq.read_table(point.dir / "rounds.parquet").to_pylist():
                    self._row(row)
            else:
                point.dir.mkdir(parents=True, exist_ok=True)
                summary, _ = execute(point.cfg, replace=True, on_round=self._row)
                save_measured(point, {"returncode": 0, "mode": "tune", **code_version()})
        except RunStopped as exc:  # a run replayed above, stopped earlier this time: it stays as it is
            summary = {"status": "stopped", "stopped_at_round": exc.round}
        except (RunError, ScenarioError) as exc:
            self.results.put(RunError(f"{point.name}: {exc}"))
            return
        except BaseException as exc:  # a fault in code: the trial errors with it
            self.results.put(exc)
            return
        value = summary.get(search.metric) if not search.per_round else self.last
        self.results.put({"round": summary.get("stopped_at_round") or summary.get("rounds"), search.metric: value,
                          "status": summary["status"], "done": True})

    def _row(self, row: dict) -> None:
        """The ``on_round`` hook: report a row carrying the metric, wait for Tune's next step."""
        value = row.get(self.search.metric)
        if not self.search.per_round or value is None or (isinstance(value, float) and math.isnan(value)):
            return
        self.last = float(value)
        self.results.put({"round": int(row["round"]), self.search.metric: self.last})
        self.go.acquire()
        execution = self.point.cfg.execution
        if self.stopping and not (execution.mode == "sync" and row["round"] >= execution.rounds):
            raise RunStopped(int(row["round"]))  # a stop at the last round (ASHA's max_t) lets the run complete


def run_search(search: Search, quiet: bool = False) -> int:
    """Run the search's trials (those done before are reported again, not rerun), write
    ``<out>/search.parquet`` and ``<out>/best.yaml``, print their paths and a line per trial;
    0 when at least one trial completed or stopped, else RunError."""
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import BasicVariantGenerator

    from raysim.sweep.runner import claimed
    from raysim.sweep.trials import Trials, placement, run_config

    base = Point("trial", {}, 0, search.out, search.scenario, search.overrides, search.cfg)
    trials = Trials([base])  # the resources of every trial (the searched keys leave them as they are)
    if search.algo == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        searcher = OptunaSearch(sampler=optuna.samplers.TPESampler(seed=search.seed))
    else:
        searcher = BasicVariantGenerator(random_state=search.seed)
    space = _space(search)
    scheduler = None
    if search.asha:
        rounds = search.cfg.execution.rounds if search.cfg.execution.mode == "sync" else 10 ** 9
        scheduler = ASHAScheduler(time_attr="round", max_t=rounds, grace_period=search.grace_period,
                                  reduction_factor=2)

    def tuner(bundles):
        return tune.Tuner(
            tune.with_resources(tune.with_parameters(SearchTrial, search=search), placement(search.cfg,
                                                                                            bundles["trial"])),
            param_space=space,
            tune_config=tune.TuneConfig(metric=search.metric, mode=search.mode, search_alg=searcher,
                                        scheduler=scheduler, num_samples=1 if search.algo == "grid" else search.samples,
                                        trial_dirname_creator=lambda t: trial_name(t.experiment_tag.split("_")[0],
                                                                                   trial_params(t.config))),
            run_config=run_config(search.out, []))

    with claimed(search.out):
        grid = trials.fit(tuner)
        rows = [_row_of(search, result) for result in grid]
        rows.sort(key=lambda r: int(r["trial"].split("_")[1]))
        table = search.out / "search.parquet"
        _write(rows, search, table)
        ranked = [r for r in rows if r["status"] == "completed" and r["last"] is not None] or \
                 [r for r in rows if r["status"] in FINISHED and r["last"] is not None]
        best = None
        if ranked:
            best = (max if search.mode == "max" else min)(ranked, key=lambda r: r["last"])
            scenario = OmegaConf.load(Path(best["output_dir"]) / "scenario.yaml")
            scenario.output.dir = str(search.out / "best")
            (search.out / "best.yaml").write_text(OmegaConf.to_yaml(scenario))
    if not quiet:
        for r in rows:
            at = f" at round {r['stopped_at_round']}" if r["status"] == "stopped" else ""
            print(f"{r['status']:9s} {r['trial']}{at}: {search.metric} {r['last']}", file=sys.stderr)
    print(table)
    if best is None:
        raise RunError(f"no trial of the search completed: see {table}")
    print(search.out / "best.yaml")
    return 0


def _space(search: Search) -> dict:
    """Tune's param_space: a domain per key, or (grid) the first ``samples`` points of the product."""
    if search.algo == "grid":
        keys = list(search.space)
        points = itertools.islice(itertools.product(*(args for _, args in search.space.values())), search.samples)
        return {"grid": tune.grid_search([dict(zip(keys, p)) for p in points])}
    domains = {"loguniform": tune.loguniform, "uniform": tune.uniform, "randint": tune.randint}
    return {k: tune.choice(args) if f == "choice" else domains[f](*args) for k, (f, args) in search.space.items()}


def _row_of(search: Search, result) -> dict:
    """A trial's row of search.parquet, from its run directory (and Tune's last result)."""
    name = Path(result.path).name
    directory = search.out / name
    summary = _json(directory / "summary.json") or {}
    status = "failed" if result.error is not None else summary.get("status", "failed")
    values = []
    if search.per_round and (directory / "rounds.parquet").exists():
        logged = pq.read_table(directory / "rounds.parquet", columns=[search.metric]).column(0).to_pylist()
        values = [v for v in logged if v is not None and not math.isnan(v)]
    elif summary.get(search.metric) is not None:
        values = [summary[search.metric]]
    return {"trial": name, **trial_params(result.config), "status": status,
            "stopped_at_round": summary.get("stopped_at_round"), "rounds": summary.get("rounds"),
            "last": values[-1] if values else None,
            "best": ((max if search.mode == "max" else min)(values)) if values else None,
            "node": (result.metrics or {}).get("node"), "wall_seconds": summary.get("wall_seconds"),
            "output_dir": str(directory)}


def _write(rows: list, search: Search, path: Path) -> None:
    """search.parquet: the rows, ``last`` and ``best`` named after the metric."""
    columns = {}
    for name in rows[0] if rows else ["trial"]:
        values = [r.get(name) for r in rows]
        title = f"{search.metric}_{name}" if name in ("last", "best") else name
        try:
            columns[title] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            columns[title] = pa.array([None if v is None else value_text(v) for v in values], pa.string())
    pq.write_table(pa.table(columns), path)

