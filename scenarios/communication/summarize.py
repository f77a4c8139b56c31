"""The communication study's table and figure (scenarios/communication/README.md), from its sweep.

    raysim sweep scenarios/communication/sweep.yaml --parallel 2
    python scenarios/communication/summarize.py [results/communication] [--figure docs/communication_study.png]

Per uplink encoding (the sweep's `method` labels), over the seeds: the final test accuracy (mean ± std),
the accuracy minus the uncompressed run's of the same seed, the megabytes all clients upload per round,
one upload's kilobytes, the mean virtual round time and the share of it that is upload time, and the
virtual time (and rounds) until the test accuracy first reaches a target. The targets were fixed before
the sweep ran: 90% (and, stricter, 97%) of the final accuracy of the uncompressed run of the same seed.
The figure has three panels: accuracy against rounds, against megabytes uploaded and against virtual
time (the seeds' mean at each round; the time axis is the seeds' mean virtual time at that round).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from raysim.report.tables import mean_std

METHODS = ["none", "fp16", "bf16", "qsgd_s2", "qsgd_s4", "qsgd_s16", "topk_10", "topk_10_ef", "topk_1",
           "topk_1_ef", "topk_1_ef21", "sign", "sign_ef", "secagg"]
LABELS = {"none": "none (float32)", "fp16": "fp16", "bf16": "bf16", "qsgd_s2": "QSGD s = 2",
          "qsgd_s4": "QSGD s = 4", "qsgd_s16": "QSGD s = 16", "topk_10": "top-k 10%", "topk_10_ef": "top-k 10% + EF",
          "topk_1": "top-k 1%", "topk_1_ef": "top-k 1% + EF", "sign": "scaled sign", "sign_ef": "scaled sign + EF",
          "topk_1_ef21": "top-k 1% + EF21", "secagg": "secure aggregation (32-bit field)"}
TARGETS = (0.90, 0.97)  # of the same seed's uncompressed final accuracy; fixed before the sweep ran


def upload_share(events) -> float:
    """Mean over rounds of the share of the round's virtual time that is upload time: 1 − D₀/D, D the
    round's duration (its slowest task, all of them waited for) and D₀ what it would have been had every
    upload been free (each task less bytes_up ÷ its uplink bandwidth)."""
    up = events["bytes_up"] * 8 / (events["up_mbps"] * 1e6)
    events = events.assign(duration=events["virtual_end"] - events["virtual_start"], up=up)
    events = events.assign(free=events["duration"] - events["up"])
    per_round = events.groupby("round").agg(d=("duration", "max"), d0=("free", "max"))
    return float((1 - per_round["d0"] / per_round["d"]).mean())


def load(results: Path) -> dict:
    """{method: {seed: run}}, each run its curve (rounds, accuracy, MB uploaded, virtual time) and figures."""
    runs = {}
    for point in pq.read_table(results / "sweep.parquet").to_pylist():
        if point["status"] != "completed":
            print(f"warning: {point['method']} seed {point['seed']}: {point['status']}", file=sys.stderr)
            continue
        out = results / Path(point["output_dir"]).name  # the sweep's directory may have moved since it ran
        summary = json.loads((out / "summary.json").read_text())
        rounds = pq.read_table(out / "rounds.parquet", columns=["round", "virtual_time", "test_accuracy",
                                                                "total_bytes_up"]).to_pandas()
        rounds = rounds.dropna(subset=["test_accuracy"])
        events = pq.read_table(out / "events.parquet", columns=["round", "virtual_start", "virtual_end", "bytes_up",
                                                                "up_mbps", "status"]).to_pandas()
        events = events[events["status"] == "applied"]
        n_rounds = summary["rounds"]
        runs.setdefault(point["method"], {})[point["seed"]] = {
            "round": rounds["round"].to_numpy(), "accuracy": 100 * rounds["test_accuracy"].to_numpy(),
            "mb_up": rounds["total_bytes_up"].to_numpy() / 1e6, "time": rounds["virtual_time"].to_numpy(),
            "final": 100 * summary["final_test_accuracy"], "mb_per_round": summary["bytes_up"] / 1e6 / n_rounds,
            "kb_per_upload": events["bytes_up"].mean() / 1e3, "round_time": summary["virtual_time"] / n_rounds,
            "upload_share": upload_share(events)}
    return runs


def first_reach(run: dict, target: float) -> tuple[float, float, float]:
    """(virtual time, round, MB uploaded so far) of the first evaluation at or above ``target`` (%), nans if none."""
    hit = np.flatnonzero(run["accuracy"] >= target)
    if not len(hit):
        return math.nan, math.nan, math.nan
    return float(run["time"][hit[0]]), float(run["round"][hit[0]]), float(run["mb_up"][hit[0]])


def to_target(runs: dict, base: dict, share: float) -> tuple[str, str, str]:
    """Virtual seconds, rounds and MB uploaded to ``share`` of the same seed's uncompressed final accuracy,
    as mean ± std over the seeds that reached it (with a count when some did not)."""
    hits = [first_reach(run, share * base[seed]["final"]) for seed, run in sorted(runs.items())]
    reached = [h for h in hits if not math.isnan(h[0])]
    if not reached:
        return "not reached", "—", "—"
    note = "" if len(reached) == len(hits) else f" ({len(reached)}/{len(hits)} seeds)"
    return mean_std([h[0] for h in reached], 0) + note, mean_std([h[1] for h in reached], 0), mean_std([h[2] for h in reached], 1)


def time_ratio(runs: dict, base: dict, share: float) -> str:
    """Virtual time to ``share`` of the same seed's uncompressed final accuracy, divided by the
    uncompressed run's own, per seed (the seeds' devices and networks differ more than the methods)."""
    ratios = []
    for seed, run in sorted(runs.items()):
        target = share * base[seed]["final"]
        mine, theirs = first_reach(run, target)[0], first_reach(base[seed], target)[0]
        if not (math.isnan(mine) or math.isnan(theirs)):
            ratios.append(mine / theirs)
    return mean_std(ratios, 2) if ratios else "—"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", default="results/communication", help="the sweep's directory")
    parser.add_argument("--figure", default=None, help="write the three-panel figure here (PNG)")
    args = parser.parse_args(argv)
    found = load(Path(args.results))
    base = found["none"]
    methods = [m for m in METHODS if m in found] + sorted(set(found) - set(METHODS))
    seeds = sorted({len(v) for v in found.values()})
    print(f"### Uplink encodings (seeds per method: {seeds}; targets: {TARGETS[0]:.0%} and {TARGETS[1]:.0%} of the "
          "same seed's uncompressed final accuracy)\n")
    print("| uplink | final test accuracy % | − uncompressed (same seed), points | kB per upload | MB up per round "
          "| mean virtual round s | upload share of round time | virtual s to 90% target | ÷ uncompressed "
          "(same seed) | rounds to 90% | MB up to 90% | virtual s to 97% target | ÷ uncompressed | rounds to 97% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in methods:
        runs = found[m]
        gap = [runs[s]["final"] - base[s]["final"] for s in sorted(runs) if s in base]
        t90, r90, mb90 = to_target(runs, base, TARGETS[0])
        t97, r97, _ = to_target(runs, base, TARGETS[1])
        first = next(iter(runs.values()))
        print(f"| {LABELS.get(m, m)} | {mean_std([r['final'] for r in runs.values()])} | "
              f"{'—' if m == 'none' else mean_std(gap)} | {first['kb_per_upload']:.1f} | {first['mb_per_round']:.2f} | "
              f"{mean_std([r['round_time'] for r in runs.values()], 2)} | "
              f"{100 * np.mean([r['upload_share'] for r in runs.values()]):.0f}% | {t90} | "
              f"{time_ratio(runs, base, TARGETS[0])} | {r90} | {mb90} | {t97} | "
              f"{time_ratio(runs, base, TARGETS[1])} | {r97} |")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        colors = {"none": "black", "fp16": "tab:gray", "bf16": "tab:brown", "qsgd_s2": "tab:purple",
                  "qsgd_s4": "tab:pink", "qsgd_s16": "tab:olive", "topk_10": "tab:blue", "topk_10_ef": "tab:blue",
                  "topk_1": "tab:red", "topk_1_ef": "tab:red", "topk_1_ef21": "tab:red", "sign": "tab:green",
                  "sign_ef": "tab:green", "secagg": "tab:orange"}
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), sharey=True)
        for m in methods:
            runs = list(found[m].values())
            n = min(len(r["accuracy"]) for r in runs)
            acc = np.mean([r["accuracy"][:n] for r in runs], axis=0)
            style = dict(color=colors.get(m), linestyle="--" if m.endswith("_ef") else ":" if m in ("bf16", "topk_1_ef21")
                         else "-",
                         linewidth=1.3,
                         label=LABELS.get(m, m))
            axes[0].plot(runs[0]["round"][:n], acc, **style)
            axes[1].plot(np.mean([r["mb_up"][:n] for r in runs], axis=0), acc, **style)
            axes[2].plot(np.mean([r["time"][:n] for r in runs], axis=0), acc, **style)
        axes[0].set(xlabel="round", ylabel="test accuracy % (mean over seeds)", title="accuracy against rounds")
        axes[1].set(xscale="log", xlabel="MB uploaded, all clients (log)", title="against bytes uploaded")
        axes[2].set(xlabel="virtual time s (wait for all 20 clients)", title="against virtual time")
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.set_ylim(40, 100)
        axes[0].legend(fontsize=8, ncol=2, loc="lower right")
        fig.suptitle("FedAvg on digits (20 clients, all in every round, MLP P = 50,826), uplink compression "
                     "and secure aggregation; dashed: error feedback, dotted red: EF21")
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
    return 0 if all(not math.isnan(r["final"]) for runs in found.values() for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
