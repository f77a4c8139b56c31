"""The Python API: run a scenario and get its results; load a saved model.

    result = raysim.run("scenarios/quickstart.yaml", ["execution.rounds=5"])
    result.summary["final_test_accuracy"], result.rounds.to_pandas(), result.model(x)
    model = raysim.load_model(result.output_dir)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from raysim.output import OutputDir


@dataclass
class RunResult:
    """What a run produced: the summary (as in summary.json), the rounds and events tables (as in
    the Parquet files), the final global model as a ``torch.nn.Module`` and where the files are."""

    summary: dict
    rounds: pa.Table
    events: pa.Table
    model: Any  # torch.nn.Module
    output_dir: str


def make_runtime(cfg, warm=None):
    """The runtime ``runtime.backend`` names (a run reaches Ray only through it); on Ray, ``warm``
    (:class:`actors.runtime.WarmActors`) lends it ClientActors that are already up."""
    if cfg.runtime.backend == "local":
        from raysim.engine.interrupts import deferred_signals

        with deferred_signals():  # torch loads here: Ctrl-C waits for it (an import cut short leaves torch broken)
            from raysim.engine.runtime import LocalRuntime
        return LocalRuntime()
    from raysim.import_path import check_workers_import_raysim

    check_workers_import_raysim(cfg.runtime)  # before actors is imported: the working directory may shadow it here too
    from actors.runtime import RayRuntime

    return RayRuntime(cfg.runtime, warm)


def execute(cfg, progress=None, began: float | None = None, checkpoint=None, freeze: bool = False,
            replace: bool = False, on_round=None, warm=None):
    """Prepare and run a loaded scenario on the runtime it names, then close the runtime; returns
    (summary, prepared). ``checkpoint`` resumes a run; ``replace`` replaces an earlier run in the
    output directory (else it is refused); ``on_round(row)`` gets each rounds.parquet row as it is
    logged and may end the run early (:func:`raysim.engine.run.run_scenario`); ``freeze`` loads libraries, data and model as long-lived
    objects (:func:`raysim.long_lived.long_lived`; for the command line); ``warm``: see :func:`make_runtime`."""
    from contextlib import nullcontext

    from raysim.lifecycle import watch_run
    from raysim.long_lived import long_lived
    from raysim.output.directory import CHECKPOINT, LOCK
    from raysim.preparation import prepare

    runtime = make_runtime(cfg, warm)
    try:
        with long_lived() if freeze else nullcontext():
            prepared = prepare(cfg, meanwhile=runtime.start, resuming=checkpoint,  # Ray starts while torch loads
                               replace=replace)
        out = prepared.output
        watch_run(str(cfg.output.dir), out.local_path(LOCK), out.local_path(CHECKPOINT))  # should this process die
        from raysim.engine.run import run_scenario  # torch: loaded by now, beside Ray's start-up

        summary = run_scenario(prepared, runtime, progress=progress, began=began, checkpoint=checkpoint,
                               on_round=on_round)
    finally:
        runtime.close()
    return summary, prepared


def run(scenario, overrides: Sequence[str] = (), progress=None, replace: bool = False) -> RunResult:
    """Run ``scenario`` (a YAML path, or a mapping of scenario keys) with ``key=value`` (and
    ``~key``: unset) ``overrides``, as ``raysim run`` does; bad input raises :class:`raysim.errors.ScenarioError`
    before any runtime starts (an earlier run in the output directory too, unless ``replace``), a
    failed run :class:`raysim.errors.RunError` (rows written so far stay in the output directory).
    ``progress(report)`` sees each report of the scheduler."""
    from raysim.scenario import load_scenario

    cfg = load_scenario(scenario, list(overrides))
    return _result(cfg, *execute(cfg, progress, replace=replace))


def resume(run_dir: str, overrides: Sequence[str] = (), progress=None) -> RunResult:
    """Continue the run in ``run_dir`` from its checkpoint, as ``raysim resume`` does; ``overrides``
    may only change keys that cannot change results (``runtime.*``, ``data.on_demand``,
    ``data.cache_mb``, ``output.flush_seconds``, ``output.checkpoint_*``). The result equals the
    uninterrupted run's (wall-clock columns aside)."""
    from raysim.resuming import load_resume

    cfg, checkpoint = load_resume(run_dir, list(overrides))
    return _result(cfg, *execute(cfg, progress, checkpoint=checkpoint))


def _result(cfg, summary: dict, prepared) -> RunResult:
    out = prepared.output
    return RunResult(summary, out.read_table("rounds.parquet"), out.read_table("events.parquet"),
                     prepared.model.module_at(prepared.final_params), str(cfg.output.dir))


def load_model(run_dir: str):
    """The final model a run saved (``model.pt`` of its output directory, a path or URI) as a
    ``torch.nn.Module`` in eval mode, rebuilt from the run's scenario.yaml and summary.json."""
    import torch
    from omegaconf import OmegaConf

    from raysim.scenario import ModelConfig
    from raysim.models import build_model

    out = OutputDir.open(run_dir, create=False)
    try:
        scenario = OmegaConf.create(out.read_bytes("scenario.yaml").decode())
        shape = json.loads(out.read_bytes("summary.json"))["model"]
        weights = torch.load(out.reader("model.pt"), weights_only=True)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{run_dir} is not a finished run with a saved model "
                                f"(output.save_model: true): {exc}") from None
    model_cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), scenario.model)  # the file leaves out defaults
    model = build_model(model_cfg, tuple(shape["feature_shape"]), shape["num_classes"], scenario.seed)
    model.module.load_state_dict(weights)
    return model.module.eval()
