"""The ``raysim`` command: run, resume, validate, list, submit, jobs, report, bench, sweep, tune."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from raysim.errors import SHOWN_LINE, RunError, ScenarioError, shortened

EXIT_BAD_INPUT, EXIT_RUN_FAILED, EXIT_INTERRUPTED = 2, 1, 130


PLAIN_EVERY = 10.0  # seconds between two progress lines when stderr is not a terminal (a log, a Ray job's)


class ProgressBar:
    """tqdm bar over rounds (sync) or applied updates (async), with accuracy (a quadratic problem's
    rel_error) and updates per second; it appears with the scheduler's first report (a run refused
    earlier prints only its error). When stderr is not a terminal (a log file, a Ray job's logs),
    a plain line every :data:`PLAIN_EVERY` seconds instead."""

    def __init__(self, cfg, enabled: bool):
        ex = cfg.execution
        self.sync, self.enabled = ex.mode == "sync", enabled
        self.total = ex.rounds if self.sync else ex.max_updates
        self.bar = None
        self.last = None  # (time, applied) of the previous report
        self.plain = not sys.stderr.isatty()
        self.printed = -math.inf  # when the last plain line was printed

    def __call__(self, report: dict):
        done = report["version"] if self.sync else report["applied"]
        if self.plain:
            return self._line(report, done)
        if self.bar is None:  # tqdm's rate counts from the first report, not from 0 in no time
            from tqdm import tqdm

            from raysim.startup import erase_startup

            erase_startup()

            self.bar = tqdm(total=self.total, initial=done, unit="round" if self.sync else "update",
                            disable=not self.enabled, dynamic_ncols=True)
        self.bar.update(done - self.bar.n)
        acc = report["last_eval"]["test_accuracy"]
        now, applied = time.perf_counter(), report["applied"]
        if self.last is not None:  # since the previous report
            rate = (applied - self.last[1]) / max(now - self.last[0], 1e-9)
        else:  # the first: its own steps' rate (the time since the command began holds the start-up)
            rate = (report["rounds"][-1].get("updates_per_second") if report["rounds"] else None) or float("nan")
        self.last = (now, applied)
        metric = {"acc": "-" if acc != acc else f"{acc:.4f}"}
        rel_error = report["rounds"][-1].get("rel_error") if report["rounds"] else None
        if acc != acc and rel_error is not None:  # a quadratic problem: no test set, an exact error instead
            metric = {"rel_error": f"{rel_error:.3g}"}
        self.bar.set_postfix({**metric, "upd/s": "-" if rate != rate else f"{rate:.0f}"})

    def _line(self, report: dict, done: int) -> None:
        """A plain progress line, at most every PLAIN_EVERY seconds and at the last step: 'round 12/30,
        test accuracy 0.8123, virtual s 41.2'."""
        now = time.perf_counter()
        if not self.enabled or (now - self.printed < PLAIN_EVERY and done != self.total):
            return
        self.printed = now
        acc = report["last_eval"]["test_accuracy"]
        total = "" if self.total is None else f"/{self.total}"
        accuracy = "" if acc != acc else f", test accuracy {acc:.4f}"
        rows = report["rounds"]
        clock = f", virtual s {rows[-1]['virtual_time']:.4g}" if rows and "virtual_time" in rows[-1] else ""
        print(f"{'round' if self.sync else 'update'} {done}{total}{accuracy}{clock}", file=sys.stderr, flush=True)

    def close(self):
        from raysim.startup import erase_startup

        erase_startup()  # a run that ends before its first report leaves no status line behind
        if self.bar is not None:
            self.bar.close()


def cmd_run(args) -> int:
    from raysim.scenario import load_scenario

    began = time.perf_counter()
    return _execute(load_scenario(args.scenario, args.overrides), args, began)


def cmd_resume(args) -> int:
    from raysim.resuming import load_resume

    began = time.perf_counter()
    if args.address is not None:  # as a Ray job: the run's directory must be one the cluster reaches
        from actors.jobs import shipped_files, submit

        return submit(args.address, ["resume", args.run_dir, *args.overrides], args.follow, not args.no_wait,
                      not args.no_pip, shipped_files(None)[0])
    cfg, checkpoint = load_resume(args.run_dir, args.overrides)
    if not args.quiet:
        print(f"resuming {cfg.name} from server step {checkpoint.version} in {cfg.output.dir}", file=sys.stderr)
    return _execute(cfg, args, began, checkpoint)


def _execute(cfg, args, began: float, checkpoint=None) -> int:
    """Run (or resume) a loaded scenario with a progress bar and a closing line."""
    from raysim.api import execute

    bar = ProgressBar(cfg, enabled=not args.quiet)
    if not args.quiet:
        from raysim.startup import show_startup

        show_startup()
    try:
        summary, _ = execute(cfg, bar, began, checkpoint, freeze=True, replace=getattr(args, "replace", False))
    except RunError as exc:
        raise RunError(f"{exc}\nmetrics written so far are in {cfg.output.dir}") from None
    except KeyboardInterrupt as exc:  # main() prints this line
        exc.args = (_stopped_line(cfg, resuming=checkpoint is not None),)
        raise
    finally:
        bar.close()
    if not args.quiet:
        steps = (f"{summary['rounds']} rounds" if cfg.execution.mode == "sync"
                 else f"{summary['server_steps']} server steps")
        print(f"{cfg.name}: {steps}, {summary['client_updates']} client updates{_not_applied(summary['tasks'])}, "
              f"{_final_metrics(summary)}, {summary['wall_seconds']:.1f} s wall -> {cfg.output.dir}")
    return 0


def _not_applied(tasks: dict) -> str:
    """' (14 late, 3 dropped of 103 tasks: 16.5%)': the tasks whose update did not count, by status."""
    others = {status: n for status, n in tasks.items() if status != "applied" and n}
    if not others:
        return ""
    total = sum(tasks.values())
    counts = ", ".join(f"{n} {status}" for status, n in others.items())
    return f" ({counts} of {total} tasks: {sum(others.values()) / total:.1%})"


def _stopped_line(cfg, resuming: bool) -> str:
    """What Ctrl-C or SIGTERM left in the run's directory: a checkpoint to resume from, or nothing
    yet. A new run stopped during start-up has not cleared the directory: a checkpoint there is an
    earlier run's, which continues this run only if that run had the same scenario."""
    from raysim.scenario import to_yaml
    from raysim.lifecycle import terminated
    from raysim.output import OutputDir
    from raysim.output.directory import CHECKPOINT  # not raysim.engine.checkpoint: torch may be half imported

    how, run_dir = "terminated" if terminated() else "interrupted", cfg.output.dir

    def read(name: str, parse=lambda f: f.read().decode()):  # None: missing or unreadable
        try:
            with OutputDir.open(run_dir, create=False).reader(name) as f:
                return parse(f)
        except (OSError, ValueError, ScenarioError):
            return None

    ours = resuming or read("scenario.yaml") == to_yaml(cfg)
    if ours and (read("summary.json", json.load) or {}).get("status") == "completed":  # signalled as it ended
        return f"{how} after the run completed: its results are in {run_dir}"
    found = read(CHECKPOINT, parse=lambda f: True) is not None
    if found and ours:
        return f"{how}: metrics and a checkpoint are in {run_dir}; continue with: raysim resume {run_dir}"
    earlier = f" (the {CHECKPOINT} there is an earlier run's)" if found else ""
    return f"{how} before the run's first checkpoint: nothing to resume in {run_dir}{earlier}"


def _final_metrics(summary: dict) -> str:
    """The run's final figures: test accuracy, or the diagnostics a run without a test set logs
    (quadratic, saddle)."""
    if summary["final_test_accuracy"] is not None or not summary["final_diagnostics"]:
        acc = summary["final_test_accuracy"]
        return f"final test accuracy {acc if acc is None else round(acc, 4)}"
    return "final " + ", ".join(f"{k} {v:.4g}" for k, v in summary["final_diagnostics"].items())


def _budget(ex) -> str:
    """What a run's execution section runs for, in words."""
    if ex.mode == "sync":
        deadline = "" if ex.deadline is None else f", deadline {ex.deadline:g} s"
        return f"{ex.rounds} rounds of {ex.clients_per_round} clients{deadline}"
    stops = [f"{ex.max_updates} updates" if ex.max_updates is not None else None,
             f"{ex.max_virtual_time:g} virtual seconds" if ex.max_virtual_time is not None else None,
             f"test accuracy {ex.target_accuracy:g}" if ex.target_accuracy is not None else None]
    buffer = f" (buffer {ex.buffer_size})" if ex.aggregation == "fedbuff" else ""
    return (f"async {ex.aggregation}{buffer}, {ex.concurrency} in flight, until "
            + " or ".join(s for s in stops if s))


def cmd_validate(args) -> int:
    from raysim.scenario import load_scenario
    from raysim.preparation import prepare
    from raysim.footprint import summary

    from raysim.sweep import plan_sweep, read_scenario

    if read_scenario(args.scenario)[1]:  # a sweep file: every point validates (plan_sweep checks each)
        sweep = plan_sweep(args.scenario, overrides=args.overrides, progress=True)
        print(f"ok: {args.scenario}: a sweep of {len(sweep.points)} runs over {', '.join(sweep.grid)} into {sweep.out}")
        return 0
    from raysim.sweep.search_plan import plan_search, search_section

    if search_section(args.scenario):  # a search file: its ranges and options
        search = plan_search(args.scenario, args.overrides)
        print(f"ok: {args.scenario}: a search ({search.algo}{', ASHA' if search.asha else ''}) of {search.samples} "
              f"trials over {', '.join(search.space)} by {search.metric} ({search.mode}) into {search.out}")
        return 0
    cfg = load_scenario(args.scenario, args.overrides)
    if cfg.runtime.backend == "ray":  # Ray's workers must import raysim; the actors must fit the embedded Ray
        from raysim.import_path import check_workers_import_raysim

        check_workers_import_raysim(cfg.runtime)
        from actors.runtime import embedded_plan

        embedded_plan(cfg.runtime)
    prepared = prepare(cfg, create_output=False)
    dataset, model = prepared.dataset, prepared.model
    budget = _budget(cfg.execution)
    classes = f"{dataset.num_classes} classes" if dataset.num_classes else "regression (no classes)"
    print(f"ok: {args.scenario}: {dataset.num_clients} clients, {classes}, "
          f"features {list(dataset.feature_shape)}, model {cfg.model.kind} with {model.size} parameters, "
          f"algorithm {cfg.algorithm.name}, {budget}; {summary(cfg)}")
    print(_durations(prepared, cfg.execution))
    if cfg.privacy.mechanism != "none":
        from raysim.privacy.accounting import plan_line

        print(plan_line(prepared.scenario, dataset.num_clients))
    return 0


def _durations(prepared, ex) -> str:
    """'task durations: median …, p90 …, p99 … virtual s (first task of N clients)', and with a
    deadline the share of those tasks it would leave late."""
    import numpy as np

    from raysim.engine.scheduler import task_durations

    seconds = task_durations(prepared.scenario, prepared.dataset.table)
    median, p90, p99 = np.quantile(seconds, [0.5, 0.9, 0.99])
    line = (f"task durations: median {median:.3g}, p90 {p90:.3g}, p99 {p99:.3g} virtual s "
            f"(first task of {len(seconds):,} clients)")
    if ex.mode == "sync" and ex.deadline is not None:
        line += f"; execution.deadline {ex.deadline:g} leaves {np.mean(seconds > ex.deadline):.1%} of them late"
    return line


def cmd_list(args) -> int:
    import yaml

    from raysim.catalog import ALGORITHMS, MODELS, algorithm_class, algorithm_doc, algorithm_keys
    from raysim.scenario import Scenario
    from raysim.scenario.schema import SELECTORS
    from raysim.data import DATASETS
    from raysim.data.partition import PARTITIONERS
    from raysim.algorithms.aggregator_catalog import AGGREGATOR_DOCS
    from raysim.schema import describe
    from raysim.system.config import DISTRIBUTIONS
    from raysim.privacy.config import ACCOUNTANTS, MECHANISMS
    from raysim.communication.config import DOWNLINK, OPERATORS, PROTOCOLS

    if args.markdown:  # the key reference, docs/keys.md (or one algorithm's keys) as Markdown
        from raysim import reference

        if args.algorithm is None:
            print(reference.markdown(), end="")
        else:
            keys_class = algorithm_keys(args.algorithm)
            print("\n".join([f"`algorithm.name: {args.algorithm}`: {algorithm_doc(keys_class)}", "",
                             *reference.algorithm_table(keys_class)]))
        return 0

    def keys(rows):
        return {k: {"default": default, "doc": doc} if doc else {"default": default} for k, default, doc in rows}

    def algorithm(schema):
        return {"doc": algorithm_doc(schema), "keys": keys(describe(schema)[1:])}  # [0] is the name

    if args.algorithm is not None:  # one algorithm, a built-in or a custom class
        if args.algorithm in ALGORITHMS:
            entry = algorithm(algorithm_keys(args.algorithm))
        else:  # a custom class: its keys, and the columns it adds to the logs
            cls = algorithm_class(args.algorithm)
            entry = algorithm(cls.Keys)
            entry.update({kind: list(getattr(cls, kind)) for kind in ("server_diagnostics", "client_diagnostics")
                          if getattr(cls, kind)})
        print(yaml.safe_dump({args.algorithm: entry}, sort_keys=False, allow_unicode=True, width=110), end="")
        return 0
    algorithms = {name: algorithm(builtin.keys) for name, builtin in ALGORITHMS.items()}
    scenario = [row for row in describe(Scenario) if not row[0].startswith("algorithm")]
    listing = {"datasets (data.kind)": DATASETS, "partitioners (data.partition.kind)": PARTITIONERS,
               "models (model.kind)": {name: kind.doc for name, kind in MODELS.items()},
               "algorithms (algorithm.name; algorithm.<key>)": algorithms,
               "aggregators (algorithm.aggregator)": AGGREGATOR_DOCS,
               "Byzantine attacks (system.byzantine.attack)": {name.split(".", 1)[1]: doc for name, doc in
                                                               DISTRIBUTIONS.items() if name.startswith("attack.")},
               "privacy mechanisms (privacy.mechanism)": MECHANISMS,
               "privacy accountants (privacy.accountant)": ACCOUNTANTS,
               "uplink operators (communication.uplink.kind)": OPERATORS,
               "downlink operators (communication.downlink.kind)": DOWNLINK,
               "selectors (execution.selection.kind)": SELECTORS,
               "secure aggregation protocols (communication.secure_aggregation.protocol)": PROTOCOLS,
               "scenario keys": keys(scenario)}
    print(yaml.safe_dump(listing, sort_keys=False, allow_unicode=True, width=110), end="")
    return 0


def cmd_submit(args) -> int:
    from raysim.scenario import load_scenario
    from raysim.sweep import plan_sweep, read_scenario
    from raysim.sweep.search_plan import plan_search, search_section

    if args.address is None and not args.dry_run:
        raise ScenarioError("--address", None, "the cluster's job server, e.g. http://HEAD:8265 (or --dry-run)")

    scenario_files = []
    if read_scenario(args.scenario)[1]:  # a sweep: section: the job runs `raysim sweep FILE`
        points = plan_sweep(args.scenario, overrides=args.overrides, progress=True).points
        command, cfgs = "sweep", [p.cfg for p in points]
        scenario_files = sorted({str(p.source) for p in points if isinstance(p.source, str)})
    elif search_section(args.scenario):  # a tune: section: the job runs `raysim tune FILE`
        command, cfgs = "tune", [plan_search(args.scenario, args.overrides).cfg]
    else:
        command, cfgs = "run", [load_scenario(args.scenario, args.overrides)]  # bad input fails before submitting
    from actors.jobs import entrypoint, local_modules, shipped_files, submit

    modules = sorted({module for cfg in cfgs for module in local_modules(cfg)})
    files, there = shipped_files(args.scenario, scenario_files, modules)
    job = [command, there, *args.overrides]
    if args.dry_run:
        print("\n".join(sorted(files)))
        print(f"{len(files)} files; the job would run: {entrypoint(job)}", file=sys.stderr)
        return 0
    return submit(args.address, job, args.follow, not args.no_wait, not args.no_pip, files)


def cmd_sweep(args) -> int:
    from raysim.sweep import plan_sweep, run_sweep

    sweep = plan_sweep(args.scenario, args.grid, args.overrides, repeat=args.repeat, out=args.out,
                       parallel=args.parallel, plots=args.plot, progress=not args.quiet,
                       runner=args.runner)
    return run_sweep(sweep, in_process=args.in_process, quiet=args.quiet)


def cmd_tune(args) -> int:
    from raysim.sweep.search import run_search
    from raysim.sweep.search_plan import plan_search

    search = plan_search(args.scenario, args.overrides, args.search, metric=args.metric, mode=args.mode,
                         samples=args.samples, algo=args.algo, asha=args.asha, grace_period=args.grace_period,
                         seed=args.seed, out=args.out)  # options not given (None): the file's tune: section's
    return run_search(search, quiet=args.quiet)


def cmd_jobs(args) -> int:
    from actors.jobs import list_or_stop

    return list_or_stop(args.address, args.stop)


def cmd_report(args) -> int:
    from raysim.report.figures import time_to_accuracy_table, write_report

    if args.target is not None and not 0 < args.target <= 1:
        raise ScenarioError("--target", args.target, "a test accuracy in (0, 1]")

    for path in write_report(args.runs, args.out, args.target):
        print(path)
    if args.target is not None:
        print(time_to_accuracy_table(args.runs, args.target))
    return 0


def cmd_bench(args) -> int:
    from pathlib import Path

    from raysim.bench import run_bench

    for option, value in (("--repeat", args.repeat), ("--events", args.events)):
        if value < 1:
            raise ScenarioError(option, value, "an integer >= 1")
    stages = next((name for name in ("privacy", "compression", "personalization") if getattr(args, name)), None)
    if args.baseline is not None:
        if args.durability or args.aggregators or args.scale or args.sweep or stages:
            raise ScenarioError("--baseline", args.baseline, "no --durability, --aggregators, --scale, --sweep, "
                                                             "--privacy, --compression or --personalization with it "
                                                             "(it runs beside W1, W2 and --async)")
        if not all((Path(args.baseline) / part).exists() for part in ("raysim/cli.py", "scenarios/bench")):
            raise ScenarioError("--baseline", args.baseline, "a raysim checkout, with raysim/cli.py and "
                                                             "scenarios/bench/ (git worktree add DIR COMMIT makes one)")
    return run_bench(w2=args.w2, only=args.only, out_dir=args.out, repeat=args.repeat, asynchronous=args.asynchronous,
                     durability=args.durability, events=args.events, aggregators=args.aggregators, scale=args.scale,
                     scale_clients=args.clients, baseline=args.baseline, stages=stages, sweep=args.sweep)


def _job_options(p, address: str) -> None:
    """Options of a command that runs as a Ray job on a cluster (``address``: when --address applies)."""
    p.add_argument("--address", help=f"the cluster's job server, e.g. http://HEAD:8265 ({address})")
    p.add_argument("--follow", action="store_true", help="stream the job's logs")
    p.add_argument("--no-wait", action="store_true", help="return once submitted (the job id is printed)")
    p.add_argument("--no-pip", action="store_true", help="do not ship raysim's Python dependencies as the job's "
                                                          "pip runtime environment (the cluster has them)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raysim", description="Federated learning simulator on Ray and PyTorch.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. algorithm.lr=0.1; ~key "
                                                              "unsets a key the file sets")
    run.add_argument("--quiet", action="store_true", help="no progress bar or closing line")
    run.add_argument("--replace", action="store_true", help="replace the earlier run in the output directory "
                                                            "(its own files only; without it, such a run is refused)")
    run.set_defaults(func=cmd_run)
    res = sub.add_parser("resume", help="continue a stopped run from its checkpoint (same results as if it had "
                                        "never stopped)")
    res.add_argument("run_dir", help="the run's output directory (output.dir, a path or URI)")
    res.add_argument("overrides", nargs="*", default=[], help="key=value overrides of keys that cannot change results: "
                                                  "runtime.*, data.on_demand, data.cache_mb, output.flush_seconds, "
                                                  "output.checkpoint_*")
    res.add_argument("--quiet", action="store_true", help="no progress bar or closing line")
    _job_options(res, "resume there as a Ray job; the run's directory must be a URI or a path the cluster has")
    res.set_defaults(func=cmd_resume)
    val = sub.add_parser("validate", help="check a scenario and overrides without running it")
    val.add_argument("scenario", help="scenario YAML file")
    val.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. algorithm.lr=0.1; ~key "
                                                              "unsets a key the file sets")
    val.set_defaults(func=cmd_validate)
    lst = sub.add_parser("list", help="datasets, partitioners, models, algorithms with their keys, and every scenario key, as YAML")
    lst.add_argument("algorithm", nargs="?", help="only this algorithm and its keys: a built-in name, or "
                                                  "package.module:Class (imported from the current directory)")
    lst.add_argument("--markdown", action="store_true", help="the same keys as Markdown tables, with what each "
                                                             "allows and when it applies: the reference docs/keys.md "
                                                             "(raysim list --markdown > docs/keys.md)")
    lst.set_defaults(func=cmd_list)
    sbm = sub.add_parser("submit", help="run a scenario as a Ray job on a cluster (Job Submission SDK)")
    sbm.add_argument("scenario", help="scenario (or sweep) YAML file; it travels with the job")
    sbm.add_argument("overrides", nargs="*", default=[], help="key=value overrides")
    _job_options(sbm, "required unless --dry-run")
    sbm.add_argument("--dry-run", action="store_true", help="print the files the job would ship, and its command; "
                                                             "submit nothing")
    sbm.set_defaults(func=cmd_submit)
    jbs = sub.add_parser("jobs", help="list the cluster's jobs, or stop one")
    jbs.add_argument("--address", required=True, help="the cluster's job server, e.g. http://HEAD:8265")
    jbs.add_argument("--stop", metavar="JOB_ID", help="stop this job")
    jbs.set_defaults(func=cmd_jobs)
    rep = sub.add_parser("report", help="PNG plots of one or more runs (accuracy and loss vs rounds, virtual "
                                       "and wall time, diagnostics, staleness, participation, task timeline) "
                                       "and report.html, all plots and a table of the runs in one file")
    rep.add_argument("runs", nargs="+", help="run directories (output.dir of earlier runs, paths or URIs)")
    rep.add_argument("--out", help="directory for the PNGs and report.html (default: the run's directory, "
                                   "or <parent>/report)")
    rep.add_argument("--target", type=float, help="test accuracy to draw on the accuracy plots, each run's time "
                                                  "to reach it in the legend; also print a Markdown table of them")
    rep.set_defaults(func=cmd_report)
    bench = sub.add_parser("bench", help="workload W1 (and W2) against a bare PyTorch loop, same run")
    bench.add_argument("--w2", action="store_true", help="also run W2 (10,000 clients)")
    bench.add_argument("--async", dest="asynchronous", action="store_true",
                       help="scheduler throughput (10,000 in flight) and async W1 vs sync W1 instead")
    bench.add_argument("--durability", action="store_true",
                       help="checkpoint cost per W1 round, interrupt-and-resume time against an uninterrupted W1, "
                            "and the driver's memory over a long FedAsync run")
    bench.add_argument("--events", type=int, default=1_000_000, help="applied updates of --durability's long run")
    bench.add_argument("--aggregators", action="store_true",
                       help="time every aggregator on 100 updates of 10^6 numbers, as a ratio to the mean")
    bench.add_argument("--scale", action="store_true",
                       help="W1 with --clients registered clients against W1 (1,000): round time, time to the "
                            "first round and peak memory of the process tree")
    bench.add_argument("--privacy", action="store_true",
                       help="W1 (60 rounds) with central DP against W1: the overhead of clipping, noise and "
                            "accounting")
    bench.add_argument("--compression", action="store_true",
                       help="W1 (60 rounds) with top-k 1%% and error feedback, with QSGD and with secure "
                            "aggregation, against W1: the stages' cost")
    bench.add_argument("--personalization", action="store_true",
                       help="W1 (60 rounds) with Ditto, FedPer, FedRep, LG-FedAvg, APFL, pFedMe and local-only "
                            "training against FedAvg, and FedBN against FedAvg on W1 with the digits and the "
                            "BatchNorm CNN: each baseline's cost per client update")
    bench.add_argument("--sweep", action="store_true",
                       help="a four-point W1 sweep (isolated processes, --in-process, --runner tune) against four "
                            "isolated W1 runs and against four times W1's steady training time")
    bench.add_argument("--clients", type=int, default=1_000_000, help="registered clients of --scale's large run")
    bench.add_argument("--only", choices=["raysim", "bare"], help="run one side only")
    bench.add_argument("--baseline", metavar="DIR",
                       help="another raysim checkout (e.g. an earlier commit's git worktree) run interleaved as a "
                            "third side, on its own copy of each workload's scenario file; prints raysim/baseline")
    bench.add_argument("--out", default="results/bench", help="directory for the runs' outputs")
    bench.add_argument("--repeat", type=int, default=1, help="runs per side (medians are reported)")
    bench.set_defaults(func=cmd_bench)
    swp = sub.add_parser("sweep", help="run every point of a grid of scenario keys (and repeats) as a full run; "
                                       "one table (sweep.parquet) and plots")
    swp.add_argument("scenario", help="scenario YAML file (a sweep: section gives the grid and these options)")
    swp.add_argument("overrides", nargs="*", default=[], help="key=value overrides for every point")
    swp.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,…",
                     help="a grid key and its values (YAML, lists in brackets: model.hidden=[64],[64,64]); repeat "
                          "for more keys, the points are their Cartesian product; for a labelled axis of the sweep: "
                          "section, the labels whose points run")
    swp.add_argument("--repeat", type=int, help="runs per point, repeat r with seed + r (default 1)")
    swp.add_argument("--out", help="the sweep's directory: <out>/<point>/ per run, sweep.parquet, plots "
                                   "(default results/sweeps/<name>)")
    swp.add_argument("--parallel", type=int, help="points run at once, each in its own process (default 1); each "
                                                  "point's embedded Ray then declares runtime.num_cpus = CPUs // N "
                                                  "(at least 1) unless the scenario, an override or the grid sets it")
    swp.add_argument("--plot", action="append", metavar="METRIC:KEY",
                     help="also plot a column of sweep.parquet against a grid key, e.g. wall_seconds:data.num_clients")
    swp.add_argument("--in-process", action="store_true",
                     help="run the points one after another in this process, sharing one Ray session and its "
                          "started ClientActors (quicker for small points; memory figures are then not comparable "
                          "with isolated runs)")
    swp.add_argument("--runner", choices=["processes", "tune"],
                     help="processes: each point a raysim run process (default); tune: each point a Ray Tune trial "
                          "in one Ray session, reserving its process and its ClientActors as one placement group, "
                          "so that trials pack onto the cluster")
    swp.add_argument("--quiet", action="store_true", help="no line per point")
    swp.set_defaults(func=cmd_sweep)
    tun = sub.add_parser("tune", help="search scenario keys as Ray Tune trials (random, grid or optuna), with "
                                      "ASHA early stopping; search.parquet and best.yaml")
    tun.add_argument("scenario", help="scenario YAML file (a tune: section gives the ranges and these options; a "
                                      "flag given replaces the section's)")
    tun.add_argument("overrides", nargs="*", default=[], help="key=value overrides for every trial")
    tun.add_argument("--search", action="append", default=[], metavar="KEY=SPEC",
                     help="a key and its range: loguniform(a,b), uniform(a,b), randint(a,b) (a..b-1), choice(v1,…) "
                          "or v1,v2,… (the only form with --algo grid); repeat for more keys")
    tun.add_argument("--metric",
                     help="what ranks trials: a rounds.parquet column (per round: ASHA can use it) or a summary "
                          "figure such as final_test_accuracy (default test_accuracy)")
    tun.add_argument("--mode", help="max or min (default max)")
    tun.add_argument("--samples", type=int, help="trials (default 1; --algo grid: every point)")
    tun.add_argument("--algo", help="random, grid or optuna (TPE) (default random)")
    tun.add_argument("--asha", action=argparse.BooleanOptionalAction,
                     help="stop trials early with ASHA (reduction factor 2) on the metric's per-round values "
                          "(default: no)")
    tun.add_argument("--grace-period", type=int, help="rounds a trial runs before ASHA may stop it (default 1)")
    tun.add_argument("--seed", type=int, help="the searcher's seed: the same seed samples the same trials (default 0)")
    tun.add_argument("--out", help="the search's directory: <out>/trial_<i>_<params>/ per run, search.parquet, "
                                   "best.yaml (default results/searches/<name>)")
    tun.add_argument("--quiet", action="store_true", help="no line per trial on stderr")
    tun.set_defaults(func=cmd_tune)
    return p


def _print_error(exc: Exception) -> None:
    """``error: <message>`` on stderr, each line of the message shortened to SHOWN_LINE characters."""
    from raysim.startup import erase_startup

    erase_startup()
    print("error: " + "\n".join(shortened(line, SHOWN_LINE) for line in str(exc).splitlines()), file=sys.stderr)


def main(argv=None) -> int:
    from contextlib import nullcontext

    from raysim.lifecycle import Terminated, end_with_parent, guarded, handle_signals, leaving, terminated

    p = parser()
    args, extra = p.parse_known_args(argv)
    if extra and (not hasattr(args, "overrides") or any(e.startswith("-") for e in extra)):
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:  # key=value overrides given after an option such as --quiet
        args.overrides = list(args.overrides) + extra
    handle_signals()  # SIGTERM stops like Ctrl-C; a second signal does not interrupt the clean-up
    try:
        end_with_parent()  # a sweep's point stops when its sweep does
        with guarded() if args.command in ("run", "resume") else nullcontext():  # no process outlives the run
            return args.func(args)
    except ScenarioError as exc:
        _print_error(exc)
        return EXIT_BAD_INPUT
    except RunError as exc:
        _print_error(exc)
        return EXIT_RUN_FAILED
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated); a run's own line once it has started
        how = "terminated" if terminated() else "interrupted"
        starting = args.command in ("run", "resume")
        from raysim.startup import erase_startup

        erase_startup()
        print(str(exc) or (f"{how} before the run started: nothing was written" if starting else how), file=sys.stderr)
        status = Terminated.EXIT_STATUS if terminated() else EXIT_INTERRUPTED
        from raysim.engine.interrupts import cut_short

        if cut_short():  # a step that may never end was abandoned: its threads must not keep the process alive
            sys.stdout.flush()
            sys.stderr.flush()
            leaving()
            os._exit(status)
        return status


if __name__ == "__main__":
    sys.exit(main())
