"""A sweep's plan: its grids, options and points, every point's scenario validated before any runs.

The grid comes from ``--grid key=v1,v2,…`` options and from the ``sweep:`` section of the scenario
file (:data:`SECTION_KEYS`); values are YAML scalars or flow lists, parsed as omegaconf parses
``key=value`` overrides. A grid maps each of its axes to its values:

- a scenario key to a list of values (``algorithm.lr: [0.05, 0.1]``);
- a name to labelled sets of keys set together (``attack: {sign_flip: {system.byzantine.attack:
  sign_flip, system.byzantine.scale: 4}, …}``): the point's column holds the label; a set's
  ``~KEY: null`` unsets KEY, as the ``~KEY`` override does;
- ``scenario`` (a plain axis, or a key in a set) to scenario files, relative to the sweep file,
  when the sweep file holds only its ``sweep:`` section: several scenarios in one study
  (``sweep.scenario``: the file of the points that name none).

``sweep.grid`` is one grid or a list of them: the sweep runs the union of their points (e.g. a
reference point beside a product, or per-setting lists of methods). Each point of a grid's
Cartesian product, and each repeat, is a full run: the scenario with the user's overrides, the
point's grid values, ``seed = seed + repeat`` and its own ``output.dir``; :func:`plan_sweep`
loads (validates) every one with :func:`raysim.scenario.load_scenario`, so bad input fails before
anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from raysim.scenario import load_scenario
from raysim.errors import ScenarioError, first_line
from raysim.sweep.results import METRICS, value_text

SECTION_KEYS = ("scenario", "grid", "repeat", "out", "parallel", "plots", "runner")
RUNNERS = ("processes", "tune")  # what runs the points: raysim run processes (or this one), or Tune trials
SCENARIO = "scenario"  # the grid key whose values are scenario files
PROGRESS_FROM = 50  # sweeps of this many points or more show a bar while they validate
MAX_NAME = 200  # longer point names are cut and made unique with a hash (a file name holds 255 bytes)
_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+\-\[\]]")


@dataclass(eq=False)
class Point:
    """One run of the sweep: a point of a grid (``values``: axis -> value as the scenario resolved
    it, a set's label, or the scenario file as given) and a repeat, with what load_scenario loads
    (``source``: a file, or the sweep file's mapping without its ``sweep:`` section), the
    overrides that make its scenario of it and the loaded ``cfg``."""

    name: str
    values: dict
    repeat: int
    dir: Path
    source: object
    overrides: list
    cfg: object  # DictConfig


@dataclass
class Sweep:
    """A validated sweep: the sweep file (``scenario``), its axes (``grid``: axis -> the values or
    labels of every grid, in order), the options and the points in run order (repeat by repeat)."""

    scenario: str
    grid: dict
    repeat: int
    out: Path
    parallel: int
    plots: list
    points: list
    runner: str = "processes"  # one of RUNNERS


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
    except yaml.YAMLError as exc:  # as a key=value override's (raysim.scenario.load): the parser's problem
        problem = getattr(exc, "problem", None) or first_line(exc)
        raise ScenarioError(f"grid key {key}", text, f"a YAML value ({problem})") from None


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


def split_section(path: str, name: str, keys: tuple) -> tuple[object, dict]:
    """(what :func:`load_scenario` should load, the file's ``name:`` section or {}): a file with
    that section is loaded as its mapping without it, any other file as the file itself
    (load_scenario reports what is wrong with it). ScenarioError for a section that is not a
    mapping of ``keys``."""
    try:
        content = OmegaConf.to_container(OmegaConf.load(path))
    except Exception:  # a missing file, invalid YAML…: load_scenario says so in one line, before the section is read
        load_scenario(path)
        return path, {}
    if not isinstance(content, dict) or name not in content:
        return path, {}
    section = content.pop(name)
    if not isinstance(section, dict):
        raise ScenarioError(name, section, "a mapping with keys " + ", ".join(keys))
    for key in section:
        if key not in keys:
            raise ScenarioError(f"{name}.{key}", section[key], "a known key; allowed here: " + ", ".join(keys))
    return content, section


def read_scenario(path: str) -> tuple[object, dict]:
    """(what :func:`load_scenario` should load, the ``sweep:`` section or {}): see :func:`split_section`."""
    content, section = split_section(path, "sweep", SECTION_KEYS)
    if not section:
        return content, section
    grids = section.get("grid") or {}
    for i, grid in enumerate(grids if isinstance(grids, list) else [grids]):
        where = f"sweep.grid[{i}]" if isinstance(grids, list) else "sweep.grid"
        if not isinstance(grid, dict) or (not grid and isinstance(grids, list)):
            raise ScenarioError(where, grid, "a mapping of scenario keys to lists of values (or of axis names to "
                                             "labelled sets of keys); sweep.grid may be a list of such grids")
        for key, values in grid.items():
            if isinstance(values, dict):
                _check_sets(f"{where}.{key}", values)
            elif not isinstance(values, list) or not values:
                raise ScenarioError(f"{where}.{key}", values, "a non-empty list of values, or a mapping of labels "
                                                               "to the keys each sets")
    for key in ("scenario", "out"):
        if not isinstance(section.get(key) or "", str):
            raise ScenarioError(f"sweep.{key}", section[key], "a directory path" if key == "out" else "a file path")
    if not isinstance(section.get("plots", []), list):
        raise ScenarioError("sweep.plots", section["plots"], 'a list of "METRIC:KEY"')
    return content, section


def _check_sets(where: str, sets: dict) -> None:
    """A labelled axis: at least one label, each naming a mapping of keys (or nothing: no keys)."""
    if not sets:
        raise ScenarioError(where, sets, "at least one label")
    for label, keys in sets.items():
        if keys is not None and not isinstance(keys, dict):
            raise ScenarioError(f"{where}.{label}", keys, "a mapping of scenario keys to values (the keys this label "
                                                          "sets), or nothing")


def _integer(name: str, value, default: int) -> int:
    value = default if value is None else value
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScenarioError(name, value, "an integer >= 1")
    return value


def plan_sweep(scenario: str, grid_options=(), overrides=(), repeat: int | None = None, out: str | None = None,
               parallel: int | None = None, plots=None, progress: bool = False,
               runner: str | None = None) -> Sweep:
    """The sweep of ``scenario`` with ``--grid`` options merged over its ``sweep:`` section (a
    command-line key replaces that key's values in every grid, or joins the grids without it; a
    labelled axis's key selects its points with those labels; ``repeat``, ``out``, ``parallel``,
    ``plots`` and ``runner``, when given, replace the section's), every point validated (with ``progress``, a bar on
    stderr while a sweep of :data:`PROGRESS_FROM` points or more validates). Raises
    :class:`ScenarioError` (one line, naming the grid key and value) for bad input."""
    source, section = read_scenario(scenario)
    grids = section.get("grid") or {}
    grids = [_axes(grid) for grid in (grids if isinstance(grids, list) else [grids])]
    grids = _merge(grids, parse_grid_options(grid_options))
    if not any(grids):
        key, value = ("sweep.grid", section["grid"]) if "grid" in section else ("--grid", [])
        raise ScenarioError(key, value, "at least one grid key: --grid key=v1,v2,… or a sweep: section with a "
                                        "grid in the scenario file")
    for grid in grids:
        _check_grid(grid, overrides)
    repeat_key = "--repeat" if repeat is not None else "sweep.repeat"
    repeat = _integer(repeat_key, repeat, section.get("repeat", 1))
    parallel = _integer("--parallel" if parallel is not None else "sweep.parallel", parallel,
                        section.get("parallel", 1))
    runner_key, runner = ("--runner", runner) if runner is not None else \
        ("sweep.runner", section.get("runner", RUNNERS[0]))
    if runner not in RUNNERS:
        raise ScenarioError(runner_key, runner, " or ".join(RUNNERS))
    if repeat > 1 and any("seed" in entry[1] for grid in grids for entries in grid.values() for entry in entries):
        raise ScenarioError(repeat_key, repeat, "1 when seed is a grid key (repeat r runs with seed + r: the "
                                                "seeds of the grid and of the repeats would collide)")
    axes = {}  # axis -> its values or labels over all grids, in order
    for grid in grids:
        for axis, entries in grid.items():
            known = axes.setdefault(axis, [])
            known += [v for v, _ in entries if value_text(v) not in map(value_text, known)]
    plots = parse_plots(section.get("plots") or [] if plots is None else plots, axes)
    combos = [combo for grid in grids for combo in itertools.product(*([(axis, *entry) for entry in entries]
                                                                        for axis, entries in grid.items()))]
    names = [",".join(f"{axis}={value_text(v)}" for axis, v, _ in combo) for combo in combos]
    twice = [n for n in names if names.count(n) > 1]
    if twice:
        raise ScenarioError("sweep.grid", twice[0], "grids whose points differ (this point is in two of them)")
    names = _unique(names)
    base = Path(scenario).parent
    points, first = [], {}
    with _validating(repeat * len(combos), progress) as bar:
        for r in range(repeat):
            for combo, name in zip(combos, names):
                points.append(_point(source, base, section.get("scenario"), combo, f"{name},repeat={r}", r,
                                     overrides, first))
                bar.update()
    _check_read_apart(axes, combos, points[:len(combos)])
    out = out if out is not None else section.get("out")
    default = points[0].cfg.name if isinstance(source, str) or source else Path(scenario).stem
    out = Path(out) if out else Path("results") / "sweeps" / str(default)
    for point in points:  # the output.dir of each: validated with the scenario's own (any path is)
        point.dir = out / dir_name(point.name)
        point.overrides.append(f"output.dir={value_text(str(point.dir))}")
        point.cfg.output.dir = str(point.dir)
    return Sweep(scenario, axes, repeat, out, parallel, plots, points, runner)


def _validating(points: int, progress: bool):
    """A tqdm bar over the validation of ``points`` points on stderr, shown only with ``progress`` and
    for :data:`PROGRESS_FROM` points or more (each takes tens of milliseconds); gone once they are."""
    from tqdm import tqdm

    return tqdm(total=points, desc="validating sweep points", unit="point", leave=False, dynamic_ncols=True,
                mininterval=1, disable=not progress or points < PROGRESS_FROM)


def _axes(grid: dict) -> dict:
    """A grid as {axis: [(value or label, {key: value it sets})]}."""
    axes = {}
    for axis, values in grid.items():
        axis = str(axis)
        if isinstance(values, dict):
            axes[axis] = [(str(label), dict(keys or {})) for label, keys in values.items()]
        else:
            axes[axis] = [(v, {axis: v}) for v in values]
    return axes


def _merge(grids: list, options: dict) -> list:
    """The grids with the ``--grid`` options applied: a labelled axis's option keeps the points with
    those labels (grids without them drop out); another key's replaces its values in every grid,
    or joins those without it."""
    for key, values in options.items():
        labelled = [g for g in grids if key in g and any(keys != {key: v} for v, keys in g[key])]
        if labelled:
            labels = [str(v) for v in values]
            known = list(dict.fromkeys(label for g in labelled for label, _ in g[key]))
            missing = [label for label in labels if label not in known]
            if missing:
                raise ScenarioError(f"--grid {key}", missing[0], f"a label of the grid's {key}: {', '.join(known)}")
            grids = [dict(g, **{key: [e for label in labels for e in g[key] if e[0] == label]}) for g in labelled]
            grids = [g for g in grids if g[key]]
        else:
            grids = [dict(g, **{key: [(v, {key: v}) for v in values]}) for g in grids] or \
                [{key: [(v, {key: v}) for v in values]}]
    return grids


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
    override, one that two axes set, and a key or label with a value twice."""
    overridden = {o.partition("=")[0].strip() for o in overrides}
    setters = {}  # scenario key -> the axis that sets it
    for axis, entries in grid.items():
        for key in dict.fromkeys(k for _, keys in entries for k in keys):
            name = f"grid key {key}" if key == axis else f"grid key {axis}: {key}"
            values = [keys[key] for _, keys in entries if key in keys]
            if key in ("output", "output.dir"):
                raise ScenarioError(name, values, "a key other than output.dir (each point's output.dir is "
                                                  "<out>/<point>; choose the directory with --out)")
            if key in overridden:
                raise ScenarioError(name, values, "a key that no key=value override also sets")
            if setters.setdefault(key, axis) != axis:
                raise ScenarioError(name, values, f"a key that one axis of a grid sets ({setters[key]} sets it too)")
        texts = [value_text(v) for v, _ in entries]
        twice = [t for t in texts if texts.count(t) > 1]
        if twice:
            raise ScenarioError(f"grid key {axis}", [v for v, _ in entries], f"distinct values ({twice[0]} is given "
                                                                              f"twice)")
    if {"output", "output.dir"} & overridden:
        given = next(o for o in overrides if o.partition("=")[0].strip() in ("output", "output.dir"))
        raise ScenarioError(given.partition("=")[0].strip(), given.partition("=")[2],
                            "no override in a sweep (each point's output.dir is <out>/<point>; use --out)")


def _check_read_apart(axes: dict, combos: list, points: list) -> None:
    """Values of a grid key that the scenario reads alike (1 and 1.0 of a float key) would run one
    point twice: a ScenarioError names the first two. ``points``: those of ``combos``, in order."""
    given_as = {}  # (key, value as the scenario holds it) -> as the grid first gave it
    for combo, point in zip(combos, points):
        for axis, value, keys in combo:
            if keys == {axis: value} and axis != SCENARIO:
                given, held = value_text(value), value_text(point.values[axis])
                if given_as.setdefault((axis, held), given) != given:
                    raise ScenarioError(f"grid key {axis}", axes[axis], f"distinct values "
                                        f"({given_as[axis, held]} and {given} are both read as {held})")


def _point(source, base: Path, default, combo: tuple, name: str, repeat: int, overrides, first: dict) -> Point:
    """A validated point (its output.dir is set once the sweep's directory is known); repeats
    after the first add ``repeat`` to the first's seed. ``base``: the directory of the sweep file,
    which scenario files (the point's ``scenario`` key, else ``default``, sweep.scenario) are
    relative to."""
    keys = {k: v for _, _, ks in combo for k, v in ks.items()}
    key = f"grid key {SCENARIO}" if SCENARIO in keys else f"sweep.{SCENARIO}"
    given = keys.pop(SCENARIO, default)
    if given is not None:
        if not isinstance(source, dict) or source:
            raise ScenarioError(key, given, "scenario files in a sweep file that holds only its sweep: section (its "
                                            "other keys would be ignored)")
        source = str(base / str(given))
        if not Path(source).is_file():
            raise ScenarioError(key, given, f"an existing scenario file (relative to {base})")
    elif isinstance(source, dict) and not source:
        raise ScenarioError("sweep.grid", name.rpartition(",repeat=")[0], f"a {SCENARIO} for every point "
                                                                          f"(sweep.{SCENARIO} or a grid key "
                                                                          f"{SCENARIO}): the sweep file holds no "
                                                                          f"scenario of its own")
    for k, v in keys.items():
        if k.startswith("~") and v is not None:
            raise ScenarioError(f"grid key {k}", v, "null (~KEY unsets KEY, as the ~KEY override does: it takes no "
                                                    "value)")
    grid_overrides = [k if k.startswith("~") else f"{k}={value_text(v)}" for k, v in keys.items()]
    key = (str(source), *grid_overrides)
    seed = [] if repeat == 0 else [f"seed={first[key].seed + repeat}"]
    point_overrides = [*overrides, *grid_overrides, *seed]
    try:
        cfg = load_scenario(source, point_overrides)
    except ScenarioError as exc:
        raise _in_point(exc, keys, name) from None
    if repeat == 0:
        first[key] = cfg
    values = {axis: _resolved(cfg, axis) if ks == {axis: v} and axis != SCENARIO else v for axis, v, ks in combo}
    return Point(name, values, repeat, Path(), source, point_overrides, cfg)


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


def dir_name(name: str) -> str:
    """A point's directory name: its name with characters a file name should not hold replaced."""
    safe = _UNSAFE.sub("_", name.replace(" ", ""))
    if len(safe) > MAX_NAME or safe in (".", ".."):
        safe = f"{safe[:MAX_NAME - 17]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return safe


def _unique(names: list[str]) -> list[str]:
    """Point names, those that sanitize alike made distinct with a hash of the values."""
    safe = [dir_name(n) for n in names]
    return [n if safe.count(s) == 1 else f"{n}-{hashlib.sha256(n.encode()).hexdigest()[:8]}"
            for n, s in zip(names, safe)]


def cpus_per_point(parallel: int) -> int:
    """CPUs each of ``parallel`` concurrent points' embedded Ray declares: a fair share, at least 1."""
    return max(1, (os.cpu_count() or 1) // parallel)


def ray_of(cfg):
    """What a point's Ray session is started with (None: the local backend, no Ray)."""
    r = cfg.runtime
    return None if r.backend == "local" else (r.address, r.num_cpus, r.num_gpus)
