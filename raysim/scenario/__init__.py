"""The scenario layer: its schema (:mod:`.schema`), loading a scenario with overrides (:mod:`.load`)
and its checks (:mod:`.validate`), each check run once.

Importing this package loads the schema alone (no data loader, no torch, no pyarrow); the loader
and the checks load on first use of their names below.
"""

from __future__ import annotations

import importlib

from raysim.scenario.schema import (TOP_LEVEL_KEYS, DataConfig, EvalConfig, ExecutionConfig, ModelConfig,
                                    OutputConfig, PartitionConfig, RuntimeConfig, Scenario, StalenessConfig)

_EXPORTS = {"load_scenario": "load", "scenario_object": "load", "to_yaml": "load", "validate": "validate",
            "check_data_set": "validate", "check_model": "validate"}

__all__ = sorted(["TOP_LEVEL_KEYS", "DataConfig", "EvalConfig", "ExecutionConfig", "ModelConfig", "OutputConfig",
                  "PartitionConfig", "RuntimeConfig", "Scenario", "StalenessConfig", *_EXPORTS])


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"raysim.scenario.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'raysim.scenario' has no attribute {name!r}")
