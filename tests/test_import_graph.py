"""The import graph of raysim/ and actors/ has no cycles: every import of a raysim or actors module,
at module level or inside a function, read from the source with ``ast``; and the scenario's schema
imports light."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _modules() -> dict:
    """{dotted module name: its source file} of every module of raysim/ and actors/."""
    modules = {}
    for path in sorted([*(REPO / "raysim").rglob("*.py"), *(REPO / "actors").rglob("*.py")]):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(node, module: str, is_package: bool) -> list:
    """The dotted names an import statement in ``module`` names (relative imports resolved); for
    ``from a import b`` both ``a.b`` (b may be a module) and ``a``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph() -> dict:
    """{module: {module it imports: line}}. Importing ``a.b.c`` runs ``a`` and ``a.b`` too, so those
    packages are imported as well, except those that hold the importer (already running) and the
    top package ``raysim``, whose module body imports nothing (its lazy ``__getattr__`` imports
    :mod:`raysim.api` only when ``raysim.run`` and the like are looked up)."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(node, module, path.name == "__init__.py"):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                explicit = True
                while name:
                    if name != module and not module.startswith(name + ".") and (explicit or name != "raysim"):
                        edges.setdefault(name, node.lineno)
                    name, explicit = name.rpartition(".")[0], False
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_top_package_imports_nothing_when_imported():
    body = ast.parse((REPO / "raysim" / "__init__.py").read_text(encoding="utf-8")).body
    assert not [node for node in body if isinstance(node, (ast.Import, ast.ImportFrom))
                and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert "raysim.api" in graph["raysim"]  # inside raysim.__getattr__
    assert "raysim.importing" in graph["raysim.catalog"]
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    shown = ["; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in component for b in graph[a] if b in component)
             for component in found]
    assert not found, "import cycles:\n" + "\n".join(shown)


def test_importing_the_scenario_schema_loads_no_data_loader_torch_or_pyarrow():
    code = ("import sys, raysim.scenario; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pyarrow')"
            " or m.startswith(('raysim.data.', 'raysim.models', 'raysim.engine')) and m != 'raysim.data.kinds'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    assert out.strip() == "[]"
    assert "Scenario" in dir(__import__("raysim.scenario").scenario)


LAYERS = (  # bottom up; a module sits in the layer of the longest name that holds it (NAME$: that module alone)
    ("raysim.errors", "raysim.importing", "raysim.robust_f", "raysim.streams", "raysim.threads", "raysim.import_path",
     "raysim.startup",
     "raysim.schema", "raysim.measure", "raysim.data.kinds", "raysim.algorithms.aggregator_catalog",
     "raysim.system.config", "raysim.privacy.config", "raysim.communication.config",
     "raysim.communication.secure_aggregation",
     "raysim.algorithms$", "raysim.data$", "raysim.system$", "raysim.privacy$", "raysim.communication$"),  # the ground floor, and the packages that load lazily
    ("raysim.data", "raysim.system", "raysim.output", "raysim.privacy"),  # data sets, system model, logs, accounting
    ("raysim.catalog", "raysim.algorithms.keys", "raysim.scenario$", "raysim.scenario.schema"),  # names, the schema
    ("raysim.scenario", "raysim.footprint"),  # loading and checking a scenario
    ("raysim.models", "raysim.algorithms", "raysim.pipeline"),  # torch
    ("raysim.engine",),
    ("actors", "raysim.api", "raysim.lifecycle", "raysim.long_lived", "raysim.cli", "raysim.sweep", "raysim.bench",
     "raysim.reference", "raysim.preparation", "raysim.resuming", "raysim.report", "raysim$"),
)


def layer(module: str) -> int:
    """The index in LAYERS of ``module``'s layer."""
    fits = [(len(name), i) for i, names in enumerate(LAYERS) for name in names
            if module == name.rstrip("$") or (not name.endswith("$") and module.startswith(name + "."))]
    assert fits, f"{module} sits in no layer of LAYERS"
    return max(fits)[1]


def test_at_most_three_imports_run_up_the_layers():
    graph = import_graph()
    upward = sorted(f"{a} -> {b} (line {line})" for a, edges in graph.items() for b, line in edges.items()
                    if layer(b) > layer(a))
    assert len(upward) <= 3, upward
    assert [edge.split(" (line")[0] for edge in upward] == [
        "raysim.catalog -> raysim.algorithms.base"]  # a custom algorithm's class, checked


def test_the_engine_imports_neither_the_scenario_loader_nor_its_checks():
    graph = import_graph()
    reached = sorted(f"{a} -> {b}" for a, edges in graph.items() if a.startswith(("raysim.engine", "actors"))
                     for b in edges if b in ("raysim.scenario.load", "raysim.scenario.validate"))
    assert not reached, reached
