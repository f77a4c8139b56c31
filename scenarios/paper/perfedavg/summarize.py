"""The Per-FedAvg Table 1 reproduction's tables and figure (README.md in this folder), from its sweep.

    raysim sweep scenarios/paper/perfedavg/sweep.yaml --parallel 2
    python scenarios/paper/perfedavg/summarize.py [results/paper/perfedavg] [--figure docs/paper/perfedavg_digits.png]

Prints the Markdown tables of README.md: per cell (row, method), the mean over seeds of the final
personalized accuracy (itself a mean over users), its 95% half-widths over users (the mean of the
runs' own) and over seeds (Student's t), and the number of seeds; and plots that accuracy against
rounds per row. Reads the sweep's sweep.parquet and the completed points' rounds.parquet.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROWS = {  # row label of sweep.yaml -> title
    "r1": "τ=10, α=0.01 (MNIST row 1)",
    "r2": "τ=4, α=0.01 (MNIST row 2; CIFAR-10 row 5)",
    "r3": "τ=10, α=0.001 (CIFAR-10 row 3)",
    "r4": "τ=4, α=0.001 (CIFAR-10 row 4)",
    "r6": "τ=4, α=0.01, diff. hetero. (CIFAR-10 row 6)",
}
LABEL = {"fedavg_update": "FedAvg + update", "fo": "Per-FedAvg (FO)", "hf": "Per-FedAvg (HF)",
         "hvp": "Per-FedAvg (HVP)"}
PAPER = {  # Table 1 (%): FedAvg + update, FO, HF
    "r1": ("MNIST", (75.96, 78.00, 79.85)), "r2": ("MNIST", (60.18, 64.55, 70.94)),
    "r3": ("CIFAR-10", (40.49, 46.98, 50.44)), "r4": ("CIFAR-10", (38.38, 34.04, 43.73)),
    "r6": ("CIFAR-10", (58.59, 37.71, 71.25)),
}
PAPER_ROW5 = (35.97, 25.32, 46.32)  # CIFAR-10, τ=4, α=0.01: the same setting as r2 here


def runs(results: Path) -> dict:
    """{(row, method): [rounds of each completed seed, in seed order]}."""
    found = {}
    for point in sorted(pq.read_table(results / "sweep.parquet").to_pylist(), key=lambda p: p["seed"]):
        if point["status"] == "completed":
            table = pq.read_table(Path(point["output_dir"]) / "rounds.parquet",
                                  columns=["round", "personalized_accuracy_mean", "personalized_accuracy_ci95"])
            found.setdefault((point["row"], point["method"]), []).append(table.to_pandas())
    return found


def cell(seeds: list) -> str:
    """'mean ± half-width over users / ± over seeds (seeds)' of the final rows, in %."""
    from scipy import stats

    if not seeds:
        return "—"
    means = [s["personalized_accuracy_mean"].iloc[-1] for s in seeds]
    halves = [s["personalized_accuracy_ci95"].iloc[-1] for s in seeds]
    m = 100 * np.mean(means)
    if len(means) < 2:
        return f"{m:.1f} ± {100 * np.mean(halves):.1f} / — (1)"
    over_seeds = 100 * stats.t.ppf(0.975, len(means) - 1) * np.std(means, ddof=1) / math.sqrt(len(means))
    return f"{m:.1f} ± {100 * np.mean(halves):.1f} / ± {over_seeds:.1f} ({len(means)})"


def plot(found: dict, figure: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ROWS), figsize=(4 * len(ROWS), 3.4), sharey=True)
    for ax, (row, title) in zip(axes, ROWS.items()):
        for method in LABEL:
            curves = [s.dropna().set_index("round")["personalized_accuracy_mean"] for s in found.get((row, method), [])]
            if curves:
                mean = sum(curves) / len(curves)
                ax.plot(mean.index, 100 * mean.values, label=LABEL[method])
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("round")
    axes[0].set_ylabel("accuracy after one step (%), mean over users")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(figure, dpi=120)
    print(f"wrote {figure}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="results/paper/perfedavg", help="the sweep's directory")
    parser.add_argument("--figure", help="write the figure here (PNG)")
    args = parser.parse_args(argv)
    found = runs(Path(args.results))
    print("| row | " + " | ".join(LABEL.values()) + " |")
    print("|---|" + "---|" * len(LABEL))
    for row, title in ROWS.items():
        print(f"| {title} | " + " | ".join(cell(found.get((row, m), [])) for m in LABEL) + " |")
    print("\nThe paper's Table 1 (%), FedAvg + update / FO / HF:")
    for row, (data, values) in PAPER.items():
        print(f"| {ROWS[row]} | {data} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    print("| (CIFAR-10 row 5, τ=4, α=0.01) | CIFAR-10 | " + " | ".join(f"{v:.2f}" for v in PAPER_ROW5) + " |")
    if args.figure:
        plot(found, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
