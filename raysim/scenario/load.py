"""Loading a scenario: a YAML file, a mapping or a scenario loaded before, with ``key=value`` and
``~key`` overrides, merged onto the schema (:mod:`raysim.scenario.schema`) and validated
(:mod:`raysim.scenario.validate`), so that bad input fails before Ray starts with one line naming
the key, the value and what is allowed; and the scenario as it is saved (``scenario.yaml``) and as
the engine's hot paths read it (plain dataclasses).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from typing import Any, List

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, OmegaConfBaseException

from raysim.catalog import ALGORITHMS, algorithm_keys
from raysim.errors import ScenarioError, first_line
from raysim.scenario.schema import TOP_LEVEL_KEYS, Scenario
from raysim.scenario.validate import validate, why_ignored
from raysim.schema import field_of, require

PATH_PARTS = re.compile(r"([^.\[\]]+)|\[(\d+)\]")  # a dotted key's names and list indices: model.hidden[1]


def load_scenario(source, overrides: List[str] = ()) -> DictConfig:
    """Merge a scenario (a YAML file's path, a mapping of keys, a scenario loaded before, or
    None) and ``key=value`` overrides onto the schema and validate; a ``~key`` override removes a
    key the scenario sets (:func:`_unset`).

    The ``algorithm`` section's schema is the keys dataclass of the algorithm it names
    (:func:`raysim.catalog.algorithm_keys`). Keys that the scenario sets but that would be
    ignored (they apply to another algorithm, data kind or execution mode) are errors.
    Raises :class:`ScenarioError` for any problem, naming the key.
    """
    schema = OmegaConf.structured(Scenario)
    layers = []
    if isinstance(source, (dict, DictConfig)):
        layers.append(OmegaConf.create(OmegaConf.to_container(source) if isinstance(source, DictConfig) else source))
    elif source is not None:
        layers.append(_read_yaml(os.fspath(source)))
    layers.append(_parse_overrides(_unset(layers, overrides)))
    algorithm_layers = [_take_algorithm(layer) for layer in layers]
    loaded = 1 if isinstance(source, DictConfig) else 0  # a loaded scenario holds every key: none is "set"
    paths = [[*_leaf_paths(layer), *(f"algorithm.{p}" for p in _leaf_paths(section))]
             for layer, section in zip(layers[loaded:], algorithm_layers[loaded:])]
    explicit = [p for layer in paths for p in layer]
    cfg = schema
    for layer in layers:
        _check_layer(layer, schema)
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise _translate(exc) from None
    cfg.algorithm = _algorithm_section(algorithm_layers)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise _translate(exc) from None
    validate(cfg, explicit, unsettable=set(explicit) - set(paths[-1]))
    return cfg


def _unset(layers: list, overrides) -> list:
    """Apply the ``~key`` overrides: each removes a key that the scenario sets, so that the key's
    default applies and it no longer counts as set. Returns the other overrides."""
    rest = []
    for item in overrides:
        if not item.startswith("~"):
            rest.append(item)
            continue
        parent, _, name = item[1:].rpartition(".")
        nodes = [OmegaConf.select(layer, parent) if parent else layer for layer in layers] if name else []
        holders = [node for node in nodes if isinstance(node, DictConfig) and name in node]
        require(bool(holders) and "=" not in item, "override", item,
                "~KEY, for a key the scenario sets (its default then applies)")
        for node in holders:
            del node[name]
    return rest


def _take_algorithm(layer: DictConfig) -> DictConfig:
    """Remove and return a layer's ``algorithm`` section (merged onto its own schema later)."""
    if "algorithm" not in layer:
        return OmegaConf.create({})
    section = layer._get_node("algorithm")
    if not isinstance(section, DictConfig):
        raise ScenarioError("algorithm", _raw(layer, "algorithm"), "a mapping of algorithm keys (name: fedavg, ...)")
    del layer["algorithm"]
    return section


def _algorithm_section(layers: list) -> DictConfig:
    """The ``algorithm`` section: the named algorithm's keys with the layers' values merged on."""
    name = "fedavg"
    for layer in layers:
        if "name" in layer:
            name = _raw(layer, "name")
    if not isinstance(name, str):
        raise ScenarioError("algorithm.name", name, "a built-in name (raysim list) or package.module:Class")
    keys = algorithm_keys(name)
    try:
        section = OmegaConf.structured(keys)
    except OmegaConfBaseException as exc:  # a custom algorithm's Keys with a default of the wrong type
        raise ScenarioError("algorithm.name", name, f"an algorithm whose Keys have defaults of their types "
                                                    f"({first_line(exc)}: {exc.full_key})") from None
    for layer in layers:
        _check_layer(layer, section, "algorithm.", f"a key of algorithm.name={name}", from_file=layer is not layers[-1])
        try:
            section = OmegaConf.merge(section, layer)
        except OmegaConfBaseException as exc:
            raise _translate(exc, keys, "algorithm.") from None
    return section


def _leaf_paths(node: DictConfig, prefix: str = ""):
    """Dotted paths of the values a layer sets: sub-mappings are walked, and so are the mappings of a
    list of them (``system.compute.tiers[0].speed``); other lists are values."""
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            yield from _leaf_paths(child, f"{prefix}{k}.")
        elif isinstance(child, ListConfig) and (entries := _entries(child)):
            for i, entry in enumerate(entries):
                yield from _leaf_paths(entry, f"{prefix}{k}[{i}].")
        else:
            yield f"{prefix}{k}"


def _entries(node: ListConfig) -> list:
    """The mappings of a non-empty list of mappings (such as ``system.compute.tiers``), else []."""
    entries = [] if node._is_none() or node._is_interpolation() else [node._get_node(i) for i in range(len(node))]
    return entries if all(isinstance(e, DictConfig) for e in entries) else []


def _read_yaml(path: str) -> DictConfig:
    """A scenario file: a non-empty YAML mapping of scenario keys."""
    if not os.path.isfile(path):
        raise ScenarioError("scenario", path, "an existing YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        content = yaml.safe_load(text)  # OmegaConf would read an empty file, null or a word as a mapping
        if isinstance(content, dict) and content:
            return OmegaConf.create(text)
    except Exception as exc:  # yaml errors come in several types
        raise ScenarioError("scenario", path, f"valid YAML ({_yaml_problem(exc)})") from None
    shown = "null" if content is None else "a list" if isinstance(content, list) and content else repr(content)
    what = "the file is empty" if yaml.compose(text) is None else f"the file holds {shown}"  # None: no document
    raise ScenarioError("scenario", path, f"a YAML mapping of scenario keys ({', '.join(TOP_LEVEL_KEYS[:4])}, ...); "
                                          f"{what}")


def _yaml_problem(exc: Exception) -> str:
    """Where and what a YAML error is: "line L, column C: problem" (1-based) when the parser marked it."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem or type(exc).__name__}"
    return first_line(exc)


def _parse_overrides(overrides) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ScenarioError("override", item, "key=value, e.g. algorithm.lr=0.1")
    layer = OmegaConf.create()
    for item in overrides:  # one at a time, so that a value that is not YAML is named
        try:
            layer.merge_with_dotlist([item])
        except OmegaConfBaseException as exc:
            raise ScenarioError("override", " ".join(overrides), f"key=value pairs ({exc})") from None
        except yaml.YAMLError as exc:
            key, value = item.split("=", 1)
            problem = getattr(exc, "problem", None) or first_line(exc)
            raise ScenarioError(key, value, f"a YAML value ({problem})") from None
    return layer


def _check_layer(layer: DictConfig, schema: DictConfig, prefix: str = "", what: str = "a known key",
                 from_file: bool = False) -> None:
    """Reject keys the schema does not declare (listing the allowed ones; a key of other algorithms
    that the scenario file, ``from_file``, sets can be unset by override) and values of the wrong
    shape: a section needs a mapping, a list a list, and each entry of a list of sections (such
    as ``system.compute.tiers``) a mapping of that entry's keys, with values of their types."""
    for name in layer.keys():
        path = f"{prefix}{name}"
        if name not in schema:
            allowed = ", ".join(str(k) for k in schema.keys()) or "no name yet"
            if path in ("sweep", "tune"):
                suggestion, hint = "", f"; a {path}: section is run by raysim {path} FILE"
            else:
                suggestion, owned = _suggestion(path, str(name), schema)
                hint = f"; ~{path} unsets it" if owned and from_file else ""
            raise ScenarioError(path, _raw(layer, name), f"{what}{suggestion}; allowed here: {allowed}{hint}")
        declared, child = schema._get_node(name), layer._get_node(name)
        if child._is_interpolation() or (child._is_none() and declared._metadata.optional):
            continue
        section = declared._metadata.ref_type
        if dataclasses.is_dataclass(section):
            _check_entry(layer, name, section, path, what)
        elif isinstance(declared, ListConfig):
            entry = declared._metadata.element_type
            require(isinstance(child, ListConfig), path, _raw(layer, name), f"a list of {_type_name(entry)}")
            for i in range(len(child)):
                if dataclasses.is_dataclass(entry):
                    _check_entry(child, i, entry, f"{path}[{i}]", what)
                elif entry in (int, float, str, bool):  # omegaconf lets a list or a mapping stand in for one
                    require(not isinstance(child._get_node(i), (DictConfig, ListConfig)), f"{path}[{i}]",
                            _raw(child, i), f"a value of type {_type_name(entry)}")
        elif isinstance(declared, DictConfig):  # a free-form mapping, e.g. model.options
            require(isinstance(child, DictConfig), path, _raw(layer, name), "a mapping of keys to values")


def _suggestion(path: str, name: str, schema: DictConfig) -> tuple[str, bool]:
    """For an unknown key: in the algorithm section, the built-in algorithms that take it; else a
    close name among the section's keys. True with the first: the key is another algorithm's."""
    owners = ([n for n, builtin in ALGORITHMS.items() if field_of(builtin.keys, name)]
              if path.startswith("algorithm.") else [])
    if owners:
        return f" ({name} is a key of {', '.join(owners)})", True
    close = difflib.get_close_matches(name, [str(k) for k in schema.keys()], n=1)
    return (f" (did you mean {close[0]}?)" if close else ""), False


def _check_entry(parent, key, section: type, path: str, what: str) -> None:
    """``parent[key]`` holds a mapping of the keys of ``section`` (a dataclass) with values of their types."""
    child, schema = parent._get_node(key), OmegaConf.structured(section)
    require(isinstance(child, DictConfig), path, _raw(parent, key),
            "a mapping of keys (" + ", ".join(schema.keys()) + ")")
    _check_layer(child, schema, path + ".", what)
    try:
        OmegaConf.merge(schema, OmegaConf.create(OmegaConf.to_container(child)))
    except OmegaConfBaseException as exc:
        raise _translate(exc, section, path + ".") from None


def _raw(layer: DictConfig, key) -> Any:
    value = layer._get_node(key)._value()
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value


def _translate(exc: OmegaConfBaseException, schema: type = Scenario, prefix: str = "") -> ScenarioError:
    """Turn an omegaconf merge/resolve error into a one-line ScenarioError (``schema``: the
    dataclass whose merge failed; ``prefix``: its section's path)."""
    key = getattr(exc, "full_key", None) or "scenario"
    if isinstance(exc, (InterpolationResolutionError, GrammarParseError)):
        return ScenarioError(prefix + key, "${...}", f"an interpolation that resolves ({first_line(exc)})")
    return ScenarioError(prefix + key, getattr(exc, "value", None), f"a value of type {_declared_type(key, schema)}")


def _declared_type(key: str, schema: type = Scenario) -> str:
    """The schema's type for a dotted key, e.g. 'int', 'Optional[float]' or, for 'model.hidden[1]', 'int'."""
    node = OmegaConf.structured(schema)
    for name, index in PATH_PARTS.findall(key):
        if name:
            node = node._get_node(name)
            declared = node._metadata.ref_type
        else:
            declared = node._metadata.element_type
            node = OmegaConf.structured(declared) if dataclasses.is_dataclass(declared) else None
    return _type_name(declared)


def _type_name(declared) -> str:
    """A type as a scenario author writes it: 'int', 'List[Tier]', 'Optional[float]'."""
    if hasattr(declared, "__args__"):
        return re.sub(r"\b(?:\w+\.)+", "", str(declared))
    return getattr(declared, "__name__", str(declared))


def scenario_object(cfg: DictConfig) -> Scenario:
    """A loaded scenario (resolved) as plain dataclasses, what the engine and the client hosts
    receive: fast attribute access for their hot paths (``algorithm``: its keys dataclass)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    scenario = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Scenario), container))
    algorithm = container["algorithm"]
    scenario.algorithm = algorithm_keys(algorithm["name"])(**algorithm)
    return scenario


def to_yaml(cfg: DictConfig) -> str:
    """The resolved scenario as YAML text, without the keys this scenario ignores (another data
    kind's, mode's or algorithm's), so that ``raysim run`` of the saved file runs it again."""
    keys = algorithm_keys(cfg.algorithm.name)
    content = OmegaConf.to_container(cfg, resolve=True)
    for path in _leaf_paths(cfg):
        if why_ignored(cfg, keys, path) is not None:
            *parents, leaf = [name or int(index) for name, index in PATH_PARTS.findall(path)]
            node = content
            for part in parents:
                node = node[part]
            del node[leaf]
    return OmegaConf.to_yaml(OmegaConf.create(_without_empty(content)))


def _without_empty(node):
    """A mapping without the sub-mappings that are left empty."""
    if not isinstance(node, dict):
        return node
    kept = {k: _without_empty(v) for k, v in node.items()}
    return {k: v for k, v in kept.items() if v != {} or not isinstance(node[k], dict)}
