"""Declaring scenario keys once: a documented dataclass field, the values it accepts and when
it applies.

A key is a dataclass field made by :func:`key`; its metadata holds a one-line ``doc``, an
optional ``check`` (a :class:`Check`: a value test and the words for what is allowed) and
an optional ``when`` (a :class:`When`: the key applies only if another key holds one of some
values; a :class:`Rule` for other conditions). The scenario loader uses them to reject bad values
and keys that a scenario sets but that would be ignored (``data.partition.*`` with
``gaussian_mixture``, ``execution.deadline`` in ``async`` mode, ``algorithm.server_betas`` with
``server_optimizer: sgd``, ``down_mbps`` in an entry of ``system.compute.tiers``); ``raysim list``
prints the docs. Whatever a key's own check, :func:`check_numbers` holds every ``float`` key to a
finite value and every ``int`` key to 64 bits. Torch-free.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.nodes import FloatNode, IntegerNode

from raysim.errors import ScenarioError

INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1  # what numpy and torch hold; larger Python ints overflow there


@dataclass(frozen=True)
class Check:
    """A test of a key's value and the words for what is allowed."""

    test: Callable[[Any], bool]
    allowed: str

    def __call__(self, path: str, value) -> None:
        if value is not None and not self.test(value):
            raise ScenarioError(path, value, self.allowed)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


positive = Check(lambda v: _finite(v) and v > 0, "a number > 0")
non_negative = Check(lambda v: _finite(v) and v >= 0, "a number >= 0")
positive_int = Check(lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer")
non_negative_int = Check(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0")
unit_interval = Check(lambda v: _finite(v) and 0 <= v < 1, "a number in [0, 1)")
closed_unit_interval = Check(lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]")
open_unit_interval = Check(lambda v: _finite(v) and 0 < v < 1, "a probability in (0, 1)")
decay_factor = Check(lambda v: _finite(v) and 0 < v <= 1, "a number in (0, 1]")


def within(low: float, high: float) -> Check:
    """A finite number in [``low``, ``high``]."""
    return Check(lambda v: _finite(v) and low <= v <= high, f"a number in [{low:g}, {high:g}]")


def one_of(*names: str) -> Check:
    """The value is one of ``names``."""
    return Check(lambda v: v in names, _one_of_text(names))


def require(ok: bool, path: str, value, allowed: str) -> None:
    """A check written out in a validator: ScenarioError(path, value, allowed) unless ``ok``."""
    if not ok:
        raise ScenarioError(path, value, allowed)


def require_one_of(path: str, value, names) -> None:
    """ScenarioError unless ``value`` is one of ``names`` (None included: it is no name)."""
    require(value in names, path, value, _one_of_text(names))


def _one_of_text(names) -> str:
    return "one of " + ", ".join(sorted(names))


@dataclass(frozen=True)
class When:
    """A key applies only when the key at ``path`` holds one of ``values`` (or, with
    ``negate``, none of them). A ``path`` without a dot names a key of the same section."""

    path: str
    values: tuple
    negate: bool = False

    def resolve(self, section: str) -> str:
        return self.path if "." in self.path else f"{section}.{self.path}" if section else self.path

    def holds(self, cfg, section: str) -> bool:
        value = OmegaConf.select(cfg, self.resolve(section))
        value = list(value) if OmegaConf.is_list(value) else value
        return (value in self.values) != self.negate

    def describe(self, cfg, section: str) -> str:
        path = self.resolve(section)
        shown = ", ".join("null" if v is None else str(v) for v in self.values)
        if len(self.values) > 1:
            which = f"{path} {'not in' if self.negate else 'in'} {{{shown}}}"
        else:
            which = f"{path} {'!=' if self.negate else '='} {shown}"
        now = OmegaConf.select(cfg, path)
        now = OmegaConf.to_container(now) if OmegaConf.is_config(now) else now
        return f"it applies only with {which} (here {path} = {now!r})"


def when(path: str, *values, negate: bool = False) -> When:
    """Shorthand for :class:`When`."""
    return When(path, tuple(values), negate)


@dataclass(frozen=True)
class Rule:
    """A key applies only when ``test(cfg)`` holds for the whole scenario: a condition that is not one
    key's value (``need`` says what must hold, ``now(cfg)`` what the scenario has instead)."""

    test: Callable[[Any], bool]
    need: str
    now: Callable[[Any], str]

    def holds(self, cfg, section: str) -> bool:
        return self.test(cfg)

    def describe(self, cfg, section: str) -> str:
        return f"it applies only with {self.need} (here {self.now(cfg)})"


def key(default=dataclasses.MISSING, doc: str = "", *, check: Check | None = None,
        when: When | tuple[When, ...] | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """A documented scenario key (a dataclass field; ``factory`` for mutable defaults). With
    several ``when`` conditions the key applies only when all of them hold; a condition is a
    :class:`When` or any object with its ``holds`` and ``describe``."""
    conditions = () if when is None else tuple(when) if isinstance(when, tuple) else (when,)
    metadata = {"doc": doc, "check": check, "when": conditions}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def fields_of(schema: type) -> Iterator[dataclasses.Field]:
    """The fields of a schema dataclass, in declaration order (inherited ones first)."""
    return iter(dataclasses.fields(schema))


def field_of(schema: type, name: str) -> dataclasses.Field | None:
    """The field ``name`` of a schema dataclass, or None."""
    return next((f for f in dataclasses.fields(schema) if f.name == name), None)


def nested_schema(f: dataclasses.Field) -> type | None:
    """The dataclass a field holds by default (a sub-section such as ``data.partition``), or None."""
    kind = f.type if isinstance(f.type, type) else None
    if kind is None and f.default_factory is not dataclasses.MISSING:
        made = f.default_factory()
        kind = type(made) if dataclasses.is_dataclass(made) else None
    return kind if kind is not None and dataclasses.is_dataclass(kind) else None


@functools.lru_cache(maxsize=None)
def _hints(schema: type) -> dict:
    return typing.get_type_hints(schema)


def path_schema(schema: type, name: str) -> type | None:
    """The dataclass whose keys a dotted path continues with after the field ``name`` of ``schema``: a
    sub-section, an optional one (``system.unreliable.local_steps``) or a list's entries
    (``system.compute.tiers[0]``); None for a value."""
    hint = _hints(schema)[name]
    inside = [hint]
    while inside:
        hint = inside.pop()
        if dataclasses.is_dataclass(hint):
            return hint
        inside += typing.get_args(hint)
    return None


def check_values(cfg, schema: type, section: str) -> None:
    """Apply every key's ``check`` of ``schema`` to the values of ``cfg``'s ``section``."""
    node = OmegaConf.select(cfg, section) if section else cfg
    for f in fields_of(schema):
        check = f.metadata.get("check")
        if check is not None:
            check(f"{section}.{f.name}" if section else f.name, node[f.name])


def check_numbers(node, path: str = "", check: Check | None = None) -> None:
    """Every value of a key declared ``float`` is finite and every value of one declared ``int``
    fits in 64 bits (in ``node``, a loaded scenario or a section at ``path``, lists included);
    ScenarioError names the first that does not, and what the key allows (``check``: its own)."""
    if isinstance(node, DictConfig) and not node._is_none():
        schema = node._metadata.object_type
        for name in node.keys():
            f = field_of(schema, name) if dataclasses.is_dataclass(schema) else None
            check_numbers(node._get_node(name), f"{path}.{name}" if path else str(name),
                          None if f is None else f.metadata.get("check"))
    elif isinstance(node, ListConfig) and not node._is_none():
        for i in range(len(node)):
            check_numbers(node._get_node(i), f"{path}[{i}]")
    elif isinstance(node, (FloatNode, IntegerNode)) and node._value() is not None:
        value = node._value()
        if isinstance(node, FloatNode) and not math.isfinite(value):
            raise ScenarioError(path, value, "a finite number")
        if isinstance(node, IntegerNode) and not INT64_MIN <= value <= INT64_MAX:
            raise ScenarioError(path, value, _int64_allowed(check))


def _int64_allowed(check: Check | None) -> str:
    """What an ``int`` key with ``check`` allows, at most 64 bits: the check's words, bounded above
    where the check itself is not."""
    if check is None:
        return f"an integer in [{INT64_MIN}, {INT64_MAX}]"
    return check.allowed + (f" (at most {INT64_MAX})" if check.test(INT64_MAX) else "")


def inapplicable(cfg, schema: type, section: str, path: str) -> str | None:
    """Why the explicitly set key ``path`` (a dotted path inside ``section``, whose schema
    is ``schema``; ``name[i]`` for an entry of a list of sections) would be ignored by this
    scenario, or None if it applies."""
    here, prefix = schema, section
    for part in path.split("."):
        name = part.split("[")[0]  # an entry of a list of sections: tiers[0]
        f = field_of(here, name) if here is not None else None
        if f is None:
            return None
        for condition in f.metadata.get("when", ()):
            if not condition.holds(cfg, prefix):
                return condition.describe(cfg, prefix)
        here, prefix = path_schema(here, name), f"{prefix}.{part}" if prefix else part
    return None


def describe(schema: type) -> list[tuple[str, Any, str]]:
    """(key, default, doc) for every key of ``schema`` (sub-sections flattened with dots)."""
    rows = []
    for f in fields_of(schema):
        sub = nested_schema(f)
        if sub is not None:
            rows += [(f"{f.name}.{k}", v, d) for k, v, d in describe(sub)]
            continue
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = f.default
        rows.append((f.name, default, f.metadata.get("doc", "")))
    return rows


def dotted_items(node: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The (dotted key, value) leaves of a nested plain dict, such as a saved scenario (lists and
    empty mappings are values)."""
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from dotted_items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
