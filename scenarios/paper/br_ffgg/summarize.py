"""The BR-FFGG experiment's table and figure (README.md in this folder), from its sweep.

    raysim sweep scenarios/paper/br_ffgg/sweep.yaml
    python scenarios/paper/br_ffgg/summarize.py [results/paper/br_ffgg] [--figure docs/paper/br_ffgg.png]

Prints the README's table (final rel_error = ‖θ − θ*‖² / ‖θ₀ − θ*‖², median over seeds and the
largest; a run that stopped on a non-finite model counts as diverged) and plots rel_error against
rounds, one panel per attack. Reads the sweep's sweep.parquet and each point's run directory.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ATTACKS = ("sign_flip", "gaussian", "nan", "alie", "ipm")
AGGREGATORS = {"mean": "mean", "krum_s2": "bucketing ∘ Krum", "geometric_median_s2": "bucketing ∘ geometric median",
               "median_s2": "bucketing ∘ median", "centered_clipping": "centered clipping"}  # label -> title
CLEAN = ("clean", "mean")  # no Byzantine client, plain mean


def curve(run: Path) -> list | None:
    """rel_error per round of a run that ended (None if it did not run; inf past a divergence)."""
    if not (run / "summary.json").exists():
        return None
    status = json.loads((run / "summary.json").read_text())["status"]
    errors = pq.read_table(run / "rounds.parquet", columns=["rel_error"]).column("rel_error").to_pylist()
    errors = [math.inf if e is None or not math.isfinite(e) else e for e in errors]
    return errors if status == "completed" else errors + [math.inf]


def curves(results: Path) -> dict:
    """{(attack, aggregator): [rel_error curves, in seed order]}."""
    found = {}
    for point in sorted(pq.read_table(results / "sweep.parquet").to_pylist(), key=lambda p: p["seed"]):
        errors = curve(Path(point["output_dir"]))
        if errors is not None:
            found.setdefault((point["attack"], point["aggregator"]), []).append(errors)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="results/paper/br_ffgg", help="the sweep's directory")
    parser.add_argument("--figure", help="write the plot here (PNG)")
    args = parser.parse_args(argv)
    found = curves(Path(args.results))
    show = lambda v: "diverged" if math.isinf(v) else f"{v:.1e}"
    clean = [c[-1] for c in found.get(CLEAN, [])]
    if clean:
        print(f"Clean (no Byzantine client, mean): median {show(float(np.median(clean)))} over {len(clean)} seeds\n")
    print("| attack | " + " | ".join(AGGREGATORS.values()) + " |")
    print("|---|" + "---|" * len(AGGREGATORS))
    for attack in ATTACKS:
        cells = []
        for label in AGGREGATORS:
            finals = [c[-1] for c in found.get((attack, label), [])]
            cells.append(f"{show(float(np.median(finals)))} (max {show(max(finals))}, {len(finals)})" if finals
                         else "–")
        print(f"| {attack} | " + " | ".join(cells) + " |")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(ATTACKS), figsize=(4 * len(ATTACKS), 3.6), sharey=True)
        for ax, attack in zip(axes, ATTACKS):
            for label, title in AGGREGATORS.items():
                seeds = found.get((attack, label))
                if seeds:
                    ax.semilogy(np.arange(1, len(seeds[0]) + 1), np.minimum(seeds[0], 1e6), label=title)
            if CLEAN in found:
                ax.semilogy(np.arange(1, len(found[CLEAN][0]) + 1), found[CLEAN][0], "k:", label="clean, mean")
            ax.set_title(attack)
            ax.set_xlabel("round")
            ax.set_ylim(1e-6, 1e6)
        axes[0].set_ylabel("‖θ − θ*‖² / ‖θ₀ − θ*‖² (seed 0)")
        axes[-1].legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
        print(f"\nwrote {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
