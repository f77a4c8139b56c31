"""The FedACG reproduction's tables and figures beyond the tuned main comparison
(scenarios/paper/fedacg/README.md), from the sweep of ``sweep.yaml``; the helpers here serve
``summarize_tuned.py`` too.

    raysim sweep scenarios/paper/fedacg/sweep.yaml --parallel 2
    python scenarios/paper/fedacg/summarize.py [results/paper/fedacg] [--figures docs/paper]

Reads the sweep's sweep.parquet and each completed point's ``rounds.parquet``, computes the EMA
(factor 0.9) of the test accuracy, and prints, per setting (Dir(0.6), iid, digits, 500 clients),
every method at every value of its grid and at its best value (by mean final EMA accuracy), with
the rounds to two absolute targets fixed before we looked at the runs, and FedACG's λ × β grid;
then the Table 4 ablations (main setting and 500 clients) beside the paper's numbers. Writes
``<figures>/fedacg_<setting>.png`` (each method at its best value) and
``<figures>/fedacg_<main|n500>_ablation.png`` (mean EMA accuracy vs round, ±1 std band over seeds).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from raysim.report.tables import mean_std

HERE = Path(__file__).resolve().parent

ABLATION = ["fedprox_reg_only", "fedavgm_momentum_only", "fedacg_no_lookahead", "fedacg_no_reg"]
FEW = ["fedavg", "fedavgm", "feddyn", "fedacg"]
LABEL = {
    "fedavg": "FedAvg", "fedavgm": "FedAvgM β", "feddyn": "FedDyn α", "fedacg": "FedACG (λ, β)",
    "fedprox_reg_only": "reg only: FedProx μ = 0.01", "fedavgm_momentum_only": "momentum only: FedAvgM β = 0.85",
    "fedacg_no_lookahead": "momentum + reg (no lookahead)", "fedacg_no_reg": "momentum + lookahead (β = 0)",
}
HYPER = {"fedavgm": "algorithm.server_momentum", "feddyn": "algorithm.dyn_alpha"}
FILE_VALUE = {"fedavgm": 0.4, "feddyn": 0.01, "fedacg": (0.85, 0.01)}  # the files' values (the ablation's FedACG)

# setting (a label of sweep.yaml) -> (title, absolute EMA-accuracy targets, fixed before we looked at the runs)
SETTINGS = {
    "dir06": ("blobs, balanced Dir(0.6), 100 clients, 5%, batch 50, 100 rounds", (0.70, 0.75)),
    "iid": ("blobs, iid, 100 clients, 5%, batch 50, 100 rounds", (0.70, 0.75)),
    "digits": ("digits, balanced Dir(0.3), 100 clients, 5%, batch 5, 100 rounds", (0.85, 0.90)),
    "n500": ("blobs, balanced Dir(0.3), 500 clients, 2% (10/round), batch 10, 100 rounds", (0.70, 0.75)),
}
ABLATION_SETTINGS = {"main": ("blobs, balanced Dir(0.3), 100 clients, 5%, 200 rounds", (0.70, 0.75)),
                     "n500": SETTINGS["n500"][:2]}

# The paper's CIFAR-10 accuracies (%) at 1000 rounds (EMA 0.9), Dir(0.3), 500 clients 2% (its Table 4).
PAPER_ABLATION = {"fedavg": 71.45, "fedprox_reg_only": 70.75, "fedavgm_momentum_only": 77.49,
                  "fedacg_no_lookahead": 76.16, "fedacg_no_reg": 82.20, "fedacg": 82.80}
ABLATION_ROWS = [  # (momentum, accelerated init, local reg, method)
    ("", "", "", "fedavg"), ("", "", "✓", "fedprox_reg_only"), ("✓", "", "", "fedavgm_momentum_only"),
    ("✓", "", "✓", "fedacg_no_lookahead"), ("✓", "✓", "", "fedacg_no_reg"), ("✓", "✓", "✓", "fedacg"),
]
EMA = 0.9


def value_of(point: dict, method: str):
    """The point's hyperparameter value (the file's where the grid leaves it; None for FedAvg and the ablation)."""
    if method == "fedacg":
        return (point.get("algorithm.acg_lambda") or 0.85, point.get("algorithm.acg_beta") or 0.01)
    if method in HYPER:
        return point.get(HYPER[method]) or FILE_VALUE[method]
    return None


def accuracies(results: Path) -> dict:
    """{(setting, method, value): [(rounds, test accuracy) per completed seed, in seed order]}; a
    method is its scenario file's name."""
    found = {}
    for point in sorted(pq.read_table(results / "sweep.parquet").to_pylist(), key=lambda p: p["seed"]):
        if point["status"] == "completed":
            table = pq.read_table(Path(point["output_dir"]) / "rounds.parquet", columns=["round", "test_accuracy"])
            rnd, acc = (np.array(table.column(c).to_pylist(), dtype=float) for c in ("round", "test_accuracy"))
            method = Path(point["scenario"]).stem
            found.setdefault((point["setting"], method, value_of(point, method)), []).append((rnd, acc))
    return found


def ema(acc: np.ndarray) -> np.ndarray:
    """e_1 = a_1, e_t = 0.9·e_{t−1} + 0.1·a_t."""
    out = np.empty_like(acc)
    out[0] = acc[0]
    for t in range(1, len(acc)):
        out[t] = EMA * out[t - 1] + (1 - EMA) * acc[t]
    return out


def curves(runs: list) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, EMA accuracy per seed [seeds × rounds]) of a method's runs in a setting."""
    rows = []
    for rnd, acc in runs:
        keep = ~np.isnan(acc)
        rows.append((rnd[keep], ema(acc[keep])))
    length = min(len(r) for r, _ in rows)
    return rows[0][0][:length], np.stack([e[:length] for _, e in rows])


def first_hit(rnd: np.ndarray, e: np.ndarray, target: float):
    hit = np.flatnonzero(e >= target)
    return int(rnd[hit[0]]) if len(hit) else None


def hits_cell(hits: list) -> str:
    got = [h for h in hits if h is not None]
    if not got:
        return "never"
    cell = mean_std(got, 0) if len(got) > 1 else str(got[0])
    return cell if len(got) == len(hits) else f"{cell} ({len(got)}/{len(hits)} seeds)"


def label(method: str, value) -> str:
    shown = "" if value is None else " = " + (f"({value[0]:g}, {value[1]:g})" if isinstance(value, tuple)
                                               else f"{value:g}")
    return LABEL[method] + shown


def cells(runs: list, targets: tuple) -> tuple:
    """(final EMA accuracies % per seed, [rounds-to-target cell per target], (rounds, EMA per seed))."""
    rnd, e = curves(runs)
    return 100 * e[:, -1], [hits_cell([first_hit(rnd, s, t) for s in e]) for t in targets], (rnd, e)


def draw(curves_by_label: dict, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (rnd, e) in curves_by_label.items():
        mean = 100 * e.mean(0)
        std = 100 * e.std(0, ddof=1) if len(e) > 1 else 0 * mean
        ax.plot(rnd, mean, label=name, lw=2 if name.startswith("FedACG") else 1.2)
        ax.fill_between(rnd, mean - std, mean + std, alpha=0.15)
    ax.set(xlabel="round", ylabel="test accuracy, EMA 0.9 (%)", title=title)
    ax.set_ylim(bottom=max(0, min(100 * e.mean(0)[len(r) // 10] for r, e in curves_by_label.values()) - 5))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"\n![{path.stem}]({os.path.relpath(path, HERE)})")


def summarize_setting(setting: str, found: dict, figures: Path) -> None:
    """Every point of a tuned setting, each method at its best value, FedACG's λ × β grid, the figure."""
    title, targets = SETTINGS[setting]
    keys = [k for k in found if k[0] == setting and k[1] in FEW]
    if not keys:
        print(f"\n### {setting}: no complete runs yet")
        return
    head = " | ".join(f"rounds to {100 * t:.0f}%" for t in targets)
    print(f"\n### {setting}: {title} (seeds: {sorted({len(found[k]) for k in keys})})\n")
    print(f"| method | final EMA acc. % | {head} |\n|---|---|" + "---|" * len(targets))
    best = {}
    for _, method, value in sorted(keys, key=lambda k: (FEW.index(k[1]), str(k[2]))):
        final, hits, curve = cells(found[setting, method, value], targets)
        print(f"| {label(method, value)} | {mean_std(final, 2)} | {' | '.join(hits)} |")
        if method not in best or final.mean() > best[method][1].mean():
            best[method] = (value, final, hits, curve)
    print(f"\nEach method at its best value:\n\n| method | final EMA acc. % | {head} |\n|---|---|" + "---|" * len(targets))
    for method, (value, final, hits, _) in sorted(best.items(), key=lambda kv: -kv[1][1].mean()):
        print(f"| {label(method, value)} | {mean_std(final, 2)} | {' | '.join(hits)} |")
    grid = {k[2]: cells(found[k], targets)[0].mean() for k in keys if k[1] == "fedacg"}
    lambdas, betas = sorted({v[0] for v in grid}), sorted({v[1] for v in grid})
    print("\nFedACG, final EMA acc. % (rows λ, columns β):\n\n| λ \\ β | " + " | ".join(f"{b:g}" for b in betas)
          + " |\n|---|" + "---|" * len(betas))
    for lam in lambdas:
        print(f"| {lam:g} | " + " | ".join(f"{grid[lam, b]:.2f}" if (lam, b) in grid else "—" for b in betas) + " |")
    draw({label(m, v): c for m, (v, _, _, c) in best.items()}, title + ": each method tuned",
         figures / f"fedacg_{setting}.png")


def summarize_ablation(setting: str, found: dict, figures: Path) -> None:
    """The Table 4 ablation of a setting at FedACG's λ = 0.85, β = 0.01, beside the paper's."""
    title, targets = ABLATION_SETTINGS[setting]
    rows = [(mom, acc, reg, m, value_of({}, m)) for mom, acc, reg, m in ABLATION_ROWS]
    if not all((setting, m, v) in found for *_, m, v in rows):
        print(f"\n### ablation, {setting}: incomplete")
        return
    head = " / ".join(f"{100 * t:.0f}%" for t in targets)
    print(f"\n### Table 4 ablation, {setting}: {title}\n")
    print(f"| momentum | lookahead | local reg. | method | paper acc. % (500 cl.) | ours: final EMA acc. % | "
          f"ours − FedAvg | rounds to {head} |\n|---|---|---|---|---|---|---|---|")
    base = cells(found[setting, "fedavg", None], targets)[0].mean()
    curves_by_label = {}
    for mom, acc, reg, m, v in rows:
        final, hits, curve = cells(found[setting, m, v], targets)
        curves_by_label[label(m, v)] = curve
        print(f"| {mom} | {acc} | {reg} | {label(m, v)} | {PAPER_ABLATION[m]:.2f} | {mean_std(final, 2)} | "
              f"{final.mean() - base:+.2f} | {' / '.join(hits)} |")
    draw(curves_by_label, "ablation: " + title, figures / f"fedacg_{setting}_ablation.png")


def summarize(args) -> int:
    figures = Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    found = accuracies(Path(args.results))
    for setting in args.settings:
        if setting in SETTINGS:
            summarize_setting(setting, found, figures)
        if setting in ABLATION_SETTINGS:
            summarize_ablation(setting, found, figures)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", default="results/paper/fedacg", help="the sweep's directory")
    names = ["main", *SETTINGS]
    parser.add_argument("--settings", default=",".join(names), help="comma-separated: " + ",".join(names))
    parser.add_argument("--figures", default="docs/paper")
    args = parser.parse_args(argv)
    args.settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in args.settings if s not in names]
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {names}")
    return summarize(args)


if __name__ == "__main__":
    sys.exit(main())
