"""The scenario key reference, docs/keys.md, generated from the schema itself (``raysim list --markdown``).

Every key of every section, with its default, its documentation line, what its check allows and
when it applies (its ``when`` conditions, with those of the sections around it); each built-in
algorithm's keys; the names the ``kind`` keys take. The text is a function of the schema alone,
so tests/test_docs.py regenerates it and fails when the committed file differs. Torch-free.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any, Iterator

from raysim.algorithms.aggregator_catalog import AGGREGATOR_DOCS
from raysim.catalog import ALGORITHMS, MODELS, algorithm_doc
from raysim.scenario import Scenario
from raysim.scenario.schema import SELECTORS
from raysim.data import DATASETS
from raysim.data.partition import PARTITIONERS
from raysim.schema import Rule, When, path_schema
from raysim.communication.config import DOWNLINK, OPERATORS, PROTOCOLS
from raysim.privacy.config import ACCOUNTANTS, MECHANISMS
from raysim.system.config import DISTRIBUTIONS

COMMAND = "raysim list --markdown > docs/keys.md"
COLUMNS = ("key", "default", "meaning", "allowed", "applies only with")


@dataclasses.dataclass(frozen=True)
class KeyRow:
    """One key of the reference: its dotted path, default, doc line, allowed values and conditions."""

    path: str
    default: Any
    doc: str
    allowed: str
    applies: tuple[str, ...]

    def cells(self) -> list[str]:
        return [f"`{self.path}`", _code(_value(self.default)), self.doc, self.allowed,
                " and ".join(f"`{c}`" for c in self.applies)]


def key_rows(schema: type, section: str = "", applies: tuple[str, ...] = ()) -> Iterator[KeyRow]:
    """The keys of the dataclass ``schema`` at ``section`` (a dotted path; ``x[]`` for a list's
    entries), sub-sections and list entries after their own row, each with the conditions of the
    sections around it (``applies``) before its own."""
    for f in dataclasses.fields(schema):
        path = f"{section}.{f.name}" if section else f.name
        conditions = tuple(f.metadata.get("when", ()))
        if section.endswith("[]") and not all(_holds_in_list(c, section) for c in conditions):
            continue  # a key of another list's entries (a network tier's bandwidth among compute tiers)
        here = applies + tuple(_condition(c, section) for c in conditions if not _list_condition(c))
        inner = path_schema(schema, f.name)  # a sub-section, an optional one, or a list's entries
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        check = f.metadata.get("check")
        if inner is None or f.metadata.get("doc") or default is None or isinstance(default, list):  # a value, or
            # a section that documents itself, may be null (system.unreliable.local_steps) or is a list of entries
            yield KeyRow(path, default, f.metadata.get("doc", ""), "" if check is None else check.allowed, here)
        if inner is not None:
            entries = path + "[]" if _is_list(schema, f) else path
            yield from key_rows(inner, entries, here)


def _is_list(schema: type, f: dataclasses.Field) -> bool:
    return typing.get_origin(typing.get_type_hints(schema)[f.name]) is list


def _list_condition(condition) -> bool:
    """A condition on the list a key's entry belongs to (not on a key's value), such as a tier's kind."""
    return not isinstance(condition, (When, Rule))


def _holds_in_list(condition, section: str) -> bool:
    return not _list_condition(condition) or condition.holds(None, section.replace("[]", "[0]"))


def _condition(condition, section: str) -> str:
    """A condition in words: ``execution.mode = sync``, ``data.kind in {digits, blobs}``, or a rule's need."""
    if isinstance(condition, Rule):
        return condition.need
    path = condition.resolve(section)
    shown = ", ".join(_value(v) for v in condition.values)
    if len(condition.values) > 1:
        return f"{path} {'not in' if condition.negate else 'in'} {{{shown}}}"
    return f"{path} {'!=' if condition.negate else '='} {shown}"


def _value(value) -> str:
    """A value as a scenario file writes it: null, true, 0.001, [64], {}, fedavg (a section: nothing)."""
    if dataclasses.is_dataclass(value):
        return ""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _cell(text: str) -> str:
    """Table-cell text: pipes escaped, a tag-like ``<dir>`` kept as text."""
    return re.sub(r"<(?=[A-Za-z/])", r"\\<", text.replace("|", "\\|"))


def table(header: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def algorithm_table(keys_class: type) -> list[str]:
    """The keys of one algorithm (a built-in's or a custom class's ``Keys``) but its name."""
    return table(COLUMNS, [row.cells() for row in _own_keys(keys_class)])


def _own_keys(keys_class: type) -> list[KeyRow]:
    return [row for row in key_rows(keys_class, "algorithm") if row.path != "algorithm.name"]


def _algorithm_keys() -> list[str]:
    """Every built-in algorithm's key, once per distinct (default, doc, allowed, conditions), with the
    algorithms that take it so."""
    takers: dict[tuple[str, ...], list[str]] = {}
    for name, builtin in ALGORITHMS.items():
        keys_class = builtin.keys
        for row in _own_keys(keys_class):
            takers.setdefault(tuple(row.cells()), []).append(name)
    rows = [[*cells[:2], _which(names), *cells[2:]] for cells, names in takers.items()]
    return table(COLUMNS[:2] + ("algorithms",) + COLUMNS[2:], rows)


def _which(names: list[str]) -> str:
    """Algorithms named shortly: every one, all but a few, or the list."""
    others = [name for name in ALGORITHMS if name not in names]
    if not others:
        return "every one"
    return "all but " + ", ".join(others) if len(others) < len(names) else ", ".join(names)


SECTIONS = {  # top-level section -> what it holds
    "": "The top level: `name`, `seed`, and the sections below.",
    "data": "The federated data set: its kind, its clients and how it is split over them.",
    "model": "The model every client trains, and its split into a global part θ and a personal part w.",
    "execution": "How the server drives training: synchronous rounds or asynchronous updates.",
    "system": "The virtual-time system model: devices, networks, availability, dropout, unreliable agents, "
              "Byzantine clients.",
    "privacy": "Differential privacy of the clients' updates (clipping, noise, adaptive clipping) and the "
               "accounting of the ε a run spends.",
    "communication": "How clients encode what they upload (compression, error feedback); every encoding's "
                     "size is counted exactly and priced in upload time.",
    "runtime": "Where client work runs: Ray's actors or this process. No key here changes results.",
    "eval": "Evaluation of the global model, and of personalized models.",
    "output": "The run's directory and what is written there.",
}


def markdown() -> str:
    """docs/keys.md: the whole scenario key reference."""
    out = ["# Scenario keys", "",
           f"Generated from the schema by `{COMMAND}`; do not edit it by hand (tests/test_docs.py fails when it "
           "differs from the schema). What the keys mean together, with examples, is in "
           "[scenarios.md](scenarios.md); `raysim list` prints the same keys as YAML.", "",
           "A key applies only where its conditions hold (the last column, with those of the sections around it); "
           "a scenario that sets a key that does not apply is refused with one line naming it. \"Allowed\" is the "
           "key's own check where it declares one; every float must be finite and every integer fit in 64 bits.",
           "", "Sections: " + ", ".join(f"[{s or 'top level'}](#{s or 'top-level'})" for s in SECTIONS)
           + ", [algorithm](#algorithm), [names](#names).", ""]
    rows = list(key_rows(Scenario))
    for section, what in SECTIONS.items():
        out += [f"## {section or 'Top level'}", "", what, ""]
        mine = [r for r in rows if (r.path.split(".")[0] == section if section else "." not in r.path)
                and r.path != "algorithm"]
        out += table(COLUMNS, [r.cells() for r in mine]) + [""]
    out += ["## algorithm", "", "`algorithm.name` picks a built-in algorithm (or `package.module:Class`, whose "
            "`Keys` dataclass declares its keys: `raysim list package.module:Class --markdown`); the other "
            "`algorithm.*` keys are that algorithm's own.", ""]
    out += table(("`algorithm.name`", "what it is", "its keys"),
                 [[f"`{name}`", algorithm_doc(builtin.keys),
                   ", ".join(r.path.split(".", 1)[1] for r in _own_keys(builtin.keys))]
                  for name, builtin in ALGORITHMS.items()])
    out += ["", "Each key with its default for the algorithms that take it (a key whose default or meaning differs "
            "between algorithms has a row for each):", ""] + _algorithm_keys() + [""]
    out += ["## names", "", "The names the `kind` keys and their kin take (besides `package.module:name` for your "
            "own data set, model, algorithm or aggregator).", ""]
    models = {name: kind.doc for name, kind in MODELS.items()}
    named = [("data.kind", DATASETS), ("data.partition.kind", PARTITIONERS), ("model.kind", models),
             ("algorithm.aggregator", AGGREGATOR_DOCS), ("privacy.mechanism", MECHANISMS),
             ("privacy.accountant", ACCOUNTANTS), ("communication.uplink.kind", OPERATORS),
             ("communication.downlink.kind", DOWNLINK),
             ("execution.selection.kind", SELECTORS), ("communication.secure_aggregation.protocol", PROTOCOLS)]
    sections = dict.fromkeys(name.split(".")[0] for name in DISTRIBUTIONS)  # in the order they are declared
    named += [(_system_keys(s), {n.split(".", 1)[1]: d for n, d in DISTRIBUTIONS.items() if n.split(".")[0] == s})
              for s in sections]
    out += table(("key", "name", "what it is"), [[", ".join(f"`{p}`" for p in paths.split()), f"`{name}`", doc]
                                                  for paths, docs in named for name, doc in docs.items()])
    return "\n".join(out) + "\n"


def _system_keys(section: str) -> str:
    """The ``system`` keys (space-separated) whose values are the names of :data:`DISTRIBUTIONS`' ``section``."""
    return {"compute": "system.compute.kind", "network": "system.network.kind",
            "availability": "system.availability.kind",
            "distribution": "system.unreliable.participation.kind system.unreliable.local_steps.kind",
            "weights": "system.unreliable.weights", "attack": "system.byzantine.attack",
            "coin": "system.unreliable.coin", "gradient_noise": "system.unreliable.gradient_noise"}[section]
