"""The robustness study's tables and heat map (README.md in this folder), from its sweep.

    raysim sweep scenarios/byzantine/sweep.yaml --parallel 2
    python scenarios/byzantine/summarize.py [results/byzantine] [--figure docs/byzantine_heatmap.png]

Prints one Markdown table of final test accuracy per data set and mode (a scenario file of the
sweep; rows: attacks; columns: aggregators, without and with bucketing; a run that stopped on a
non-finite model counts as 0) and draws the heat map of accuracy minus the clean run's. Reads the
sweep's sweep.parquet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

SCENARIOS = {"digits.yaml": ("digits", "sync"), "digits_fedbuff.yaml": ("digits", "fedbuff"),
             "gaussian_mixture.yaml": ("gaussian_mixture", "sync"),
             "gaussian_mixture_fedbuff.yaml": ("gaussian_mixture", "fedbuff")}  # file -> (data set, mode)
ATTACKS = ("sign_flip", "gaussian", "label_flip", "alie", "ipm")
RULES = ("median", "trimmed_mean", "krum", "geometric_median", "centered_clipping")
AGGREGATORS = {"mean": "mean", **{rule: rule for rule in RULES},
               **{f"{rule}_s2": f"{rule} s=2" for rule in RULES}}  # label -> column title


def grids(results: Path) -> dict:
    """{(data set, mode): {(attack, aggregator): final accuracy or None}}, in the order of SCENARIOS."""
    found = {SCENARIOS[file]: {} for file in SCENARIOS}
    for point in pq.read_table(results / "sweep.parquet").to_pylist():
        completed = point["status"] == "completed"  # else it stopped on a non-finite model: 0
        found[SCENARIOS[point["scenario"]]][point["attack"], point["aggregator"]] = \
            point["final_test_accuracy"] if completed else 0.0
    return {key: cells for key, cells in found.items() if cells}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="results/byzantine", help="the sweep's directory")
    parser.add_argument("--figure", help="write the heat map here (PNG)")
    args = parser.parse_args(argv)
    found = grids(Path(args.results))
    show = lambda v: "–" if v is None else f"{100 * v:.1f}"
    for (data, mode), cells in found.items():
        clean = cells.get(("clean", "mean"))
        print(f"\n**{data}, {mode}** (clean run, plain mean: {show(clean)})\n")
        print("| attack | " + " | ".join(AGGREGATORS.values()) + " |")
        print("|---|" + "---|" * len(AGGREGATORS))
        for attack in ATTACKS:
            print(f"| {attack} | " + " | ".join(show(cells.get((attack, label))) for label in AGGREGATORS) + " |")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(found), 1, figsize=(12, 2.9 * len(found)), squeeze=False)
        for ax, ((data, mode), cells) in zip(axes[:, 0], found.items()):
            clean = cells.get(("clean", "mean")) or np.nan
            drop = np.array([[100 * ((cells.get((a, label)) if cells.get((a, label)) is not None else np.nan) - clean)
                              for label in AGGREGATORS] for a in ATTACKS])
            image = ax.imshow(drop, cmap="RdYlGn", vmin=-30, vmax=5, aspect="auto")
            ax.set_xticks(range(len(AGGREGATORS)), list(AGGREGATORS.values()), fontsize=7, rotation=25, ha="right")
            ax.set_yticks(range(len(ATTACKS)), list(ATTACKS), fontsize=8)
            for (i, j), value in np.ndenumerate(drop):
                ax.text(j, i, "" if np.isnan(value) else f"{value:.0f}", ha="center", va="center", fontsize=7)
            ax.set_title(f"{data}, {mode}: accuracy − clean (points)", fontsize=9)
            fig.colorbar(image, ax=ax)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
        print(f"\nwrote {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
