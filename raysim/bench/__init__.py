"""``raysim bench``: workloads W1 (and W2) run by raysim and by a bare PyTorch loop in one command.

Each side runs in its own fresh process, so wall time includes start-up (imports,
data generation, Ray start-up and shut-down) and memory is the peak of that
process tree. Figures are printed as ratios against the bare loop measured in
the same command (and, with ``--baseline``, against another raysim checkout run
interleaved with this one); nothing is compared with numbers from another machine.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import pyarrow.parquet as pq

from raysim.measure import MIB, measure, steady

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios" / "bench"
# wall and updates/s against the bare loop, raysim's own updates/s (on the 2-core development machine), peak PSS
TARGETS = {"w1": (" (target <= 1.3)", " (target >= 1.5)", " (target >= 4000 on 2 cores)",
                  " (target <= 1.2 GiB = 1229 MiB)")}


def run_raysim(workload: str, out: Path, baseline: Path | None = None, overrides: tuple = (),
               side: str = "raysim") -> dict:
    """``raysim run`` of a workload (with ``overrides``, into ``<out>/<workload>/<side>``) in a fresh
    process; with ``baseline``, the raysim of that checkout runs the checkout's own scenario file
    of the workload."""
    run_dir = (out / workload / ("baseline" if baseline else side)).resolve()
    scenario = (baseline / "scenarios" / "bench" if baseline else SCENARIOS) / f"{workload}.yaml"
    cmd = [sys.executable, "-m", "raysim.cli", "run", str(scenario), "--quiet", "--replace", f"output.dir={run_dir}",
           *overrides]
    env = None
    if baseline:  # the checkout's package first on the path, for the driver and (inherited) Ray's workers;
        # run from the checkout too, since `python -m` puts the working directory (maybe this checkout) first
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(baseline), os.environ.get("PYTHONPATH")])))
    figures = measure(cmd, env=env, cwd=baseline)
    if figures["returncode"] != 0:
        raise RuntimeError(f"{'the baseline' if baseline else 'raysim'} run of {workload} failed with exit code "
                           f"{figures['returncode']}")
    rounds = pq.read_table(run_dir / "rounds.parquet").to_pydict()
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary["mode"] == "async":  # many tiny server steps: rate over the whole run after the first
        ups = summary["steady_updates_per_second"]
        return dict(figures, updates_per_second=ups, seconds_per_round=1.0 / ups,
                    final_test_accuracy=summary["final_test_accuracy"], actors=summary["num_actors"])
    round_seconds = [c / u for c, u in zip(rounds["clients"], rounds["updates_per_second"])]
    ups, per_round = steady(round_seconds, rounds["clients"][0])
    return dict(figures, updates_per_second=ups, seconds_per_round=per_round,
                final_test_accuracy=summary["final_test_accuracy"], actors=summary["num_actors"])


def run_bare(workload: str, out: Path) -> dict:
    """The bare single-thread loop of a workload in a fresh process."""
    (out / workload).mkdir(parents=True, exist_ok=True)
    result_file = out / workload / "bare.json"
    figures = measure([sys.executable, "-m", "raysim.bench.bare_loop", str(SCENARIOS / f"{workload}.yaml"),
                       str(result_file)])
    if figures["returncode"] != 0:
        raise RuntimeError(f"bare loop of {workload} failed with exit code {figures['returncode']}")
    result = json.loads(result_file.read_text())
    ups, per_round = steady(result["round_seconds"], result["clients_per_round"])
    return dict(figures, updates_per_second=ups, seconds_per_round=per_round,
                final_test_accuracy=result["final_test_accuracy"], actors=0)


# s/step: seconds per server step (a synchronous round; one applied update under FedAsync)
HEADER = f"{'run':18s} {'wall s':>8s} {'upd/s':>10s} {'s/step':>10s} {'PSS MiB':>9s} {'RSS MiB':>9s} {'accuracy':>8s}"


def _row(name: str, r: dict) -> str:
    return (f"{name:18s} {r['wall_seconds']:8.2f} {r['updates_per_second']:10.0f} {r['seconds_per_round']:10.4f} "
            f"{r['peak_pss'] / MIB:9.0f} {r['peak_rss'] / MIB:9.0f} {r['final_test_accuracy']:8.4f}")


def _median(runs: list) -> dict:
    """Per-figure median over repeated runs of one side."""
    keys = ["wall_seconds", "updates_per_second", "seconds_per_round", "peak_pss", "peak_rss", "final_test_accuracy"]
    return dict(runs[0], **{k: statistics.median(r[k] for r in runs) for k in keys}, repeats=len(runs))


def run_async_bench(out: Path, repeat: int, baseline: Path | None = None) -> dict:
    """Scheduler throughput (10,000 tasks in flight, tiny model) and async W1 against sync W1;
    with ``baseline``, that checkout's scheduler workload too."""
    runs = {}
    sides = [("scheduler", None)] + ([("scheduler", baseline)] if baseline else []) + [("w1_async", None), ("w1", None)]
    for _ in range(repeat):
        for workload, checkout in sides:
            name = f"{workload}/{'baseline' if checkout else 'raysim'}"
            r = run_raysim(workload, out, checkout)
            runs.setdefault(name, []).append(r)
            print(_row(name, r), flush=True)
    med = {name: _median(rs) for name, rs in runs.items()}
    ratios = {"scheduler_updates_per_second": med["scheduler/raysim"]["updates_per_second"],
              "async_over_sync_w1_wall": med["w1_async/raysim"]["wall_seconds"] / med["w1/raysim"]["wall_seconds"]}
    print(f"scheduler: {ratios['scheduler_updates_per_second']:.0f} applied updates/s with 10,000 in flight "
          f"(target >= 5000)")
    if baseline:
        base = med["scheduler/baseline"]["updates_per_second"]
        ratios["scheduler_over_baseline"] = ratios["scheduler_updates_per_second"] / base
        print(f"scheduler: raysim/baseline applied updates/s {ratios['scheduler_over_baseline']:.2f}x "
              f"(the baseline: {base:.0f}/s on its own scheduler.yaml)")
    print(f"async W1 (2,000 updates, concurrency 100) / sync W1 wall {ratios['async_over_sync_w1_wall']:.2f}x "
          f"(target <= 1.5)")
    return {"runs": runs, "medians": med, "ratios": ratios}


CENTRAL_DP = ("privacy.mechanism=central", "privacy.noise_multiplier=1.0", "privacy.clip_norm=1.0")
COMPRESSION = {"topk_1pct_ef": ("communication.uplink.kind=topk", "communication.uplink.fraction=0.01",
                                "communication.uplink.error_feedback=ef"),
               "qsgd_4": ("communication.uplink.kind=qsgd", "communication.uplink.levels=4"),
               "secagg": ("communication.secure_aggregation.protocol=secagg",)}
PERSONAL_HEAD = ("model.personal=output_layer", "model.personal_state=stateful")
# W1's schedule on the digits' feature shift with FedBN's BatchNorm CNN (W1's MLP has no normalization layers):
# 100 clients (all of them each round), 2 full minibatches a visit (batch statistics: no padded batch)
W1_BN_CNN = ("data.kind=digits", "data.num_clients=100", "data.feature_shift=true", "model.kind=bn_cnn",
             "~model.hidden", "~model.activation", "~algorithm.local_epochs", "algorithm.local_steps=2")
PERSONALIZATION = {"ditto": ("algorithm.name=ditto",), "fedper": ("algorithm.name=fedper", *PERSONAL_HEAD),
                   "fedrep": ("algorithm.name=fedrep", *PERSONAL_HEAD), "local_only": ("algorithm.name=local_only",),
                   "apfl": ("algorithm.name=apfl",), "pfedme": ("algorithm.name=pfedme",),
                   "lg_fedavg": ("algorithm.name=lg_fedavg", "model.personal=input_layer",
                                 "model.personal_state=stateful"),
                   "fedavg_bn_cnn": W1_BN_CNN,
                   "fedbn": (*W1_BN_CNN, "algorithm.name=fedbn", "model.personal=normalization",
                             "model.personal_state=stateful")}
STAGE_BENCHES = {"privacy": {"central_dp": CENTRAL_DP}, "compression": COMPRESSION,
                 "personalization": PERSONALIZATION}  # raysim bench --NAME: W1 with each variant against W1
AGAINST = {"fedbn": "fedavg_bn_cnn"}  # a variant measured against another variant rather than against W1 itself
STAGE_ROUNDS = ("execution.rounds=60",)  # W1's 20 rounds leave the median round at the mercy of a few


def run_stage_bench(out: Path, repeat: int, variants: dict) -> dict:
    """W1 (60 rounds) with each of ``variants`` ({name: overrides}: stages of the update pipeline)
    against W1 itself (or against the variant :data:`AGAINST` names), interleaved ``repeat`` times,
    the order reversed every other time (a run can slow the next one while its processes exit):
    each variant's cost a round and a client update."""
    runs = {}
    sides = [("plain", ())] + list(variants.items())
    for k in range(repeat):
        for side, overrides in sides if k % 2 == 0 else sides[::-1]:
            r = run_raysim("w1", out, overrides=STAGE_ROUNDS + overrides, side=side)
            runs.setdefault(f"w1/{side}", []).append(r)
            print(_row(f"w1/{side}", r), flush=True)
    med = {name: _median(rs) for name, rs in runs.items()}
    ratios = {}
    for side in variants:
        r, against = med[f"w1/{side}"], AGAINST.get(side, "plain")
        plain = med[f"w1/{against}"]
        per_update = (r["seconds_per_round"] - plain["seconds_per_round"]) / 100 * 1e6  # W1: 100 clients a round
        ratios[side] = {"against": against, "wall": r["wall_seconds"] / plain["wall_seconds"],
                        "seconds_per_round": r["seconds_per_round"] / plain["seconds_per_round"],
                        "microseconds_per_update": per_update}
        base = "FedAvg" if against == "plain" else against
        print(f"w1 (60 rounds): {side} / {base} steady seconds per round {ratios[side]['seconds_per_round']:.3f}x "
              f"({per_update:+.0f} µs a client update), wall {ratios[side]['wall']:.3f}x (medians of {repeat})")
    return {"runs": runs, "medians": med, "ratios": ratios}


def run_bench(w2: bool = False, only: str | None = None, out_dir: str = "results/bench", repeat: int = 1,
              asynchronous: bool = False, durability: bool = False, events: int = 1_000_000,
              aggregators: bool = False, scale: bool = False, scale_clients: int = 1_000_000,
              baseline: str | None = None, stages: str | None = None, sweep: bool = False) -> int:
    """Run W1 (and W2) on both sides ``repeat`` times (interleaved), print every run, the medians
    and the ratios of the medians; writes bench.json in ``out_dir``. ``baseline``: a raysim checkout
    run as a third side (and beside the scheduler of ``asynchronous``). ``durability``,
    ``asynchronous``, ``aggregators``, ``scale`` and ``stages`` (a name of :data:`STAGE_BENCHES`)
    run those benchmarks instead; so does ``sweep`` (:mod:`raysim.bench.sweep`)."""
    checkout = Path(baseline).resolve() if baseline else None
    out = Path(out_dir)
    if scale:
        from raysim.bench.scale import check_clients, run_scale_bench

        check_clients(scale_clients)  # bad input: before anything is printed or created
        out.mkdir(parents=True, exist_ok=True)
        print(f"raysim bench --scale on {os.cpu_count()} CPUs; each run in a fresh process")
        (out / "bench_scale.json").write_text(json.dumps(run_scale_bench(out, repeat, scale_clients), indent=2) + "\n")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if sweep:
        from raysim.bench.sweep import run_sweep_bench

        print(f"raysim bench --sweep on {os.cpu_count()} CPUs; each run and each sweep in a fresh process")
        (out / "bench_sweep.json").write_text(json.dumps(run_sweep_bench(out, repeat), indent=2) + "\n")
        return 0
    if aggregators:
        from raysim.bench.aggregators import run_aggregator_bench

        seconds = run_aggregator_bench(repeat=max(repeat, 3))
        (out / "bench_aggregators.json").write_text(json.dumps(seconds, indent=2) + "\n")
        return 0
    if durability:
        from raysim.bench.durability import run_durability_bench

        print(f"raysim bench --durability on {os.cpu_count()} CPUs; each run in a fresh process")
        (out / "bench_durability.json").write_text(json.dumps(run_durability_bench(out, events), indent=2) + "\n")
        return 0
    if stages is not None:
        print(f"raysim bench --{stages} on {os.cpu_count()} CPUs; each run in a fresh process")
        print(HEADER)
        (out / f"bench_{stages}.json").write_text(
            json.dumps(run_stage_bench(out, repeat, STAGE_BENCHES[stages]), indent=2) + "\n")
        return 0
    if asynchronous:
        print(f"raysim bench --async on {os.cpu_count()} CPUs; each run in a fresh process")
        print(HEADER)
        (out / "bench_async.json").write_text(json.dumps(run_async_bench(out, repeat, checkout), indent=2) + "\n")
        return 0
    workloads = ["w1", "w2"] if w2 else ["w1"]
    sides = [s for s in ("bare", "raysim") if only in (None, s)] + (["baseline"] if checkout else [])
    runs = {}
    print(f"raysim bench on {os.cpu_count()} CPUs; each side in a fresh process (wall includes start-up)")
    print(HEADER)
    for _ in range(repeat):  # every repeat runs every workload and side: drift of the machine's speed hits all alike
        for workload in workloads:
            for side in sides:
                r = run_bare(workload, out) if side == "bare" else run_raysim(workload, out,
                                                                              checkout if side == "baseline" else None)
                runs.setdefault(f"{workload}/{side}", []).append(r)
                print(_row(f"{workload}/{side}", r), flush=True)
    results = {name: _median(rs) for name, rs in runs.items()}
    if repeat > 1:
        for name, r in results.items():
            print(_row(f"{name} med", r))
    ratios = {}
    for workload in workloads:
        bare, ray = results.get(f"{workload}/bare"), results.get(f"{workload}/raysim")
        if bare and ray:
            ratios[workload] = {"wall": ray["wall_seconds"] / bare["wall_seconds"],
                                "updates_per_second": ray["updates_per_second"] / bare["updates_per_second"]}
            wall_target, ratio_target, ups_target, memory_target = TARGETS.get(workload, ("", "", "", ""))
            print(f"{workload}: raysim/bare wall {ratios[workload]['wall']:.2f}x{wall_target}, "
                  f"steady updates/s {ratios[workload]['updates_per_second']:.2f}x{ratio_target} "
                  f"= {ray['updates_per_second']:.0f}/s{ups_target}, "
                  f"raysim peak PSS {ray['peak_pss'] / MIB:.0f} MiB{memory_target}")
        base = results.get(f"{workload}/baseline")
        if base and ray:
            ratios[f"{workload}_over_baseline"] = {
                "wall": ray["wall_seconds"] / base["wall_seconds"],
                "updates_per_second": ray["updates_per_second"] / base["updates_per_second"],
                "peak_pss": ray["peak_pss"] / base["peak_pss"]}
            over = ratios[f"{workload}_over_baseline"]
            print(f"{workload}: raysim/baseline wall {over['wall']:.2f}x, steady updates/s "
                  f"{over['updates_per_second']:.2f}x, peak PSS {over['peak_pss']:.2f}x")
    if w2 and "w1/raysim" in results and "w2/raysim" in results:
        growth = results["w2/raysim"]["seconds_per_round"] / results["w1/raysim"]["seconds_per_round"]
        ratios["w2_over_w1_round_time"] = growth
        print(f"raysim per-round time W2/W1 {growth:.2f}x (target <= 1.1)")
    (out / "bench.json").write_text(json.dumps({"runs": runs, "medians": results, "ratios": ratios}, indent=2) + "\n")
    return 0
