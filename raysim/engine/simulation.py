"""One run of a scenario: data, model, runtime, driver, outputs (Parquet, summary, model)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from omegaconf import OmegaConf

from raysim.algorithms import make_algorithm
from raysim.config import to_yaml
from raysim.data import FederatedDataset, build_dataset
from raysim.engine.dispatch import clients_per_task, make_tasks, run_tasks
from raysim.engine.evaluation import GlobalEvaluator
from raysim.engine.sync import SyncDriver
from raysim.errors import ScenarioError
from raysim.metrics import ParquetLog
from raysim.models import FlatModel, build_model
from raysim.models.flat import sha256

ROUNDS_SCHEMA = pa.schema([
    ("round", pa.int64()), ("virtual_time", pa.float64()), ("wall_time", pa.float64()),
    ("train_loss", pa.float64()), ("test_loss", pa.float64()), ("test_accuracy", pa.float64()),
    ("personalized_accuracy", pa.float64()), ("clients", pa.int64()), ("samples", pa.int64()),
    ("updates_per_second", pa.float64()),
])
EVENTS_SCHEMA = pa.schema([
    ("round", pa.int64()), ("client_id", pa.int64()), ("actor", pa.int64()), ("samples", pa.int64()),
    ("train_loss", pa.float64()), ("compute_seconds", pa.float64()),
])


@dataclass
class Prepared:
    """What a run needs before any runtime starts."""

    dataset: FederatedDataset
    model: FlatModel


def prepare(cfg) -> Prepared:
    """Everything that can fail on bad input, before any runtime starts: data set and model."""
    dataset = build_dataset(cfg.data, cfg.seed)
    k = cfg.execution.clients_per_round
    if k > dataset.num_clients:
        raise ScenarioError("execution.clients_per_round", k,
                            f"an integer in [1, {dataset.num_clients}] (the data set's number of clients)")
    return Prepared(dataset, build_model(cfg.model, dataset.feature_shape, dataset.num_classes, cfg.seed))


def run_scenario(cfg, prepared: Prepared, runtime, progress=None, began: float | None = None) -> dict:
    """Run a validated scenario on ``runtime``; returns the summary (also saved as summary.json).

    The runtime takes over the data set (on Ray it moves to the object store and the
    driver keeps only that shared copy).
    ``progress(round, last_eval, client_updates)`` is called after every round when given;
    ``began`` (a ``time.perf_counter()`` value) is where ``wall_seconds`` starts counting.
    """
    began = time.perf_counter() if began is None else began
    out = Path(cfg.output.dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.yaml").write_text(to_yaml(cfg))
    prepared.dataset = runtime.load(OmegaConf.to_container(cfg, resolve=True), prepared.dataset)
    dataset, model = prepared.dataset, prepared.model
    algorithm = make_algorithm(cfg.algorithm)
    evaluate = GlobalEvaluator(model, dataset, cfg.runtime.torch_threads)
    offsets = dataset.offsets()
    train_sizes = offsets[:, 1] - offsets[:, 0]
    rounds_log = ParquetLog(str(out / "rounds.parquet"), ROUNDS_SCHEMA, cfg.output.flush_seconds)
    events_log = ParquetLog(str(out / "events.parquet"), EVENTS_SCHEMA, cfg.output.flush_seconds)
    state = algorithm.init(model.initial_vector())
    last = {"test_loss": math.nan, "test_accuracy": math.nan, "personalized_accuracy": math.nan}
    train_began = time.perf_counter()
    round_walls = []

    def personalized_accuracy(state) -> float:
        steps = cfg.eval.personalized_steps
        if steps == 0:
            return math.nan
        handle = runtime.broadcast(algorithm.payload(state))
        clients = np.arange(dataset.num_clients)
        tasks = make_tasks("personalize", clients, train_sizes, 0, clients_per_task(cfg))
        results = run_tasks(runtime, handle, tasks, train_sizes)
        rows = sum(int(p.test_rows.sum()) for p in results)
        return sum(int(p.test_correct.sum()) for p in results) / rows if rows else math.nan

    def on_round(r, state, updates, round_wall):
        round_walls.append(round_wall)
        events_log.append({
            "round": np.full(len(updates.client_ids), r), "client_id": updates.client_ids,
            "actor": updates.actor, "samples": updates.samples, "train_loss": updates.train_loss,
            "compute_seconds": updates.compute_seconds,
        })
        every = cfg.eval.every
        evaluate_now = r == cfg.execution.rounds or (every > 0 and r % every == 0)
        row = {"test_loss": math.nan, "test_accuracy": math.nan, "personalized_accuracy": math.nan}
        if evaluate_now and np.isfinite(updates.train_loss).all():
            params = algorithm.global_params(state)
            row["test_loss"], row["test_accuracy"] = evaluate(params)
            row["personalized_accuracy"] = personalized_accuracy(state)
            last.update(row)
        samples = int(updates.samples.sum())
        rounds_log.append({
            "round": [r], "virtual_time": [float(r)], "wall_time": [time.perf_counter() - train_began],
            "train_loss": [float(np.dot(updates.samples, updates.train_loss) / samples)],
            "test_loss": [_null(row["test_loss"])], "test_accuracy": [_null(row["test_accuracy"])],
            "personalized_accuracy": [_null(row["personalized_accuracy"])],
            "clients": [len(updates.client_ids)], "samples": [samples],
            "updates_per_second": [len(updates.client_ids) / round_wall],
        })
        if progress is not None:
            progress(r, last, events_log.num_rows)

    driver = SyncDriver(cfg, algorithm, runtime, train_sizes, dataset.num_clients)
    try:
        state = driver.run(state, on_round)
    finally:
        rounds_log.close()
        events_log.close()
    params = algorithm.global_params(state)
    if cfg.output.save_model:
        torch.save(model.state_dict(params), out / "model.pt")
    steady = round_walls[1:] or round_walls
    summary = {
        "name": cfg.name, "seed": cfg.seed, "backend": cfg.runtime.backend, "num_actors": runtime.num_actors,
        "rounds": len(round_walls), "client_updates": events_log.num_rows,
        "final_test_accuracy": _null(last["test_accuracy"]), "final_test_loss": _null(last["test_loss"]),
        "final_personalized_accuracy": _null(last["personalized_accuracy"]),
        "model_sha256": sha256(params), "virtual_time": float(len(round_walls)),
        "wall_seconds": time.perf_counter() - began, "train_wall_seconds": time.perf_counter() - train_began,
        "steady_updates_per_second": cfg.execution.clients_per_round * len(steady) / sum(steady),
        "actors": runtime.describe(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _null(x: float):
    """NaN → None, so Parquet and JSON show a missing value rather than a number."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
