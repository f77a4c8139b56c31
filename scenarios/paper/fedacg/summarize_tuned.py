"""The tuned FedACG comparison (scenarios/paper/fedacg/README.md, "Tuned, on the paper's split"),
from the sweep of ``sweep_tuned.yaml``.

    raysim sweep scenarios/paper/fedacg/sweep_tuned.yaml --parallel 2
    python scenarios/paper/fedacg/summarize_tuned.py [results/paper/fedacg_tuned] [--figure docs/paper/fedacg_tuned.png]

Per method, learning-rate decay and hyperparameter value: the final EMA (0.9) test accuracy, mean ±
std over seeds, and the rounds to two absolute targets (70% and 75% EMA accuracy, fixed before the
runs); then each method at its best decay and value (by mean final EMA accuracy), each method's
best value under each decay, and FedACG's sensitivity to λ and β at its best decay (the paper's
Table 5).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from summarize import curves, first_hit, hits_cell, pm

TARGETS = (0.70, 0.75)
HYPER = {"fedprox": "algorithm.prox_mu", "fedavgm": "algorithm.server_momentum", "feddyn": "algorithm.dyn_alpha"}
NAME = {"fedavg": "FedAvg", "fedprox": "FedProx μ", "fedavgm": "FedAvgM β", "fedadam": "FedAdam (η=0.01, τ=1e-3)",
        "feddyn": "FedDyn α", "scaffold": "SCAFFOLD", "fedacg": "FedACG (λ, β)"}
TABLE5 = {"lambda075": (0.75, 0.01), "beta1": (0.85, 1.0)}  # one value off the default (0.85, 0.01)
DECAY = {"balanced": 0.995, "balanced_d998": 0.998, "balanced_d1": 1.0}  # sweep_tuned.yaml's split labels


def setting_of(point: dict, method: str):
    """The point's hyperparameter value (None for the methods that are not tuned)."""
    if method == "fedacg":
        if point.get("table5"):
            return TABLE5[point["table5"]]
        return (point["algorithm.acg_lambda"], point["algorithm.acg_beta"])
    return point.get(HYPER[method]) if method in HYPER else None


def runs(results: Path) -> dict:
    """{(method, decay, value): [(rounds, test accuracy) per completed seed]}."""
    found = {}
    for point in sorted(pq.read_table(results / "sweep.parquet").to_pylist(), key=lambda p: p["seed"]):
        if point["status"] != "completed":
            continue
        method = Path(point["scenario"]).stem
        table = pq.read_table(Path(point["output_dir"]) / "rounds.parquet", columns=["round", "test_accuracy"])
        rnd, acc = (np.array(table.column(c).to_pylist(), dtype=float) for c in ("round", "test_accuracy"))
        found.setdefault((method, DECAY[point["split"]], setting_of(point, method)), []).append((rnd, acc))
    return found


def row(found: dict, key) -> tuple:
    rnd, e = curves(found[key])
    return 100 * e[:, -1], [hits_cell([first_hit(rnd, s, t) for s in e]) for t in TARGETS], (rnd, e)


def label(method: str, value, decay=None) -> str:
    shown = "" if value is None else " = " + (f"({value[0]:g}, {value[1]:g})" if isinstance(value, tuple)
                                               else f"{value:g}")
    return NAME[method] + shown + ("" if decay is None else f", decay {decay:g}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", default="results/paper/fedacg_tuned", help="the sweep's directory")
    parser.add_argument("--figure", default=None, help="write the best runs' curves here (PNG)")
    args = parser.parse_args(argv)
    found = runs(Path(args.results))
    head = " | ".join(f"rounds to {100 * t:.0f}%" for t in TARGETS)
    print(f"### Every point (seeds: {sorted({len(v) for v in found.values()})})\n")
    print(f"| method | final EMA acc. % | {head} |\n|---|---|" + "---|" * len(TARGETS))
    best, by_decay = {}, {}
    for method, decay, value in sorted(found, key=lambda k: (list(NAME).index(k[0]), k[1], str(k[2]))):
        final, hits, curve = row(found, (method, decay, value))
        print(f"| {label(method, value, decay)} | {pm(final)} | {' | '.join(hits)} |")
        if method not in best or final.mean() > best[method][2].mean():
            best[method] = (decay, value, final, hits, curve)
        if (method, decay) not in by_decay or final.mean() > by_decay[method, decay][1].mean():
            by_decay[method, decay] = (value, final)
    print(f"\n### Each method at its best decay and value\n\n| method | final EMA acc. % | {head} |\n|---|---|"
          + "---|" * len(TARGETS))
    for method, (decay, value, final, hits, _) in sorted(best.items(), key=lambda kv: -kv[1][2].mean()):
        print(f"| {label(method, value, decay)} | {pm(final)} | {' | '.join(hits)} |")
    decays = sorted({d for _, d in by_decay}, reverse=True)
    print("\n### Each method's best value under each decay (final EMA acc. %)\n\n| method | "
          + " | ".join(f"decay {d:g}" for d in decays) + " |\n|---|" + "---|" * len(decays))
    for method in best:
        cells = [pm(by_decay[method, d][1]) + ("" if by_decay[method, d][0] is None else
                                               " at " + label(method, by_decay[method, d][0]).split(" = ")[-1])
                 if (method, d) in by_decay else "—" for d in decays]
        print(f"| {NAME[method]} | " + " | ".join(cells) + " |")
    decay = best["fedacg"][0]
    print(f"\n### FedACG's sensitivity at decay {decay:g} (final EMA acc. %, mean over seeds; rows λ, columns β)\n")
    lambdas = sorted({v[0] for m, d, v in found if m == "fedacg" and d == decay})
    betas = sorted({v[1] for m, d, v in found if m == "fedacg" and d == decay})
    print("| λ \\ β | " + " | ".join(f"{b:g}" for b in betas) + " |\n|---|" + "---|" * len(betas))
    for lam in lambdas:
        cells = [f"{row(found, ('fedacg', decay, (lam, b)))[0].mean():.2f}" if ("fedacg", decay, (lam, b)) in found
                 else "—" for b in betas]
        print(f"| {lam:g} | " + " | ".join(cells) + " |")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for method, (decay, value, _, _, (rnd, e)) in best.items():
            ax.plot(rnd, 100 * e.mean(0), label=label(method, value, decay), lw=2 if method == "fedacg" else 1.2)
        ax.set(xlabel="round", ylabel="test accuracy, EMA 0.9 (%)",
               title="blobs, balanced Dir(0.3), 100 clients, 5%: each method tuned")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
