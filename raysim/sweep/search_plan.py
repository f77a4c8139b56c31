"""A search's plan (``raysim tune``): its ranges, metric and options, from the command line and a
scenario file's ``tune:`` section, validated before any trial starts (without importing Ray).
:mod:`raysim.sweep.search` runs it on Ray Tune."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from raysim.errors import ScenarioError
from raysim.sweep.plan import parse_value, split_section, split_values
from raysim.sweep.results import value_text

ALGOS = ("random", "grid", "optuna")
DOMAINS = {"loguniform": 2, "uniform": 2, "randint": 2, "choice": None}  # SPEC function -> its arguments
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


def search_section(path: str) -> dict:
    """The ``tune:`` section of the scenario file ``path`` ({} when it has none): whether it is a
    search file (ScenarioError for a section that is not a mapping of :data:`SECTION_KEYS`)."""
    return split_section(path, "tune", SECTION_KEYS)[1]


def parse_spec(key: str, text, algo: str, where: str | None = None, algo_named: str = "--algo") -> tuple[str, list]:
    """A key's range, ``--search KEY=SPEC`` (or ``where``: the ``tune.search`` entry it comes
    from; ``algo_named``: what set the algo), as (function, arguments); a plain comma list (or a
    YAML list) is a choice. ScenarioError for an unknown function, a wrong number of arguments or
    bounds that are not numbers in order."""
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
