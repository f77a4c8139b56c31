"""One run of a scenario: prepare, start the scheduler on a runtime, stream its rows to Parquet,
write the summary and the model."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa
from omegaconf import OmegaConf

from raysim.config import to_yaml
from raysim.data import FederatedDataset, build_dataset
from raysim.errors import ScenarioError
from raysim.metrics import OutputDir, ParquetLog
from raysim.system import SystemModel

if TYPE_CHECKING:  # these import torch; prepare() loads them while ``meanwhile`` runs
    from raysim.data.quadratic import QuadraticProblem
    from raysim.engine.runtime import Runtime
    from raysim.models import FlatModel

ROUNDS_SCHEMA = pa.schema([
    ("round", pa.int64()), ("virtual_time", pa.float64()), ("wall_time", pa.float64()),
    ("train_loss", pa.float64()), ("test_loss", pa.float64()), ("test_accuracy", pa.float64()),
    ("personalized_accuracy", pa.float64()), ("clients", pa.int64()), ("samples", pa.int64()),
    ("updates_per_second", pa.float64()), ("late", pa.int64()), ("dropped", pa.int64()),
    ("failed", pa.int64()), ("stale", pa.int64()),
    ("rel_error", pa.float64()), ("grad_norm_sq", pa.float64()), ("loss_gap", pa.float64()),
])
EVENTS_SCHEMA = pa.schema([
    ("round", pa.int64()), ("client_id", pa.int64()), ("actor", pa.int64()), ("samples", pa.int64()),
    ("train_loss", pa.float64()), ("compute_seconds", pa.float64()), ("virtual_start", pa.float64()),
    ("virtual_end", pa.float64()), ("model_version", pa.int64()), ("staleness", pa.int64()),
    ("status", pa.string()), ("node", pa.string()),
])
ADVANCE_SECONDS = 0.5  # wall time the scheduler runs between two reports to the driver


@dataclass
class Prepared:
    """What a run needs before any runtime starts."""

    dataset: FederatedDataset | QuadraticProblem
    model: FlatModel
    output: OutputDir
    final_params: object = None  # the final global parameters, once run_scenario has finished


def prepare(cfg, create_output: bool = True, meanwhile: Callable[[], None] | None = None) -> Prepared:
    """Everything that can fail on bad input: data set, system model (trace files), output
    directory (created unless ``create_output`` is false), then the model.

    ``meanwhile`` (``runtime.start``: Ray's start-up) runs in this thread once everything but
    the model has been checked, while a helper thread imports torch and builds the model:
    both take seconds, and Ray's start-up is mostly its daemons starting in their own
    processes. If the model is rejected, the error is raised after ``meanwhile`` returns.
    """
    dataset = build_dataset(cfg.data, cfg.seed)
    k = cfg.execution.clients_per_round
    if cfg.execution.mode == "sync" and k > dataset.num_clients:
        raise ScenarioError("execution.clients_per_round", k,
                            f"an integer in [1, {dataset.num_clients}] (the data set's number of clients)")
    SystemModel(cfg.system, dataset.num_clients, cfg.seed)  # loads and checks trace files
    output = OutputDir.open(cfg.output.dir, create=create_output)
    if meanwhile is None:
        return Prepared(dataset, _build_model(cfg, dataset), output)
    with ThreadPoolExecutor(1, thread_name_prefix="raysim-model") as pool:
        model = pool.submit(_build_model, cfg, dataset)
        meanwhile()
        return Prepared(dataset, model.result(), output)


def _build_model(cfg, dataset) -> FlatModel:
    from raysim.models import build_model

    return build_model(cfg.model, dataset.feature_shape, dataset.num_classes, cfg.seed)


def run_scenario(cfg, prepared: Prepared, runtime: Runtime, progress=None, began: float | None = None) -> dict:
    """Run a validated scenario on ``runtime``; returns the summary (also saved as summary.json).

    The runtime takes over the data set (on Ray it moves to the object store and the
    driver keeps only that shared copy) and hosts the scheduler (in-process, or the
    SchedulerActor). ``progress(report)`` gets each report of the scheduler;
    ``began`` (a ``time.perf_counter()`` value) is where ``wall_seconds`` starts counting.
    Errors of the run (divergence, no client available) are raised after the rows
    produced so far are written.
    """
    from raysim.models.split import describe_split

    began = time.perf_counter() if began is None else began
    out = prepared.output
    out.write_text("scenario.yaml", to_yaml(cfg))
    scenario = OmegaConf.to_container(cfg, resolve=True)
    prepared.dataset = runtime.load(scenario, prepared.dataset)
    scheduler = runtime.scheduler(scenario, prepared.dataset)
    rounds_log = ParquetLog(out, "rounds.parquet", ROUNDS_SCHEMA, cfg.output.flush_seconds)
    events_log = ParquetLog(out, "events.parquet", EVENTS_SCHEMA, cfg.output.flush_seconds)
    statuses: dict = {}
    rows: list = []
    try:
        while True:
            report = scheduler.advance(ADVANCE_SECONDS)
            events = report["events"]
            if events is not None:
                events_log.append(events)
                for status, count in zip(*np.unique(events["status"], return_counts=True)):
                    statuses[str(status)] = statuses.get(str(status), 0) + int(count)
            if report["rounds"]:
                rounds_log.append({k: [r[k] for r in report["rounds"]] for k in report["rounds"][0]})
                rows += report["rounds"]
            if progress is not None:
                progress(report)
            if report.get("error"):
                raise report["error"]
            if report["done"]:
                break
        final = scheduler.finish()
    finally:
        rounds_log.close()
        events_log.close()
    prepared.final_params = final["params"]
    if cfg.output.save_model:
        out.save_torch("model.pt", prepared.model.state_dict(final["params"]))
    last = report["last_eval"]
    summary = {
        "name": cfg.name, "seed": cfg.seed, "backend": cfg.runtime.backend, "mode": cfg.execution.mode,
        "num_actors": runtime.num_actors, "rounds": len(rows), "server_steps": final["server_steps"],
        "client_updates": final["client_updates"], "tasks": statuses,
        "final_test_accuracy": _null(last["test_accuracy"]), "final_test_loss": _null(last["test_loss"]),
        "final_personalized_accuracy": _null(last["personalized_accuracy"]),
        "model_sha256": final["model_sha256"], "virtual_time": final["virtual_time"],
        "wall_seconds": time.perf_counter() - began,
        "steady_updates_per_second": _steady_rate(rows),
        "system": final["system"], "actors": runtime.describe(),
        "split": describe_split(prepared.model.module, prepared.model.personal),
        "model": {"kind": cfg.model.kind, "parameters": prepared.model.size,
                  "feature_shape": list(prepared.dataset.feature_shape), "num_classes": prepared.dataset.num_classes},
    }
    out.write_text("summary.json", json.dumps(summary, indent=2, default=float) + "\n")
    return summary


def _steady_rate(rows: list) -> float | None:
    """Applied updates per wall second after the first server step (warm-up excluded)."""
    if len(rows) < 2:
        return None
    updates = sum(r["clients"] for r in rows[1:])
    seconds = rows[-1]["wall_time"] - rows[0]["wall_time"]
    return updates / seconds if seconds > 0 else None


def _null(x):
    """NaN → None, so JSON shows a missing value rather than a number."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
