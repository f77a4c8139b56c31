"""The scenario layer's names where the engine, the actors and the command line import them:
:mod:`raysim.scenario` holds the schema, the loader and the checks."""

from __future__ import annotations

from raysim.scenario.load import load_scenario, scenario_object, to_yaml
from raysim.scenario.schema import (TOP_LEVEL_KEYS, ModelConfig, RuntimeConfig, Scenario, StalenessConfig,
                                    actors_that_fit)
from raysim.scenario.validate import check_clients_per_round, check_curvature, check_eval_clients, validate

__all__ = ["TOP_LEVEL_KEYS", "ModelConfig", "RuntimeConfig", "Scenario", "StalenessConfig", "actors_that_fit",
           "check_clients_per_round", "check_curvature", "check_eval_clients", "load_scenario", "scenario_object",
           "to_yaml", "validate"]
