"""The selection study's table and figure (scenarios/selection/README.md), from its sweep.

    raysim sweep scenarios/selection/sweep.yaml --parallel 2
    python scenarios/selection/summarize.py [results/selection] [--figure docs/selection_study.png]

Per straggler scenario and selection policy, over the seeds: the final test accuracy (mean ± std),
the mean virtual round time, the updates lost to the deadline, and the virtual time until the test
accuracy first reaches each target (fixed before the sweep ran: 60% and 65%), with the speed-up
over uniform selection of the same seed (uniform's time ÷ the policy's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from raysim.report.tables import mean_std

SCENARIOS = {"../stragglers/sync_wait_all.yaml": "wait for all", "../stragglers/sync_deadline.yaml": "30 s deadline"}
POLICIES = ["uniform", "power_of_choice", "oort"]
TARGETS = (0.60, 0.65)  # test accuracy; fixed before the sweep ran


def load(results: Path) -> dict:
    """{(scenario, policy): {seed: run}}, each run its curve and figures."""
    runs = {}
    for point in pq.read_table(results / "sweep.parquet").to_pylist():
        if point["status"] != "completed":
            print(f"warning: {point['scenario']} {point['selection']} seed {point['seed']}: {point['status']}",
                  file=sys.stderr)
            continue
        out = results / Path(point["output_dir"]).name  # the sweep's directory may have moved since it ran
        rounds = pq.read_table(out / "rounds.parquet").to_pandas()
        rounds = rounds[rounds.test_accuracy.notna()]
        summary = json.loads((out / "summary.json").read_text())
        reach = {}
        for target in TARGETS:
            hit = rounds[rounds.test_accuracy >= target]
            reach[target] = float(hit.virtual_time.iloc[0]) if len(hit) else None
        runs.setdefault((point["scenario"], point["selection"]), {})[point["seed"]] = {
            "time": rounds.virtual_time.to_numpy(), "accuracy": 100 * rounds.test_accuracy.to_numpy(),
            "final": 100 * summary["final_test_accuracy"], "round_s": float(np.diff(rounds.virtual_time,
                                                                                     prepend=0).mean()),
            "late": summary["tasks"].get("late", 0), "reach": reach}
    return runs


def table(runs: dict) -> list:
    lines = []
    for scenario, name in SCENARIOS.items():
        lines += [f"**{name}**", "", "| selection | final test accuracy % | mean virtual round s | late updates | "
                  + " | ".join(f"virtual s to {t:.0%} | speed-up over uniform" for t in TARGETS) + " |",
                  "|---|---|---|---|" + "---|---|" * len(TARGETS)]
        uniform = runs.get((scenario, "uniform"), {})
        for policy in POLICIES:
            seeds = runs.get((scenario, policy), {})
            if not seeds:
                continue
            row = [policy, mean_std([r["final"] for r in seeds.values()]), mean_std([r["round_s"] for r in seeds.values()]),
                   mean_std([r["late"] for r in seeds.values()], 0)]
            for t in TARGETS:
                times = [r["reach"][t] for r in seeds.values() if r["reach"][t] is not None]
                ratios = [uniform[s]["reach"][t] / r["reach"][t] for s, r in seeds.items()
                          if r["reach"][t] and s in uniform and uniform[s]["reach"][t]]
                missed = len(seeds) - len(times)
                row += [mean_std(times, 0) + (f" ({missed} not reached)" if missed else ""), mean_std(ratios, 2)]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return lines


def figure(runs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"uniform": "black", "power_of_choice": "tab:blue", "oort": "tab:red"}
    fig, axes = plt.subplots(1, len(SCENARIOS), figsize=(12, 4.2), sharey=True)
    for ax, (scenario, name) in zip(axes, SCENARIOS.items()):
        for policy in POLICIES:
            for i, run in enumerate(runs.get((scenario, policy), {}).values()):
                ax.plot(run["time"], run["accuracy"], color=colors[policy], linewidth=1, alpha=0.8,
                        label=policy if i == 0 else None)
        for t in TARGETS:
            ax.axhline(100 * t, color="gray", linewidth=0.6, linestyle=":")
        ax.set(xlabel="virtual time s", title=f"straggler scenario, {name}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy % (each seed)")
    axes[0].legend()
    fig.suptitle("Client selection on 1,000 heterogeneous clients (20 a round), 3 seeds each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="results/selection")
    parser.add_argument("--figure")
    args = parser.parse_args()
    runs = load(Path(args.results))
    print("\n".join(table(runs)))
    if args.figure:
        figure(runs, args.figure)


if __name__ == "__main__":
    main()
