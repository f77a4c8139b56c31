"""The driver side of one run: the scheduler on a runtime, its rows streamed to the Parquet logs,
checkpoints, recovery from a lost scheduler, and a summary however the run ends.

A run is always between two server steps when anything leaves the driver: Ctrl-C and SIGTERM are
held back while the scheduler advances and the rows it returned are written
(:func:`raysim.engine.interrupts.deferred_signals`), so the checkpoint taken on an interruption holds a
state the run can go on from. Both logs are flushed together and a checkpoint records how many
rows each held, so after any stop the files cover the same server steps (a resume drops rows
written after the checkpoint and produces them again, identically).
"""

from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa

from raysim.catalog import algorithm_class
from raysim.engine.checkpoint import CHECKPOINT, Checkpoint
from raysim.errors import OutputError, RunError, RunStopped, ScenarioError, SchedulerLost
from raysim.engine.interrupts import cut_short, deferred_signals
from raysim.engine.run_evaluation import evaluates_on_hosts, new_clients
from raysim.output import ParquetLog
from raysim.output.directory import DIAGNOSTICS, EVENTS_SCHEMA, PRIVACY_LEDGER, ROUNDS_SCHEMA, SERVER_DIAGNOSTIC

ADVANCE_SECONDS = 0.5  # wall time the scheduler runs between two reports to the driver
SCHEDULER_RESTARTS = 3  # a lost SchedulerActor is restarted from the last checkpoint this many times at most


@dataclass
class Tally:
    """Running totals for the summary: task statuses, rounds logged, the updates applied and
    wall time after the first round (the steady rate, warm-up and evaluation excluded), and the
    checkpoints taken. A checkpoint holds them, so a resumed run counts on from there."""

    statuses: dict = field(default_factory=dict)
    rounds: int = 0
    first_wall: float = math.nan
    last_wall: float = math.nan
    steady_updates: int = 0
    steady_eval_seconds: float = 0.0  # evaluation and diagnostics between the first and the last row
    diagnostics: dict = field(default_factory=dict)  # the last non-null value of each diagnostics column
    checkpoints: dict = field(default_factory=lambda: {"count": 0, "seconds": 0.0, "bytes": 0})  # bytes: the last

    @classmethod
    def at(cls, checkpoint: Checkpoint | None) -> Tally:
        """The totals ``checkpoint`` holds (a copy), with its own size, which it cannot hold; new
        totals without one."""
        if checkpoint is None:
            return cls()
        tally = cls(**copy.deepcopy(checkpoint.tally))
        tally.checkpoints["bytes"] = checkpoint.nbytes
        return tally

    def add(self, report: dict, diagnostics: tuple = tuple(DIAGNOSTICS)) -> None:
        """Count a scheduler report's events and rounds, and keep the last value of each of the
        ``diagnostics`` columns."""
        events = report["events"]
        if events is not None:
            for status, count in zip(*np.unique(events["status"], return_counts=True)):
                self.statuses[str(status)] = self.statuses.get(str(status), 0) + int(count)
        for row in report["rounds"]:
            if self.rounds == 0:
                self.first_wall = row["wall_time"]
            else:
                self.steady_updates += row["clients"]
                self.steady_eval_seconds += row["eval_seconds"]
            self.last_wall = row["wall_time"]
            self.rounds += 1
            self.diagnostics.update({k: row[k] for k in diagnostics if row.get(k) is not None})

    def steady_rate(self) -> float | None:
        """Applied updates per wall second after the first server step, evaluation excluded."""
        seconds = self.last_wall - self.first_wall - self.steady_eval_seconds
        return self.steady_updates / seconds if self.rounds >= 2 and seconds > 0 else None


def run_scenario(prepared, runtime, progress=None, began: float | None = None,
                 checkpoint: Checkpoint | None = None, on_round=None) -> dict:
    """Run a prepared scenario (:func:`raysim.preparation.prepare`) on ``runtime``; returns the
    summary (also saved as summary.json).

    The runtime takes over the data set (on Ray it moves to the object store and the
    driver keeps only that shared copy) and hosts the scheduler (in-process, or the
    SchedulerActor). ``progress(report)`` gets each report of the scheduler;
    ``began`` (a ``time.perf_counter()`` value) is where ``wall_seconds`` starts counting.
    With a ``checkpoint`` (:meth:`Checkpoint.load` of the output directory) the run goes on from
    it.
    ``on_round(row)`` gets each rounds.parquet row once it is logged; with it the scheduler advances
    one server step at a time (results are the same), and :class:`raysim.errors.RunStopped` raised
    by it ends the run there: a checkpoint and a summary with ``status: stopped`` are written and
    that summary is returned.
    Errors of the run (divergence, no client available, lost actors, disk errors) are raised
    after the rows produced so far and a summary with ``status: failed`` are written; Ctrl-C and
    SIGTERM after a checkpoint and a summary with ``status: interrupted``.
    """
    began = time.perf_counter() if began is None else began
    try:
        if checkpoint is None:  # prepare has taken the directory over (an earlier run's files are gone)
            prepared.output.record_run()
            prepared.output.write_text("scenario.yaml", prepared.scenario_yaml)
        return RunLoop(prepared, runtime, began, checkpoint, on_round).execute(progress)
    finally:
        prepared.output.release()


class RunLoop:
    """Runs a prepared scenario on a runtime (see :func:`run_scenario`)."""

    def __init__(self, prepared, runtime, began: float, checkpoint: Checkpoint | None = None, on_round=None):
        cfg = self.cfg = prepared.scenario  # plain dataclasses, as the scheduler and the client hosts get it
        self.prepared, self.runtime = prepared, runtime
        self.out = prepared.output
        self.result_keys = prepared.result_keys  # every checkpoint holds them: a resume refuses an edited scenario
        self.checkpoint = checkpoint  # the latest: resumed from, or restarted from if the scheduler is lost
        self.resumed_from = checkpoint  # the checkpoint this process went on from (None: a new run)
        self.began = began - (checkpoint.wall_seconds if checkpoint is not None else 0.0)
        self.scheduler = None
        self.logs: dict = {}
        self.tensorboard = None  # output.tensorboard: the TensorBoardLog beside the logs
        self.tally = Tally.at(checkpoint)  # a lost scheduler's restart goes back to the checkpoint's (_recover)
        self.report = _report_at(checkpoint)
        self.flushed_at, self.flush_cost = time.monotonic(), 0.0
        self.checkpointed_at, self.checkpoint_cost = time.monotonic(), 0.0
        self.restarts = 0
        self.on_round = on_round
        own = [name for name in algorithm_class(cfg.algorithm.name).server_diagnostics if name not in DIAGNOSTICS]
        self.diagnostics = (*DIAGNOSTICS, *own)  # the columns whose last values the summary keeps
        self.schemas = {"rounds.parquet": pa.schema([*ROUNDS_SCHEMA, *(pa.field(name, pa.float64(),
                                                                             metadata=SERVER_DIAGNOSTIC)
                                                                    for name in own)]),
                        "events.parquet": EVENTS_SCHEMA}

    def execute(self, progress=None) -> dict:
        """Run to the end; returns the summary (also saved as summary.json). Errors of the run are
        raised after the rows so far, a ``failed`` summary (and on an interruption a checkpoint
        and an ``interrupted`` summary) are written."""
        try:
            self._start()
            while not self.report["done"]:
                with deferred_signals(announce=True):
                    self._step(progress)
            final = self.scheduler.finish()
        except RunStopped as exc:
            return self._stop("stopped", exc)
        except KeyboardInterrupt as exc:
            self._stop("interrupted", exc)
            raise
        except Exception as exc:
            self._stop("failed", exc)
            raise
        with deferred_signals():  # a signal now finds the run complete: model, summary, no checkpoint
            return self._complete(final)

    # ------------------------------------------------------------------ the loop

    def _start(self) -> None:
        self.prepared.dataset = self.runtime.load(self.cfg, self.prepared.dataset)
        self._restore(self.checkpoint)
        if self.checkpoint is None:  # what a lost scheduler restarts from before the first checkpoint
            self.checkpoint = self._take_checkpoint()

    def _restore(self, checkpoint: Checkpoint | None) -> None:
        """A scheduler (restored from ``checkpoint``) and logs holding the rows it had."""
        for log in self.logs.values():
            log.discard()
        self.logs = {name: ParquetLog(self.out, name, schema, None if checkpoint is None else checkpoint.log_rows[name])
                     for name, schema in self.schemas.items()}
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.cfg.output.tensorboard:
            from raysim.output.tensorboard import TensorBoardLog

            self.tensorboard = TensorBoardLog(self.out, {name: log.written for name, log in self.logs.items()})
        self.scheduler = self.runtime.scheduler(self.cfg, self.prepared.dataset)
        if checkpoint is not None:
            self.scheduler.restore(checkpoint.state, checkpoint.wall_seconds)
            self.report = _report_at(checkpoint)  # a lost scheduler's later steps and updates are undone

    def _step(self, progress) -> None:
        every = self.cfg.output.checkpoint_every
        stop = (self.report["version"] // every + 1) * every if every else None
        if self.on_round is not None:  # one server step at a time: the hook may end the run after any row
            stop = self.report["version"] + 1
        try:
            report = self.scheduler.advance(ADVANCE_SECONDS, stop)
            self.report = report
            self._record(report)
            if progress is not None:
                progress(report)
            if report["error"]:
                raise report["error"]
            for row in report["rounds"] if self.on_round is not None else ():
                self.on_round(dict(row))
            if self._checkpoint_due(report):
                self._save_checkpoint()
                return
        except SchedulerLost as exc:  # in advance or while taking its state for a checkpoint
            self._recover(exc)
            return
        if time.monotonic() - self.flushed_at >= max(self.cfg.output.flush_seconds, 10 * self.flush_cost):
            self._flush()

    def _checkpoint_due(self, report: dict) -> bool:
        """Every ``output.checkpoint_every`` server steps; with 0, every ``output.checkpoint_seconds``
        of wall time, and never more than a twentieth of it (a checkpoint of a run with a thousand
        tasks in flight holds a thousand payloads)."""
        out = self.cfg.output
        if report["done"] or report["version"] <= self.checkpoint.version:
            return False
        if out.checkpoint_every:
            return report["version"] % out.checkpoint_every == 0
        since = time.monotonic() - self.checkpointed_at
        return out.checkpoint_seconds > 0 and since >= max(out.checkpoint_seconds, 20 * self.checkpoint_cost)

    def _record(self, report: dict) -> None:
        events = report["events"]
        if events is not None:
            self.logs["events.parquet"].append(events)
        for actor in report["deaths"]:
            print(f"warning: ClientActor {actor} died; a new one took its place and runs its lost tasks again "
                  "(with the same results; events.parquet marks them 'retried')", file=sys.stderr)
        if report["rounds"]:
            self.logs["rounds.parquet"].append({k: [r[k] for r in report["rounds"]] for k in report["rounds"][0]})
        self.tally.add(report, self.diagnostics)

    def _flush(self) -> None:
        """Flush both logs; if one cannot be written, the other drops what this flush added, so
        that both files keep covering the same server steps."""
        before = {name: log.written for name, log in self.logs.items()}
        unwritten = {name: log.unwritten() for name, log in self.logs.items()} if self.tensorboard is not None else None
        began = time.monotonic()
        try:
            for log in self.logs.values():
                log.flush()
        except OutputError:
            for name, log in self.logs.items():
                try:
                    log.truncate(before[name])
                except OutputError:
                    pass
            raise
        if self.tensorboard is not None:
            self.tensorboard.write_flushed(unwritten)
        self.flushed_at = time.monotonic()
        self.flush_cost = self.flushed_at - began

    def _take_checkpoint(self) -> Checkpoint:
        return Checkpoint(self.scheduler.run_state(), {name: log.rows for name, log in self.logs.items()},
                          asdict(self.tally), self.report.get("wall", 0.0), self.result_keys)

    def _save_checkpoint(self) -> None:
        """Flush the logs, then write the run state with their row counts (``checkpoint.pt``). The
        tally it holds counts it, but not its seconds nor its size, known only once it is written
        (:meth:`Tally.at` takes the size from the file, a resume the seconds from the summary)."""
        began = time.perf_counter()
        self._flush()
        taken = self.tally.checkpoints
        taken["count"] += 1
        checkpoint = self._take_checkpoint()
        taken["bytes"] = checkpoint.save(self.out)
        self.checkpoint = checkpoint
        self.checkpoint_cost = time.perf_counter() - began
        self.checkpointed_at = time.monotonic()
        taken["seconds"] += self.checkpoint_cost

    def _recover(self, exc: SchedulerLost) -> None:
        """Start a new scheduler from the latest checkpoint after the SchedulerActor was lost."""
        self.restarts += 1
        if self.restarts > SCHEDULER_RESTARTS:
            raise RunError(f"{exc}; gave up after {SCHEDULER_RESTARTS} restarts") from None
        print(f"warning: {exc}; restarting it from server step {self.checkpoint.version} "
              f"(restart {self.restarts} of at most {SCHEDULER_RESTARTS})", file=sys.stderr)
        taken = self.tally.checkpoints  # exact here, with the seconds the checkpoint cannot hold
        self._restore(self.checkpoint)
        self.tally = Tally.at(self.checkpoint)
        self.tally.checkpoints = taken

    # ------------------------------------------------------------------ the end

    def _stop(self, status: str, exc: BaseException) -> dict:
        """After an error, an interruption or a stop: write the rows so far (and, interrupted or
        stopped between two steps, a checkpoint), then a summary saying how the run ended; returns
        it. Failures here are reported on stderr and never hide the error that ended the run."""
        disk_failed = isinstance(exc, OutputError)  # its line is the one reported; the logs agree already
        try:
            if status in ("interrupted", "stopped") and self.scheduler is not None and self.logs and not cut_short():
                self._save_checkpoint()
            elif cut_short():  # a step was cut short: its state is half done, the last checkpoint stays
                self._flush()
            elif not disk_failed:
                self._close_logs()
        except (OutputError, RunError) as write_error:
            print(f"error: {write_error}", file=sys.stderr)
        error = {"interrupted": "interrupted", "stopped": None}.get(status) or _error_line(exc)
        summary = self._summary(status, error)
        if status == "stopped":
            summary["stopped_at_round"] = exc.round
        try:
            self._write_summary(summary)
        except OutputError as write_error:
            if not disk_failed:
                print(f"error: {write_error}", file=sys.stderr)
        return summary

    def _close_logs(self) -> None:
        self._flush()  # the last rows too reach the logs (and TensorBoard) through _flush
        for log in self.logs.values():
            log.close()
        if self.tensorboard is not None:
            self.tensorboard.close()

    def _complete(self, final: dict) -> dict:
        self._close_logs()
        self.prepared.final_params = final["params"]
        if self.cfg.output.save_model:
            self.out.save_torch("model.pt", self.prepared.model.state_dict(final["params"]))
        if "privacy_ledger" in final:
            self.out.write_table(PRIVACY_LEDGER, final["privacy_ledger"])
        summary = self._summary("completed", None, final)
        self._write_summary(summary)
        self.out.remove(CHECKPOINT)  # a completed run has nothing to resume
        return summary

    def _summary(self, status: str, error: str | None, final: dict | None = None) -> dict:
        from raysim.models.split import describe_split

        cfg, model, last = self.cfg, self.prepared.model, self.report["last_eval"]
        final = final or {}
        return {
            "name": cfg.name, "seed": cfg.seed, "status": status, "error": error, "stopped_at_round": None,
            "backend": cfg.runtime.backend, "mode": cfg.execution.mode,
            "num_actors": self.runtime.num_actors,
            "rounds": self.logs["rounds.parquet"].rows if self.logs else self.tally.rounds,  # as on disk
            "server_steps": final.get("server_steps", self.report["version"]),
            "client_updates": final.get("client_updates", self.report["applied"]), "tasks": self.tally.statuses,
            "final_test_accuracy": _null(last.get("test_accuracy")), "final_test_loss": _null(last.get("test_loss")),
            "final_personalized_accuracy": _null(last.get("personalized_accuracy")),
            "final_personalized_accuracy_mean": _null(last.get("personalized_accuracy_mean")),
            "final_personalized_accuracy_ci95": _null(last.get("personalized_accuracy_ci95")),
            "final_personalized_accuracy_p10": _null(last.get("personalized_accuracy_p10")),
            "final_personalized_accuracy_std": _null(last.get("personalized_accuracy_std")),
            "final_new_client_accuracy": _null(last.get("new_client_accuracy")),
            "final_new_client_personalized_accuracy": _null(last.get("new_client_personalized_accuracy")),
            "new_clients": new_clients(cfg, self.prepared.dataset.num_clients).tolist(),
            "final_diagnostics": {k: float(v) for k, v in self.tally.diagnostics.items()},
            "evaluated_clients": min(cfg.eval.clients or math.inf, self.prepared.dataset.num_clients),
            "evaluated_on": None if cfg.data.kind == "quadratic" else "actors" if evaluates_on_hosts(cfg) else "driver",
            "data_on_demand": self.prepared.dataset.on_demand,
            "model_sha256": final.get("model_sha256"), "virtual_time": final.get("virtual_time"),
            "bytes_down": final.get("bytes_down"), "bytes_up": final.get("bytes_up"),
            "wall_seconds": time.perf_counter() - self.began,  # this process's; rounds' wall_time goes on from
            "resumed_at_step": None if self.resumed_from is None else self.resumed_from.version,  # the checkpoint's
            "wall_seconds_before_resume": None if self.resumed_from is None else self.resumed_from.wall_seconds,
            "steady_updates_per_second": self.tally.steady_rate(),
            "checkpoints": dict(self.tally.checkpoints), "scheduler_restarts": self.restarts,
            "system": final.get("system"), "selection": final.get("selection"), "privacy": final.get("privacy"),
            "actors": self.runtime.describe() if final else [],
            "split": describe_split(model.module, model.personal),
            "model": {"kind": cfg.model.kind, "parameters": model.size,
                      "feature_shape": list(self.prepared.dataset.feature_shape),
                      "num_classes": self.prepared.dataset.num_classes},
        }

    def _write_summary(self, summary: dict) -> None:
        import json

        self.out.write_text("summary.json", json.dumps(_plain(summary), indent=2, allow_nan=False) + "\n")


def _plain(value):
    """``value`` (dicts, lists, numbers) as strict JSON holds it: numpy numbers as Python ones and every
    non-finite float as None, so that summary.json never holds NaN or Infinity."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    number = float(value)
    return number if math.isfinite(number) else None


def _null(x):
    """NaN → None, so JSON shows a missing value rather than a number."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _report_at(checkpoint: Checkpoint | None) -> dict:
    """The progress report of a run at ``checkpoint`` (None: at the start), until its scheduler reports."""
    if checkpoint is None:
        return {"version": 0, "applied": 0, "last_eval": {}, "done": False}
    state = checkpoint.state
    return {"version": state.version, "applied": state.applied, "last_eval": dict(state.last_eval), "done": False}


def _error_line(exc: BaseException) -> str:
    """summary.json's ``error``: a RunError's own line; for any other exception (a fault in code,
    the user's or raysim's) its type and first line: those of the exception a Ray task raised,
    not of Ray's wrapper around it."""
    exc = getattr(exc, "cause", None) or exc  # ray.exceptions.RayTaskError.cause
    text = str(exc) if isinstance(exc, (RunError, ScenarioError)) else f"{type(exc).__name__}: {exc}"
    return (text.strip().splitlines() or [type(exc).__name__])[0]
