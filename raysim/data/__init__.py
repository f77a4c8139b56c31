"""Federated datasets (one Arrow table per dataset, or a generator's law whose rows are built per
client on demand) and the builders behind ``data.kind``.

Importing this package loads none of its modules (nor numpy, pyarrow or torch): the names below
load theirs on first use, so that the scenario's schema can read :mod:`raysim.data.kinds` alone.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"DATASETS": "kinds", "DATA_FILES": "kinds", "PARTITIONERS": "partition", "ClientRows": "federated",
            "FederatedDataset": "federated", "GeneratedDataset": "generated", "gaussian_mixture": "generated",
            "leaf_synthetic": "generated",
            "blobs": "generators", "digits": "generators", "load_cifar": "cifar", "load_leaf": "leaf",
            "load_mnist": "idx", "load_parquet": "parquet", "build_dataset": "build", "builds_on_demand": "build",
            "open_dataset": "build", "QuadraticProblem": "quadratic", "generate_quadratic": "quadratic"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"raysim.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'raysim.data' has no attribute {name!r}")
