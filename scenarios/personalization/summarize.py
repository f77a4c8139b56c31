"""The personalization benchmark's tables and figure (scenarios/personalization/README.md), from its sweep.

    raysim sweep scenarios/personalization/sweep.yaml --parallel 2
    python scenarios/personalization/summarize.py [results/personalization] [--figure docs/personalization_study.png]

Per data set and method, over the seeds (mean ± std), at the last evaluation: the personalized
accuracy of the training clients (mean over clients, the worst decile of clients, the spread
across clients), the accuracy of the held-out new clients after their adaptation, the global
model's accuracy where the method has one (the whole model is shared), and the virtual time
until the personalized accuracy first reaches 90% of FedAvg + fine-tuning's final one of the same
seed and model (a target fixed by that rule before the sweep ran, not picked from the results).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from raysim.report.tables import mean_std

DATA_SETS = {"pathological": "digits, 2 label shards a client", "dirichlet": "digits, Dirichlet(0.3) label skew",
             "feature_shift": "digits, feature shift (IID labels)", "leaf_synthetic": "leaf_synthetic(1, 1)"}
METHODS = {"fedavg": "FedAvg + fine-tuning", "local_only": "local only", "ditto": "Ditto", "fedrep": "FedRep",
           "fedper": "FedPer", "lg_fedavg": "LG-FedAvg", "apfl": "APFL", "pfedme": "pFedMe",
           "perfedavg": "Per-FedAvg (FO)", "ffgg": "Local FFGG", "fedavg_bn_cnn": "FedAvg + fine-tuning, BatchNorm CNN",
           "fedbn": "FedBN, BatchNorm CNN"}
SHARED_MODEL = {"fedavg", "ditto", "apfl", "pfedme", "perfedavg", "fedavg_bn_cnn"}  # a whole global model to deploy
REFERENCE = {"fedbn": "fedavg_bn_cnn", "fedavg_bn_cnn": "fedavg_bn_cnn"}  # the time target's run (else fedavg's)
TARGET_SHARE = 0.9  # of the reference's final personalized accuracy


def load(results: Path) -> dict:
    """{(data set, method): {seed: run}}, each run its curve and last evaluation."""
    runs = {}
    for point in pq.read_table(results / "sweep.parquet").to_pylist():
        if point["status"] != "completed":
            print(f"warning: {point['data_set']} {point['method']} seed {point['seed']}: {point['status']}",
                  file=sys.stderr)
            continue
        out = results / Path(point["output_dir"]).name  # the sweep's directory may have moved since it ran
        rounds = pq.read_table(out / "rounds.parquet").to_pandas()
        rounds = rounds[rounds.personalized_accuracy.notna()]
        last = rounds.iloc[-1]
        runs.setdefault((point["data_set"], point["method"]), {})[point["seed"]] = {
            "time": rounds.virtual_time.to_numpy(), "personalized": 100 * rounds.personalized_accuracy.to_numpy(),
            "mean": 100 * last.personalized_accuracy, "p10": 100 * last.personalized_accuracy_p10,
            "spread": 100 * last.personalized_accuracy_std, "new": 100 * last.new_client_personalized_accuracy,
            "global": 100 * last.test_accuracy}
    return runs


def time_to(run: dict, target: float):
    """Virtual seconds until the personalized accuracy first reaches ``target`` (None: never)."""
    hit = np.flatnonzero(run["personalized"] >= target - 1e-9)
    return float(run["time"][hit[0]]) if len(hit) else None


def table(runs: dict) -> list:
    lines = []
    for data_set, name in DATA_SETS.items():
        if not any((data_set, m) in runs for m in METHODS):
            continue
        lines += [f"**{name}**", "", "| method | personalized accuracy % | worst decile % | spread across clients "
                  "(std) | new clients % | global model % | virtual s to 90% of FedAvg + FT's final accuracy (same "
                  "model) |",
                  "|---|---|---|---|---|---|---|"]
        for method, label in METHODS.items():
            seeds = runs.get((data_set, method), {})
            if not seeds:
                continue
            reference = runs.get((data_set, REFERENCE.get(method, "fedavg")), {})
            times = [time_to(run, TARGET_SHARE * reference[s]["mean"]) for s, run in seeds.items() if s in reference]
            missed = sum(t is None for t in times)
            row = [label, mean_std([r["mean"] for r in seeds.values()]), mean_std([r["p10"] for r in seeds.values()]),
                   mean_std([r["spread"] for r in seeds.values()]), mean_std([r["new"] for r in seeds.values()]),
                   mean_std([r["global"] for r in seeds.values()]) if method in SHARED_MODEL else "—",
                   mean_std(times, 0) + (f" ({missed} of {len(times)} never)" if missed else "")]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return lines


def figure(runs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [m for m in METHODS if any((d, m) in runs for d in DATA_SETS)]
    fig, axes = plt.subplots(1, len(DATA_SETS), figsize=(15, 4.6), sharey=True)
    x = np.arange(len(present))
    for ax, (data_set, name) in zip(axes, DATA_SETS.items()):
        for offset, (key, label, color) in zip((-0.2, 0.2), (("mean", "mean over clients", "tab:blue"),
                                                             ("new", "new clients", "tab:orange"))):
            values = [np.mean([r[key] for r in runs.get((data_set, m), {}).values()] or [np.nan]) for m in present]
            ax.bar(x + offset, values, width=0.4, color=color, label=label)
        p10 = [np.mean([r["p10"] for r in runs.get((data_set, m), {}).values()] or [np.nan]) for m in present]
        ax.plot(x - 0.2, p10, "k_", markersize=12, label="worst decile")
        ax.set_xticks(x, [METHODS[m] for m in present], rotation=60, ha="right", fontsize=8)
        ax.set(title=name, ylim=(0, 100))
        ax.axvline(len(present) - 2.5, color="gray", linewidth=0.6, linestyle=":")  # the BatchNorm CNN's runs
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("personalized accuracy % (3 seeds)")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("Personalization benchmark: 40 training clients (10 a round, 100 rounds), 10 held-out new clients")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="results/personalization")
    parser.add_argument("--figure")
    args = parser.parse_args()
    runs = load(Path(args.results))
    print("\n".join(table(runs)))
    if args.figure:
        figure(runs, args.figure)


if __name__ == "__main__":
    main()
