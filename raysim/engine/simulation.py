"""One run of a scenario: prepare everything that can fail on bad input, then run it on a runtime
(:class:`raysim.engine.run.Run`)."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from raysim.algorithms.keys import check_aggregator
from raysim.catalog import algorithm_keys, check_model_data
from raysim.config import check_clients_per_round, check_curvature, check_eval_clients, to_yaml
from raysim.data import FederatedDataset, GeneratedDataset, build_dataset
from raysim.data.kinds import CLIENTS_FROM_FILES, DATA_FILES
from raysim.footprint import check_fits
from raysim.metrics import OutputDir
from raysim.system import SystemModel

LARGE_EVALUATION = 100_000  # clients: above this, evaluating every one of them built on demand gets a note
# quadratic clients × n × (d_theta + d_w)^2, what the start-up pass over them costs (~13 s of a core at
# 10^11): above this, it gets a note
LARGE_QUADRATIC = 10 ** 11

if TYPE_CHECKING:  # these import torch; prepare() loads them while ``meanwhile`` runs
    from raysim.data.quadratic import QuadraticProblem
    from raysim.engine.checkpoint import Checkpoint
    from raysim.engine.runtime import Runtime
    from raysim.models import FlatModel


@dataclass
class Prepared:
    """What a run needs before any runtime starts."""

    dataset: FederatedDataset | GeneratedDataset | QuadraticProblem
    model: FlatModel
    output: OutputDir
    final_params: object = None  # the final global parameters, once run_scenario has finished


def prepare(cfg, create_output: bool = True, meanwhile: Callable[[], None] | None = None,
            resuming: Checkpoint | None = None) -> Prepared:
    """Everything that can fail on bad input: the memory estimate (:func:`raysim.footprint.check_fits`,
    before anything big is allocated), data set (and the algorithm's checks against it), system
    model (trace files), output directory (created and claimed for this run — see
    :meth:`OutputDir.claim` — unless ``create_output`` is false), then the model.
    :func:`run_scenario` releases the directory. ``resuming``: the checkpoint a resumed run goes on
    from, checked once the directory is claimed to be still there unchanged.

    ``meanwhile`` (``runtime.start``: Ray's start-up) runs in this thread once everything but
    the model has been checked, while a helper thread imports torch and builds the model:
    both take seconds, and Ray's start-up is mostly its daemons starting in their own
    processes. A built-in model that cannot take the data's shape is refused before it
    (:func:`raysim.catalog.check_model_data`); any other rejected model, after it returns.
    """
    check_fits(cfg)
    d = cfg.data
    if d.kind == "quadratic" and d.num_clients * d.n * (d.d_theta + d.d_w) ** 2 > LARGE_QUADRATIC:
        print(f"note: drawing the statistics of all {d.num_clients:,} quadratic clients once, for θ*, the smoothness "
              "constants and the exact metrics (a pass over every client, kept only without data.on_demand)",
              file=sys.stderr)
    dataset = build_dataset(cfg.data, cfg.seed)
    check_model_data(cfg.model.kind, dataset.feature_shape, dataset.num_classes,
                     cfg.data.path if cfg.data.kind in DATA_FILES else None)
    if isinstance(dataset, (FederatedDataset, GeneratedDataset)):
        check_data = getattr(algorithm_keys(cfg.algorithm.name), "check_data", None)
        if check_data is not None:
            check_data(cfg, dataset.train_sizes())
    if cfg.data.kind in CLIENTS_FROM_FILES:  # the files decide the number of clients
        check_clients_per_round(cfg, dataset.num_clients)
        check_eval_clients(cfg.eval.clients, dataset.num_clients)
        if "aggregator" in cfg.algorithm:
            check_aggregator(cfg, dataset.num_clients)
    if isinstance(dataset, GeneratedDataset) and cfg.eval.clients is None and dataset.num_clients > LARGE_EVALUATION:
        print(f"note: evaluation builds the test rows of all {dataset.num_clients:,} clients (their data is built "
              "on demand); set eval.clients to evaluate a seeded sample of them", file=sys.stderr)
    SystemModel(cfg.system, dataset.num_clients, cfg.seed)  # loads and checks trace files
    output = OutputDir.open(cfg.output.dir, create=create_output)
    if create_output:
        output.claim()  # a second live run into this directory is refused here, before Ray starts
    try:
        if resuming is not None:
            resuming.check_still_in(output)
        if meanwhile is None:
            return Prepared(dataset, _build_model(cfg, dataset), output)
        with ThreadPoolExecutor(1, thread_name_prefix="raysim-model") as pool:
            model = pool.submit(_build_model, cfg, dataset)
            meanwhile()
            return Prepared(dataset, model.result(), output)
    except BaseException:
        output.release()
        raise


def _build_model(cfg, dataset) -> FlatModel:
    from raysim.models import build_model

    model = build_model(cfg.model, dataset.feature_shape, dataset.num_classes, cfg.seed)
    if cfg.eval.curvature:
        check_curvature(model.size)  # a custom model's size is known only now
    return model


def run_scenario(cfg, prepared: Prepared, runtime: Runtime, progress=None, began: float | None = None,
                 checkpoint: Checkpoint | None = None) -> dict:
    """Run a validated scenario on ``runtime``; returns the summary (also saved as summary.json).

    The runtime takes over the data set (on Ray it moves to the object store and the
    driver keeps only that shared copy) and hosts the scheduler (in-process, or the
    SchedulerActor). ``progress(report)`` gets each report of the scheduler;
    ``began`` (a ``time.perf_counter()`` value) is where ``wall_seconds`` starts counting.
    With a ``checkpoint`` (:meth:`Checkpoint.load` of the output directory) the run goes on from
    it; otherwise files of an earlier run in the output directory are removed first.
    Errors of the run (divergence, no client available, lost actors, disk errors) are raised
    after the rows produced so far and a summary with ``status: failed`` are written; Ctrl-C and
    SIGTERM after a checkpoint and a summary with ``status: interrupted``.
    """
    from raysim.engine.run import Run

    began = time.perf_counter() if began is None else began
    try:
        if checkpoint is None:
            prepared.output.clear_run_files()
            prepared.output.write_text("scenario.yaml", to_yaml(cfg))
        return Run(cfg, prepared, runtime, began, checkpoint).execute(progress)
    finally:
        prepared.output.release()
