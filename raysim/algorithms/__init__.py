"""Federated algorithms, one module per family, built from shared parts: the local loop
(:mod:`.local`), gradient oracles (:mod:`.oracles`), client transforms (:mod:`.transforms`),
the server's aggregation rule (:mod:`.aggregation`, over the functions of :mod:`.aggregation_rules`
declared in :mod:`.aggregator_catalog`) and server optimizers (:mod:`.server_optimizers`).

Importing this package loads no torch (scenarios are checked before torch loads); the names
below load their modules on first use. Built-in algorithms are registered in
:data:`raysim.catalog.ALGORITHMS`; :func:`make_algorithm` builds one by name.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"Algorithm": "base", "AlgorithmEnv": "base", "ClientContext": "context", "ClientUpdates": "updates",
            "ClientTests": "updates", "RowData": "updates", "ServerState": "updates", "make_algorithm": "build"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"raysim.algorithms.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'raysim.algorithms' has no attribute {name!r}")
