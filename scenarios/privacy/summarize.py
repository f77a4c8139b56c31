"""The privacy-utility study's tables and figure (scenarios/privacy/README.md), from its sweep.

    raysim sweep scenarios/privacy/sweep.yaml --parallel 2
    python scenarios/privacy/summarize.py [results/privacy] [--figure docs/privacy_utility.png]

Per point (study, ε target, clients per round): the final test accuracy (mean ± std over seeds),
the noise multiplier the calibration chose, the ε the run spent (its most exposed client's) and,
for the runs with adaptive clipping, the clip norm the clients ended with.
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


def points(results: Path) -> dict:
    """{(study, ε target or None, clients per round): [per seed: final accuracy, z, ε spent, last clip norm]}."""
    found = {}
    for point in pq.read_table(results / "sweep.parquet").to_pylist():
        if point["status"] != "completed":
            continue
        out = Path(point["output_dir"])
        summary = json.loads((out / "summary.json").read_text())
        privacy = summary.get("privacy") or {}
        clip = None
        if point["study"] == "adaptive":
            events = pq.read_table(out / "events.parquet", columns=["round", "clip_norm"]).to_pandas().dropna()
            clip = float(events[events["round"] == events["round"].max()]["clip_norm"].iloc[0])
        target = point.get("privacy.target_epsilon")
        if point["study"] not in ("nonprivate",) and target is None:
            target = 4.0  # the base scenario's
        m = point.get("execution.clients_per_round") or 100
        found.setdefault((point["study"], None if point["study"] == "nonprivate" else target, m), []).append(
            {"accuracy": 100 * summary["final_test_accuracy"], "z": privacy.get("noise_multiplier"),
             "epsilon": privacy.get("final_epsilon"), "clip": clip, "seed": point["seed"]})
    return found


def row(label: str, runs: list, plain: list | None = None) -> str:
    """A table row; ``plain``: the non-private runs of the same clients per round, for the gap to
    them, seed by seed (the seeds differ far more than the mechanisms do)."""
    z = [r["z"] for r in runs if r["z"] is not None]
    eps = [r["epsilon"] for r in runs if r["epsilon"] is not None]
    clips = [r["clip"] for r in runs if r["clip"] is not None]
    return (f"| {label} | {mean_std([r['accuracy'] for r in runs], 2)} | {np.mean(z):.3f} |" if z else
            f"| {label} | {mean_std([r['accuracy'] for r in runs], 2)} | — |") + \
        (f" {mean_std(eps, 3)} |" if eps else " ∞ |") + (f" {mean_std(clips, 3)} |" if clips else " — |") + \
        (f" {mean_std(gap(runs, plain), 2)} |" if plain is not None else " — |")


def gap(runs: list, plain: list) -> list:
    """Accuracy minus the non-private run's of the same seed, per seed."""
    base = {r["seed"]: r["accuracy"] for r in plain}
    return [r["accuracy"] - base[r["seed"]] for r in runs]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", default="results/privacy", help="the sweep's directory")
    parser.add_argument("--figure", default=None, help="write accuracy against ε here (PNG)")
    args = parser.parse_args(argv)
    found = points(Path(args.results))
    head = ("| run | final test accuracy % | noise multiplier z | ε spent (δ = 1e-5) | final clip norm | "
            "− no privacy (same seed) |\n|---|---|---|---|---|---|")
    seeds = sorted({len(v) for v in found.values()})
    print(f"### Accuracy against ε (central DP, 100 clients a round; seeds per point: {seeds})\n\n{head}")
    plain = {m: found[("nonprivate", None, m)] for m in (25, 50, 100, 200)}
    print(row("no privacy", plain[100]))
    for key in sorted(k for k in found if k[0] == "epsilon"):
        print(row(f"ε = {key[1]:g}", found[key], plain[100]))
    print(f"\n### Clients per round at ε = 4 (central DP) and without privacy\n\n{head}")
    for m in (25, 50, 100, 200):
        dp = found.get(("clients", 4.0, m)) or found.get(("epsilon", 4.0, m))
        print(row(f"{m} a round, ε = 4", dp, plain[m]))
        print(row(f"{m} a round, no privacy", plain[m]))
    print(f"\n### Fixed against adaptive clipping (central DP, 100 a round)\n\n{head}")
    for eps in (2.0, 4.0):
        print(row(f"ε = {eps:g}, fixed clip 0.5", found[("epsilon", eps, 100)], plain[100]))
        print(row(f"ε = {eps:g}, adaptive (median)", found[("adaptive", eps, 100)], plain[100]))
    print(f"\n### Central against local DP (100 a round)\n\n{head}")
    for key in sorted(k for k in found if k[0] == "local"):
        print(row(f"local, target ε = {key[1]:g}", found[key], plain[100]))
    print(row("central, ε = 8", found[("epsilon", 8.0, 100)], plain[100]))
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        studies = (("epsilon", "central, fixed clip", "o"), ("adaptive", "central, adaptive clip", "s"),
                   ("local", "local DP", "^"))
        for study, label, marker in studies:
            keys = sorted(k for k in found if k[0] == study and k[2] == 100)
            spent = [np.mean([r["epsilon"] for r in found[k]]) for k in keys]
            acc = [[r["accuracy"] for r in found[k]] for k in keys]
            left.errorbar(spent, [np.mean(a) for a in acc], yerr=[np.std(a, ddof=1) for a in acc], marker=marker,
                          capsize=3, label=label)
        base = [r["accuracy"] for r in found[("nonprivate", None, 100)]]
        left.axhline(np.mean(base), color="black", linestyle="--", label="no privacy")
        left.set(xscale="log", xlabel="ε spent (δ = 1e-5, the most exposed client's)", ylabel="final test accuracy %",
                 title="1,000 clients, 100 a round, 100 rounds")
        left.legend(fontsize=8)
        ms = [25, 50, 100, 200]
        gaps = [gap(found.get(("clients", 4.0, m)) or found[("epsilon", 4.0, m)], found[("nonprivate", None, m)])
                for m in ms]
        right.errorbar(ms, [np.mean(g) for g in gaps], yerr=[np.std(g, ddof=1) for g in gaps], marker="o", capsize=3,
                       label="central DP, ε = 4")
        right.axhline(0, color="black", linestyle="--", label="no privacy")
        right.set(xscale="log", xlabel="expected clients per round",
                  ylabel="accuracy − no privacy, same seed (points)", title="More clients a round at the same ε")
        right.set_xticks(ms, [str(m) for m in ms])
        right.set_xticks([], minor=True)
        right.legend(fontsize=8)
        for ax in (left, right):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
    return 0 if not any(math.isnan(r["accuracy"]) for runs in found.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
