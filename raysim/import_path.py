"""What Ray's workers import: raysim's packages by name, with the driver's directories first.

Ray puts the driver's working directory (and its script's directory, when that is on the
driver's path) ahead of the installed packages on every worker's import path, so that user
modules named in a scenario (``package.module:Class``) import there. A module named ``actors``
or ``raysim`` in such a directory would therefore stand in for raysim's own packages, and the
ClientActors would fail to start with an unrelated ImportError.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

from raysim.errors import ScenarioError

PACKAGES = ("raysim", "actors")  # imported by name in every Ray worker
PACKAGES_ROOT = Path(__file__).resolve().parent.parent  # the directory that holds this raysim's packages


def ray_worker_path() -> list:
    """The directories Ray puts first on its workers' import path, as it picks them: the
    driver's working directory, and its script's directory when that is on ``sys.path``."""
    dirs = [os.path.abspath(os.curdir)]
    script = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    if script and script in sys.path and script not in dirs:
        dirs.append(script)
    return dirs


def check_workers_import_raysim(runtime_cfg) -> None:
    """ScenarioError (``runtime.backend``) when a directory of :func:`ray_worker_path` holds a
    module or package named ``actors`` or ``raysim`` that is not raysim's own; a raysim
    checkout (a directory holding both packages) counts as raysim's own. A Ray client
    (``runtime.address`` ray://…) adds no directory of the driver's."""
    if (runtime_cfg.address or "").startswith("ray://"):
        return
    for directory in ray_worker_path():
        place = Path(directory).resolve()
        if place == PACKAGES_ROOT or all((place / name / "__init__.py").is_file() for name in PACKAGES):
            continue
        for name in PACKAGES:
            spec = importlib.machinery.PathFinder.find_spec(name, [directory])
            if spec is not None and spec.origin is not None:  # a namespace portion (origin None) yields
                raise ScenarioError(
                    "runtime.backend", "ray",
                    f"no module named {name} in {directory} (Ray's workers would import {spec.origin} in "
                    f"place of raysim's own {name} package): rename it, run raysim from another directory, "
                    "or use runtime.backend=local")
