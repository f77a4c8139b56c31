"""A sweep's plan: its grid, options and points, every point's scenario validated before any runs.

The grid comes from ``--grid key=v1,v2,…`` options and from the ``sweep:`` section of the scenario
file (:data:`SECTION_KEYS`); values are YAML scalars or flow lists, parsed as omegaconf parses
``key=value`` overrides. Each point of the grid's Cartesian product, and each repeat, is a full
run: the scenario with the user's overrides, the point's grid values, ``seed = seed + repeat``
and its own ``output.dir``; :func:`plan_sweep` loads (validates) every one with
:func:`raysim.config.load_scenario`, so bad input fails before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from raysim.config import load_scenario
from raysim.errors import ScenarioError, first_line
from raysim.sweep.results import METRICS

SECTION_KEYS = ("grid", "repeat", "out", "parallel", "plots")
MAX_NAME = 200  # longer point names are cut and made unique with a hash (a file name holds 255 bytes)
_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+\-\[\]]")


@dataclass(eq=False)
class Point:
    """One run of the sweep: a point of the grid (``values``: grid key -> value as the scenario
    resolved it) and a repeat, with the overrides that make its scenario and the loaded ``cfg``."""

    name: str
    values: dict
    repeat: int
    dir: Path
    overrides: list
    cfg: object  # DictConfig


@dataclass
class Sweep:
    """A validated sweep: the scenario file (``scenario``) and what load_scenario loads of it
    (``source``: the file, or its mapping without the ``sweep:`` section), the options and the
    points in run order (repeat by repeat)."""

    scenario: str
    source: object
    grid: dict
    repeat: int
    out: Path
    parallel: int
    plots: list
    points: list


def split_values(text: str) -> list[str]:
    """``v1,v2,…`` split at the commas outside brackets, braces and quotes."""
    parts, depth, quote, current = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    return parts + ["".join(current)]


def parse_value(text: str, key: str):
    """A grid value written on the command line, read as omegaconf reads ``key=value``."""
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]))["v"]
    except OmegaConfBaseException as exc:
        raise ScenarioError(f"grid key {key}", text, f"a YAML value ({first_line(exc)})") from None


def value_text(value) -> str:
    """A value as ``key=value`` override text (YAML flow style, read back to the same value)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
    return text.removesuffix("...").strip()


def parse_grid_options(options) -> dict:
    """``--grid key=v1,v2,…`` options as {key: [values]}; ScenarioError for an option without
    ``=``, without values or with an empty value, and for a key given twice."""
    grid = {}
    for option in options:
        key, eq, text = option.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ScenarioError("--grid", option, "key=v1,v2,…, e.g. --grid algorithm.lr=0.05,0.1")
        if key in grid:
            raise ScenarioError("--grid", option, f"each grid key once ({key} is given twice)")
        texts = split_values(text)
        if any(not t.strip() for t in texts):
            raise ScenarioError(f"grid key {key}", text, "one or more values, v1,v2,… (none may be empty)")
        grid[key] = [parse_value(t, key) for t in texts]
    return grid


def read_scenario(path: str) -> tuple[object, dict]:
    """(what :func:`load_scenario` should load, the ``sweep:`` section or {}). A file with a
    ``sweep:`` section is loaded as its mapping without it; any other file as the file itself
    (load_scenario reports what is wrong with it)."""
    try:
        content = OmegaConf.to_container(OmegaConf.load(path))
    except Exception:  # a missing file, invalid YAML…: load_scenario says so in one line, before the grid is read
        load_scenario(path)
        return path, {}
    if not isinstance(content, dict) or "sweep" not in content:
        return path, {}
    section = content.pop("sweep")
    if not isinstance(section, dict):
        raise ScenarioError("sweep", section, "a mapping with keys " + ", ".join(SECTION_KEYS))
    for key in section:
        if key not in SECTION_KEYS:
            raise ScenarioError(f"sweep.{key}", section[key], "a known key; allowed here: " + ", ".join(SECTION_KEYS))
    grid = section.get("grid") or {}
    if not isinstance(grid, dict):
        raise ScenarioError("sweep.grid", grid, "a mapping of scenario keys to lists of values")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ScenarioError(f"sweep.grid.{key}", values, "a non-empty list of values")
    if not isinstance(section.get("out") or "", str):
        raise ScenarioError("sweep.out", section["out"], "a directory path")
    if not isinstance(section.get("plots", []), list):
        raise ScenarioError("sweep.plots", section["plots"], 'a list of "METRIC:KEY"')
    return content, section


def _integer(name: str, value, default: int) -> int:
    value = default if value is None else value
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScenarioError(name, value, "an integer >= 1")
    return value


def plan_sweep(scenario: str, grid_options=(), overrides=(), repeat: int | None = None, out: str | None = None,
               parallel: int | None = None, plots=None) -> Sweep:
    """The sweep of ``scenario`` with ``--grid`` options merged over its ``sweep:`` section (a
    command-line key replaces the section's values of that key; ``repeat``, ``out``, ``parallel``
    and ``plots``, when given, replace the section's), every point validated. Raises
    :class:`ScenarioError` (one line, naming the grid key and value) for bad input."""
    source, section = read_scenario(scenario)
    grid = {str(k): list(v) for k, v in (section.get("grid") or {}).items()}
    grid.update(parse_grid_options(grid_options))
    if not grid:
        key, value = ("sweep.grid", section["grid"]) if "grid" in section else ("--grid", [])
        raise ScenarioError(key, value, "at least one grid key: --grid key=v1,v2,… or a sweep: section with a "
                                        "grid in the scenario file")
    _check_grid(grid, overrides)
    repeat_key = "--repeat" if repeat is not None else "sweep.repeat"
    repeat = _integer(repeat_key, repeat, section.get("repeat", 1))
    parallel = _integer("--parallel" if parallel is not None else "sweep.parallel", parallel,
                        section.get("parallel", 1))
    if "seed" in grid and repeat > 1:
        raise ScenarioError(repeat_key, repeat, "1 when seed is a grid key (repeat r runs with seed + r: the "
                                                "seeds of the grid and of the repeats would collide)")
    plots = parse_plots(section.get("plots") or [] if plots is None else plots, grid)
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    names = _unique([",".join(f"{k}={value_text(v)}" for k, v in combo.items()) for combo in combos])
    points, first = [], {}
    for r in range(repeat):
        for combo, name in zip(combos, names):
            points.append(_point(source, combo, f"{name},repeat={r}", r, overrides, first))
    _check_read_apart(grid, combos, points[:len(combos)])
    out = out if out is not None else section.get("out")
    out = Path(out) if out else Path("results") / "sweeps" / str(points[0].cfg.name)
    for point in points:  # the output.dir of each: validated with the scenario's own (any path is)
        point.dir = out / _dir_name(point.name)
        point.overrides.append(f"output.dir={value_text(str(point.dir))}")
        point.cfg.output.dir = str(point.dir)
    return Sweep(scenario, source, grid, repeat, out, parallel, plots, points)


def parse_plots(texts, grid: dict) -> list[tuple[str, str]]:
    """``METRIC:KEY`` requests as (metric, grid key) pairs; ScenarioError for an unknown metric or
    a key that is not a grid key."""
    plots = []
    for text in texts:
        metric, _, key = str(text).partition(":")
        if metric not in METRICS or key not in grid:
            raise ScenarioError("--plot", text, f"METRIC:KEY with METRIC one of {', '.join(METRICS)} and KEY a "
                                                f"grid key ({', '.join(grid)})")
        plots.append((metric, key))
    return plots


def _check_grid(grid: dict, overrides) -> None:
    """Grid keys the sweep cannot take: output.dir (the sweep sets it), one also given as an
    override, and a key with a value twice."""
    overridden = {o.partition("=")[0].strip() for o in overrides}
    for key, values in grid.items():
        if key in ("output", "output.dir"):
            raise ScenarioError(f"grid key {key}", values, "a key other than output.dir (each point's output.dir "
                                                           "is <out>/<point>; choose the directory with --out)")
        if key in overridden:
            raise ScenarioError(f"grid key {key}", values, "a key that no key=value override also sets")
        texts = [value_text(v) for v in values]
        twice = [t for t in texts if texts.count(t) > 1]
        if twice:
            raise ScenarioError(f"grid key {key}", values, f"distinct values ({twice[0]} is given twice)")
    if {"output", "output.dir"} & overridden:
        given = next(o for o in overrides if o.partition("=")[0].strip() in ("output", "output.dir"))
        raise ScenarioError(given.partition("=")[0].strip(), given.partition("=")[2],
                            "no override in a sweep (each point's output.dir is <out>/<point>; use --out)")


def _check_read_apart(grid: dict, combos: list, points: list) -> None:
    """Values of a grid key that the scenario reads alike (1 and 1.0 of a float key) would run one
    point twice: a ScenarioError names the first two. ``points``: those of ``combos``, in order."""
    for key, values in grid.items():
        given_as = {}  # a value as the scenario holds it -> as the grid first gave it
        for combo, point in zip(combos, points):
            given, held = value_text(combo[key]), value_text(point.values[key])
            if given_as.setdefault(held, given) != given:
                raise ScenarioError(f"grid key {key}", values, f"distinct values ({given_as[held]} and {given} are "
                                                               f"both read as {held})")


def _point(source, combo: dict, name: str, repeat: int, overrides, first: dict) -> Point:
    """A validated point (its output.dir is set once the sweep's directory is known); repeats
    after the first add ``repeat`` to the first's seed."""
    grid_overrides = [f"{k}={value_text(v)}" for k, v in combo.items()]
    key = tuple(grid_overrides)
    seed = [] if repeat == 0 else [f"seed={first[key].seed + repeat}"]
    point_overrides = [*overrides, *grid_overrides, *seed]
    try:
        cfg = load_scenario(source, point_overrides)
    except ScenarioError as exc:
        raise _in_point(exc, combo, name) from None
    if repeat == 0:
        first[key] = cfg
    return Point(name, {k: _resolved(cfg, k) for k in combo}, repeat, Path(), point_overrides, cfg)


def _in_point(exc: ScenarioError, combo: dict, name: str) -> ScenarioError:
    """The error of a point's scenario, naming the grid key if it is one, else the point."""
    for key in combo:
        if exc.key == key or exc.key.startswith((key + ".", key + "[")):
            return ScenarioError(f"grid key {exc.key}", exc.value, exc.allowed)
        if key.startswith(exc.key + "."):  # the grid key lies below a key that does not exist
            return ScenarioError(f"grid key {key}", combo[key], exc.allowed)
    return ScenarioError(exc.key, exc.value, f"{exc.allowed} (at sweep point {name})")


def _resolved(cfg, key: str):
    value = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _dir_name(name: str) -> str:
    """A point's directory name: its name with characters a file name should not hold replaced."""
    safe = _UNSAFE.sub("_", name.replace(" ", ""))
    if len(safe) > MAX_NAME or safe in (".", ".."):
        safe = f"{safe[:MAX_NAME - 17]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return safe


def _unique(names: list[str]) -> list[str]:
    """Point names, those that sanitize alike made distinct with a hash of the values."""
    safe = [_dir_name(n) for n in names]
    return [n if safe.count(s) == 1 else f"{n}-{hashlib.sha256(n.encode()).hexdigest()[:8]}"
            for n, s in zip(names, safe)]


def cpus_per_point(parallel: int) -> int:
    """CPUs each of ``parallel`` concurrent points' embedded Ray declares: a fair share, at least 1."""
    return max(1, (os.cpu_count() or 1) // parallel)
