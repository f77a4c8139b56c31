"""Preparing a run: build, from a validated scenario, everything that can fail on bad input (the
data set, the system model's traces, the output directory, the model), each checked right after it
is built (:func:`raysim.scenario.validate.check_data_set`, :func:`~raysim.scenario.validate.check_model`),
and the scenario as the engine and the client hosts read it; :func:`raysim.engine.run.run_scenario`
then runs it on a runtime."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from raysim.communication.secure_aggregation import protocol_of
from raysim.data import FederatedDataset, GeneratedDataset, build_dataset
from raysim.data.kinds import CLIENTS_FROM_FILES
from raysim.footprint import check_fits
from raysim.output import OutputDir
from raysim.scenario import Scenario, scenario_object, to_yaml
from raysim.scenario.schema import result_keys
from raysim.scenario.validate import check_data_set, check_model
from raysim.startup import STARTUP
from raysim.system import SystemModel

LARGE_EVALUATION = 100_000  # clients: above this, evaluating every one of them built on demand gets a note
# quadratic clients × n × (d_theta + d_w)^2, what the start-up pass over them costs (~13 s of a core at
# 10^11): above this, it gets a note
LARGE_QUADRATIC = 10 ** 11

if TYPE_CHECKING:  # these import torch; prepare() loads them while ``meanwhile`` runs
    from raysim.data.quadratic import QuadraticProblem
    from raysim.engine.checkpoint import Checkpoint
    from raysim.models import FlatModel


@dataclass
class Prepared:
    """What a run needs before any runtime starts."""

    dataset: FederatedDataset | GeneratedDataset | QuadraticProblem
    model: FlatModel
    output: OutputDir
    scenario: Scenario  # the scenario as the engine and the client hosts read it (plain dataclasses)
    scenario_yaml: str  # the scenario as the run saves it (scenario.yaml)
    result_keys: dict  # the keys of scenario.yaml that decide results (a checkpoint holds them)
    final_params: object = None  # the final global parameters, once run_scenario has finished


def prepare(cfg, create_output: bool = True, meanwhile: Callable[[], None] | None = None,
            resuming: Checkpoint | None = None, replace: bool = False) -> Prepared:
    """Everything that can fail on bad input: the memory estimate (:func:`raysim.footprint.check_fits`,
    before anything big is allocated), data set (and the algorithm's checks against it), system
    model (trace files), output directory (created and claimed for this run — see
    :meth:`OutputDir.claim` — unless ``create_output`` is false), then the model.
    :func:`raysim.engine.run.run_scenario` releases the directory. ``resuming``: the checkpoint a resumed run goes on
    from, checked once the directory is claimed to be still there unchanged. A new run refuses a directory that
    holds an earlier run unless ``replace`` (:meth:`OutputDir.take_over`).

    ``meanwhile`` (``runtime.start``: Ray's start-up) runs in this thread once everything but
    the model has been checked, while a helper thread imports torch and builds the model:
    both take seconds, and Ray's start-up is mostly its daemons starting in their own
    processes. A built-in model that cannot take the data's shape is refused before it
    (:func:`raysim.scenario.validate.check_data_set`); any other rejected model, after it returns.
    """
    check_fits(cfg)
    d = cfg.data
    if d.kind == "quadratic" and d.num_clients * d.n * (d.d_theta + d.d_w) ** 2 > LARGE_QUADRATIC:
        print(f"note: drawing the statistics of all {d.num_clients:,} quadratic clients once, for θ*, the smoothness "
              "constants and the exact metrics (a pass over every client, kept only without data.on_demand)",
              file=sys.stderr)
    clients = "" if d.kind in CLIENTS_FROM_FILES else f", {d.num_clients:,} clients"
    STARTUP.info(f"building the data set ({d.kind}{clients}) …")
    dataset = build_dataset(cfg.data, cfg.seed)
    check_data_set(cfg, dataset)
    if isinstance(dataset, GeneratedDataset) and cfg.eval.clients is None and dataset.num_clients > LARGE_EVALUATION:
        print(f"note: each evaluation builds the rows of all {dataset.num_clients:,} clients again (their data is "
              "built on demand), a chunk at a time; set eval.clients to evaluate a seeded sample of them",
              file=sys.stderr)
    SystemModel(cfg.system, dataset.num_clients, cfg.seed)  # loads and checks trace files
    noise_multiplier = _plan_privacy(cfg, dataset.num_clients)
    _warn_wrap_around(cfg)
    output = OutputDir.open(cfg.output.dir, create=create_output)
    if create_output:
        output.claim()  # a second live run into this directory is refused here, before Ray starts
    try:
        if resuming is not None:
            resuming.check_still_in(output)
            output.clear_temporary()  # what a kill mid-write left
        elif create_output:
            output.take_over(replace)
        scenario, text = scenario_object(cfg), to_yaml(cfg)
        keys = result_keys(scenario)  # as scenario.yaml holds them, which a resume compares
        scenario.privacy.noise_multiplier = noise_multiplier  # calibrated to privacy.target_epsilon, if set
        STARTUP.info(f"building the model ({cfg.model.kind}) …")
        if meanwhile is None:
            return Prepared(dataset, _build_model(cfg, dataset), output, scenario, text, keys)
        with ThreadPoolExecutor(1, thread_name_prefix="raysim-model") as pool:
            model = pool.submit(_build_model, cfg, dataset)
            meanwhile()
            return Prepared(dataset, model.result(), output, scenario, text, keys)
    except BaseException:
        output.release()
        raise


def _plan_privacy(cfg, num_clients: int) -> float | None:
    """With differential privacy: warn when δ is not below 1/N, and return the noise multiplier z
    (``privacy.noise_multiplier``, or calibrated to ``privacy.target_epsilon``, with a note)."""
    if cfg.privacy.mechanism == "none":
        return None
    from raysim.privacy.accounting import check_count_noise, check_delta, planned_noise_multiplier

    warning = check_delta(cfg, num_clients)
    if warning is not None:
        print(warning, file=sys.stderr)
    if cfg.privacy.target_epsilon is not None:
        STARTUP.info(f"calibrating privacy.noise_multiplier to ε = {cfg.privacy.target_epsilon:g} …")
    z = planned_noise_multiplier(cfg, num_clients)
    check_count_noise(cfg, z)
    return z


def _warn_wrap_around(cfg) -> None:
    """Under secure aggregation: warn when the field is too small for a round's sum (it wraps around)."""
    secure = protocol_of(cfg)
    warning = secure.wrap_warning() if secure is not None else None
    if warning is not None:
        print(warning, file=sys.stderr)


def _build_model(cfg, dataset) -> FlatModel:
    from raysim.models import build_model

    model = build_model(cfg.model, dataset.feature_shape, dataset.num_classes, cfg.seed)
    check_model(cfg, model, dataset)
    return model
