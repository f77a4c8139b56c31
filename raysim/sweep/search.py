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
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from omegaconf import OmegaConf
from ray import tune

from raysim.errors import RunError, RunStopped, ScenarioError
from raysim.sweep.plan import Point, dir_name, parse_value, split_section, split_values
from raysim.sweep.results import _json, value_text

ALGOS = ("random", "grid", "optuna")
DOMAINS = {"loguniform": 2, "uniform": 2, "randint": 2, "choice": None}  # SPEC function -> its arguments
FINISHED = ("completed", "stopped")  # a trial directory with a run that ended so is not run again
EVALUATED = re.compile(r"^(test_|personalized_|new_client_)")  # rounds.parquet columns logged at evaluations
SUMMARY_ONLY = ("final_test_accuracy", "final_test_loss", "final_personalized_accuracy",
                "final_new_client_accuracy", "final_new_client_personalized_accuracy")
_SPEC = re.compile(r"^\s*([a-z_]+)\((.*)\)\s*$")
# raysim tune's options: name -> (its flag, default, type); a scenario file's tune: section may set each
OPTIONS = {"metric": ("--metric", "test_accuracy", str), "mode": ("--mode", "max", str),
           "samples": ("--samples", None, int), "algo": ("--algo", "random", str), "asha": ("--asha", False, bool),
           "grace_period": ("--grace-period", 1, int), "seed": ("--seed", 0, int), "out": ("--out", None, str)}
SECTION_KEYS = ("search", *OPTIONS)  # the keys of a scenario file's tune: section


@dataclass
class Search:
    """A validated search: the scenario and overrides, the space (key -> (SPEC function, its
    arguments); grid: ("choice", values)), the metric (``per_round``: logged in rounds.parquet at
    evaluations, else a summary figure) and the options."""

    scenario: object  # what load_scenario loads: the file, or its mapping without its tune: section
    overrides: list
    space: dict
    metric: str
    per_round: bool
    mode: str
    samples: int
    algo: str
    asha: bool
    grace_period: int
    seed: int
    out: Path
    cfg: object  # the scenario without searched values (its runtime and resources are every trial's)


def parse_spec(key: str, text, algo: str, where: str | None = None, algo_named: str = "--algo") -> tuple[str, list]:
    """A key's range, ``--search KEY=SPEC`` (or ``where``: the ``tune.search`` entry it comes
    from; ``algo_named``: what set the algo), as (function, arguments); a plain comma list (or a
    YAML list) is a choice. ScenarioError
    for an unknown function, a wrong number of arguments or bounds that are not numbers in order."""
    where = where or f"--search {key}"
    if isinstance(text, list) and text:
        return "choice", text
    if not isinstance(text, str):
        text = "" if text is None else value_text(text)
    match = _SPEC.match(text)
    if match is None or match.group(1) not in DOMAINS:
        if match is not None or not text.strip():
            raise ScenarioError(where, text, f"v1,v2,… or one of {', '.join(f'{d}(…)' for d in DOMAINS)}, "
                                             "e.g. loguniform(0.01,0.5)")
        return "choice", [parse_value(v, key) for v in split_values(text)]
    function, args = match.group(1), [parse_value(v, key) for v in split_values(match.group(2))]
    if algo == "grid" and function != "choice":
        raise ScenarioError(where, text, f"v1,v2,… (or choice(…)) with {algo_named} grid")
    wanted = DOMAINS[function]
    if wanted is None:
        return function, args
    numbers = all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
    if len(args) != wanted or not numbers or not args[0] < args[1] or (function == "loguniform" and args[0] <= 0) \
            or (function == "randint" and not all(isinstance(a, int) for a in args)):
        kind = "integers" if function == "randint" else "positive numbers" if function == "loguniform" else "numbers"
        raise ScenarioError(where, text, f"{function}(a,b) with {kind} a < b")
    return function, args


def plan_search(scenario: str, overrides=(), search=(), **options) -> Search:
    """The validated search of ``scenario`` (a scenario file, which may hold a ``tune:`` section of
    :data:`SECTION_KEYS`): ``search`` (``KEY=SPEC`` options) replaces or adds to the section's
    ``search`` ranges, and each of ``options`` (:data:`OPTIONS`: metric, mode, samples, algo,
    asha, grace_period, seed, out) given, not None, replaces the section's. ScenarioError, one line
    naming the flag or the section's key, for bad input: each key's candidate values (bounds,
    choices) load as the scenario's, the metric is one the runs log (per round with asha), and a
    grid has at least ``samples`` points."""
    from raysim.scenario import load_scenario

    source, section = split_section(scenario, "tune", SECTION_KEYS)
    chosen = {name: options[name] if options.get(name) is not None else section.get(name, default)
              for name, (_, default, _) in OPTIONS.items()}

    def where(name: str) -> str:  # the section's key that gave an option, else its flag (given, or the default's)
        return f"tune.{name}" if options.get(name) is None and name in section else OPTIONS[name][0]

    for name, (_, _, kind) in OPTIONS.items():
        value = chosen[name]
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise ScenarioError(where(name), value, f"a value of type {kind.__name__}")
    algo, mode, samples = chosen["algo"], chosen["mode"], chosen["samples"]
    if algo not in ALGOS:
        raise ScenarioError(where("algo"), algo, " or ".join(ALGOS))
    if mode not in ("max", "min"):
        raise ScenarioError(where("mode"), mode, "max or min")
    ranges = section.get("search") or {}
    if not isinstance(ranges, dict):
        raise ScenarioError("tune.search", ranges, "a mapping of scenario keys to ranges, e.g. algorithm.lr: "
                                                   "loguniform(0.01,0.5)")
    ranges = {str(key): (f"tune.search.{key}", spec) for key, spec in ranges.items()}
    given = set()
    for option in search:
        key, eq, text = option.partition("=")
        key = key.strip()
        if not eq or not key or key in given:
            raise ScenarioError("--search", option, "KEY=SPEC, each key once, e.g. algorithm.lr=loguniform(0.01,0.5)")
        given.add(key)
        ranges[key] = (f"--search {key}", text)
    if not ranges:
        raise ScenarioError("--search", [], "at least one KEY=SPEC, e.g. --search algorithm.lr=loguniform(0.01,0.5), "
                                            "or a tune.search section in the scenario file")
    cfg = load_scenario(source, list(overrides))
    overridden = {o.partition("=")[0].strip() for o in overrides}
    space = {}
    for key, (named, spec) in ranges.items():
        if key in ("output", "output.dir", "seed") or key in overridden:
            raise ScenarioError(named, spec, "a scenario key other than output.dir and seed that no key=value "
                                             "override sets")
        space[key] = parse_spec(key, spec, algo, named, where("algo"))
        for value in space[key][1]:  # each bound or choice loads as the scenario's value
            try:
                load_scenario(source, [*overrides, f"{key}={value_text(value)}"])
            except ScenarioError as exc:
                raise ScenarioError(named, spec, exc.allowed if exc.key == key else str(exc)) from None
    per_round = _check_metric(cfg, chosen["metric"], chosen["asha"], where("metric"), where("asha"))
    points = math.prod(len(args) for _, args in space.values())
    if samples is None:
        samples = points if algo == "grid" else 1
    if samples < 1:
        raise ScenarioError(where("samples"), samples, "an integer >= 1")
    if algo == "grid" and samples > points:
        raise ScenarioError(where("samples"), samples, f"at most the grid's {points} points with {where('algo')} grid")
    if chosen["grace_period"] < 1:
        raise ScenarioError(where("grace_period"), chosen["grace_period"], "an integer >= 1 (rounds)")
    out = Path(chosen["out"]) if chosen["out"] else Path("results") / "searches" / str(cfg.name)
    return Search(source, list(overrides), space, chosen["metric"], per_round, mode, samples, algo, chosen["asha"],
                  chosen["grace_period"], chosen["seed"], out, cfg)


def _check_metric(cfg, metric: str, asha: bool, where: str = "--metric", asha_named: str = "--asha") -> bool:
    """Whether ``metric`` is logged per round (True) or only in the summary at the end (False);
    ScenarioError (naming ``where``) when the runs do not log it, or log it only at the end and
    ``asha`` (set by ``asha_named``) needs it per round."""
    from raysim.catalog import algorithm_class
    from raysim.output.directory import ROUNDS_SCHEMA

    columns = [f.name for f in ROUNDS_SCHEMA if f.name not in ("round", "parameters")]
    columns += list(algorithm_class(cfg.algorithm.name).server_diagnostics)
    at_end = EVALUATED.match(metric) and cfg.eval.every == 0
    if metric in columns and not at_end:
        return True
    if metric not in columns and metric not in SUMMARY_ONLY:
        raise ScenarioError(where, metric, f"a column of rounds.parquet ({', '.join(columns)}) or a summary "
                                                f"figure ({', '.join(SUMMARY_ONLY)})")
    if asha:
        why = "eval.every is 0: evaluated at the end only" if at_end else "a summary figure, known at the end only"
        raise ScenarioError(where, metric, f"a metric logged per round with {asha_named} ({why}), e.g. test_accuracy "
                                                "with eval.every > 0")
    return False


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

