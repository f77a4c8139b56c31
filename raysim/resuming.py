"""Resuming a stopped run: its scenario and checkpoint, read back from its output directory.

A run stopped by Ctrl-C, SIGTERM, a crash of the driver or a failure (lost actors, a full disk)
goes on from its last checkpoint with ``raysim resume OUTPUT_DIR``. Only keys that cannot change
results may be overridden: where the run executes (``runtime.*``), where client rows are built
(``data.on_demand``, ``data.cache_mb``) and how often it writes (``output.flush_seconds``,
``output.checkpoint_every``, ``output.checkpoint_seconds``).
"""

from __future__ import annotations

import json

import pyarrow.fs as pafs
from omegaconf import OmegaConf

from raysim.errors import ScenarioError, first_line
from raysim.output import OutputDir
from raysim.output.parquet_log import check_log
from raysim.scenario.schema import RESUMABLE_KEYS, result_keys

def load_resume(run_dir: str, overrides: list) -> tuple:
    """The scenario of the run in ``run_dir`` (with ``overrides``) and its checkpoint; a
    ScenarioError names what is wrong (no such run, completed, no checkpoint or a damaged one, a
    key that would change results, a scenario.yaml edited since the checkpoint, logs that lack
    rows the checkpoint counted)."""
    from raysim.scenario import load_scenario, scenario_object
    from raysim.engine.checkpoint import CHECKPOINT, Checkpoint

    for item in overrides:
        name, _, value = item.removeprefix("~").partition("=")
        if not name.startswith(RESUMABLE_KEYS):
            raise ScenarioError(name, value, "a key that cannot change results when resuming "
                                "(runtime.*, data.on_demand, data.cache_mb, output.flush_seconds, "
                                "output.checkpoint_*); "
                                "start a new run to change others")
    out = OutputDir.open(run_dir, create=False)
    try:
        scenario = OmegaConf.create(out.read_bytes("scenario.yaml").decode())
    except (FileNotFoundError, NotADirectoryError):
        kind = out.fs.get_file_info(out.root).type
        why = {pafs.FileType.NotFound: "there is no such directory", pafs.FileType.File: "it is a file"}.get(
            kind, "it has no scenario.yaml")
        raise ScenarioError("run_dir", run_dir, f"the output directory of a run ({why})") from None
    except Exception as exc:  # not YAML, not text
        raise ScenarioError("run_dir", run_dir, f"a run whose scenario.yaml is readable ({first_line(exc)})") from None
    try:
        summary = json.loads(out.read_bytes("summary.json"))
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        summary = {}  # the driver was killed: it never wrote a summary
    except ValueError as exc:
        raise ScenarioError("run_dir", run_dir, f"a run whose summary.json is readable ({first_line(exc)}): "
                            "restore it, or delete it to resume from the checkpoint alone") from None
    if summary.get("status") == "completed":
        raise ScenarioError("run_dir", run_dir, "a run that has not completed (this one has: nothing to resume)")
    cfg = load_scenario(scenario, overrides)
    cfg.output.dir = run_dir  # the run goes on where it is, wherever it was started from
    try:
        checkpoint = Checkpoint.load(out)
    except FileNotFoundError:
        raise ScenarioError("run_dir", run_dir, f"a run with a {CHECKPOINT} to go on from (this one stopped "
                            "before its first checkpoint; see output.checkpoint_every and output.checkpoint_seconds)") from None
    except Exception as exc:  # a damaged or foreign file
        raise ScenarioError("run_dir", run_dir, f"a readable {CHECKPOINT}: {first_line(exc)}") from None
    now = result_keys(scenario_object(cfg))
    changed = [k for k in sorted(set(now) | set(checkpoint.scenario)) if now.get(k) != checkpoint.scenario.get(k)]
    if changed:
        shown = ", ".join(f"{k} {checkpoint.scenario.get(k, 'unset')} then, {now.get(k, 'unset')} now"
                          for k in changed[:3])
        raise ScenarioError("run_dir", run_dir, f"a run whose scenario.yaml is the one its {CHECKPOINT} was taken "
                            f"with ({shown}{', …' if len(changed) > 3 else ''}): restore it, or start a new run")
    for name, rows in checkpoint.log_rows.items():
        try:
            check_log(out.fs, out.path(name), rows)
        except ValueError as exc:
            raise ScenarioError("run_dir", run_dir, f"a run whose logs hold what its {CHECKPOINT} counted: "
                                f"{exc}") from None
    taken, held = summary.get("checkpoints") or {}, checkpoint.tally["checkpoints"]
    if taken.get("count") == held["count"] and "seconds" in taken:  # written after that checkpoint was:
        held["seconds"] = taken["seconds"]  # with its seconds, which the checkpoint cannot hold
    return cfg, checkpoint
