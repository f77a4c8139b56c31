"""The FedACG reproduction's tables and figures (scenarios/paper/fedacg/README.md), from its sweep.

    raysim sweep scenarios/paper/fedacg/sweep.yaml --parallel 2
    python scenarios/paper/fedacg/summarize.py [results/paper/fedacg] [--settings main,n500,...] [--figures docs/paper]

Reads the sweep's sweep.parquet and each completed point's ``rounds.parquet``, computes the EMA
(factor 0.9) of the test accuracy, prints Markdown tables (ours, and the paper's numbers beside
ours) and writes ``<figures>/fedacg_<setting>.png`` (mean EMA accuracy vs round, ±1 std band over
seeds).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent

MAIN = ["fedavg", "fedprox", "fedavgm", "fedadam", "feddyn", "scaffold", "fedacg"]
ABLATION = ["fedprox_reg_only", "fedavgm_momentum_only", "fedacg_no_lookahead", "fedacg_no_reg"]
FEW = ["fedavg", "fedavgm", "feddyn", "fedacg"]
LABEL = {
    "fedavg": "FedAvg", "fedprox": "FedProx (μ=0.001)", "fedavgm": "FedAvgM (β=0.8)",
    "fedadam": "FedAdam (η=0.01, τ=1e-3)", "feddyn": "FedDyn (α=0.01)", "scaffold": "SCAFFOLD",
    "fedacg": "FedACG (λ=0.85, β=0.01)", "fedprox_reg_only": "reg only: FedProx μ=0.01",
    "fedavgm_momentum_only": "momentum only: FedAvgM β=0.85",
    "fedacg_no_lookahead": "momentum + reg (no lookahead)", "fedacg_no_reg": "momentum + lookahead (β=0)",
}

# setting (a label of sweep.yaml) -> (title, methods)
SETTINGS = {
    "main": ("blobs, Dir(0.3), 100 clients, 5% (5/round), batch 50, 200 rounds", MAIN + ABLATION),
    "dir06": ("blobs, Dir(0.6), 100 clients, 5%, batch 50, 100 rounds", FEW),
    "iid": ("blobs, iid, 100 clients, 5%, batch 50, 100 rounds", FEW),
    "digits": ("digits, Dir(0.3), 100 clients, 5%, batch 5, 100 rounds", FEW),
    "n500": ("blobs, Dir(0.3), 500 clients, 2% (10/round), batch 10, 100 rounds", FEW + ABLATION),
}

# The paper's CIFAR-10 accuracies (%) at 1000 rounds (EMA 0.9), Dir(0.3).
PAPER = {
    "main": {"fedavg": 82.53, "fedprox": 82.68, "fedavgm": 85.48, "fedadam": 81.73, "feddyn": 88.10,
             "fedacg": 89.10},
    "n500": {"fedavg": 71.45, "fedavgm": 77.49, "feddyn": 77.92, "fedacg": 82.80,
             "fedprox_reg_only": 70.75, "fedavgm_momentum_only": 77.49, "fedacg_no_lookahead": 76.16,
             "fedacg_no_reg": 82.20},
}
ABLATION_ROWS = [  # (momentum, accelerated init, local reg, method)
    ("", "", "", "fedavg"), ("", "", "✓", "fedprox_reg_only"), ("✓", "", "", "fedavgm_momentum_only"),
    ("✓", "", "✓", "fedacg_no_lookahead"), ("✓", "✓", "", "fedacg_no_reg"), ("✓", "✓", "✓", "fedacg"),
]
EMA = 0.9


def accuracies(results: Path) -> dict:
    """{(setting, method): [(rounds, test accuracy) per completed seed, in seed order]}; a method is
    its scenario file's name."""
    found = {}
    for point in sorted(pq.read_table(results / "sweep.parquet").to_pylist(), key=lambda p: p["seed"]):
        if point["status"] == "completed":
            table = pq.read_table(Path(point["output_dir"]) / "rounds.parquet", columns=["round", "test_accuracy"])
            rnd, acc = (np.array(table.column(c).to_pylist(), dtype=float) for c in ("round", "test_accuracy"))
            found.setdefault((point["setting"], Path(point["scenario"]).stem), []).append((rnd, acc))
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


def pm(values, digits=2) -> str:
    values = np.asarray(values, dtype=float)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def hits_cell(hits: list) -> str:
    got = [h for h in hits if h is not None]
    if not got:
        return "never"
    cell = pm(got, 0) if len(got) > 1 else str(got[0])
    return cell if len(got) == len(hits) else f"{cell} ({len(got)}/{len(hits)} seeds)"


def summarize_setting(setting: str, found: dict, figures: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, methods = SETTINGS[setting]
    data = {m: curves(found[setting, m]) for m in methods if (setting, m) in found}
    if not data:
        print(f"\n### {setting}: no complete runs yet")
        return {}
    ref = data["fedacg"][1][:, -1].mean() if "fedacg" in data else None
    stats = {}
    seeds = sorted({len(found[setting, m]) for m in data})
    print(f"\n### {setting}: {title} ({'/'.join(map(str, seeds))} seeds)\n")
    if ref is not None:
        print(f"Targets: 90% / 95% of FedACG's final EMA accuracy ({100 * ref:.2f}%): "
              f"{90 * ref:.2f}% / {95 * ref:.2f}%\n")
    print("| method | final EMA acc. % | final acc. (no EMA) % | rounds to 90% | rounds to 95% |\n|---|---|---|---|---|")
    for m, (rnd, e) in data.items():
        final = 100 * e[:, -1]
        hit90 = [first_hit(rnd, s, 0.90 * ref) for s in e] if ref is not None else []
        hit95 = [first_hit(rnd, s, 0.95 * ref) for s in e] if ref is not None else []
        raw = [100 * acc[-1] for _, acc in found[setting, m]]  # the last round's, without EMA
        stats[m] = {"final": final, "hit90": hit90, "hit95": hit95}
        print(f"| {LABEL[m]} | {pm(final)} | {pm(raw)} | {hits_cell(hit90) if hit90 else '—'} | "
              f"{hits_cell(hit95) if hit95 else '—'} |")
    groups = [("", [m for m in data if m not in ABLATION])]
    if any(m in ABLATION for m in data):
        groups.append(("_ablation", [m for m in ("fedavg", *ABLATION, "fedacg") if m in data]))
    for suffix, group in groups:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in group:
            rnd, e = data[m]
            mean, std = 100 * e.mean(0), 100 * e.std(0, ddof=1) if len(e) > 1 else 0 * e[0]
            ax.plot(rnd, mean, label=LABEL[m], lw=2 if m == "fedacg" else 1.2)
            ax.fill_between(rnd, mean - std, mean + std, alpha=0.15)
        ax.set(xlabel="round", ylabel="test accuracy, EMA 0.9 (%)",
               title=("ablation: " if suffix else "") + title)
        ax.set_ylim(bottom=max(0, min(100 * data[m][1].mean(0)[len(data[m][0]) // 10] for m in group) - 5))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        path = figures / f"fedacg_{setting}{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"\n![{setting}{suffix}]({os.path.relpath(path, HERE)})")
    return stats


def summarize(args) -> int:
    figures = Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    found = accuracies(Path(args.results))
    stats = {s: summarize_setting(s, found, figures) for s in args.settings}
    for setting, paper in PAPER.items():
        st = stats.get(setting) or {}
        if not st:
            continue
        print(f"\n### paper (CIFAR-10, ResNet-18, 1000 rounds) vs ours ({setting})\n")
        print("| method | paper acc. % | paper rank | ours: final EMA acc. % | our rank |\n|---|---|---|---|---|")
        ms = [m for m in paper if m in st and m not in ABLATION]
        p_rank = {m: i + 1 for i, m in enumerate(sorted(ms, key=lambda m: -paper[m]))}
        o_rank = {m: i + 1 for i, m in enumerate(sorted(ms, key=lambda m: -st[m]["final"].mean()))}
        for m in ms:
            print(f"| {LABEL[m]} | {paper[m]:.2f} | {p_rank[m]} | {pm(st[m]['final'])} | {o_rank[m]} |")
        for m in ("scaffold",):
            if m in st:
                print(f"| {LABEL[m]} | — | — | {pm(st[m]['final'])} | — |")
        if all(m in st for *_, m in ABLATION_ROWS):
            print(f"\n### Table 4 ablation: paper ({'500 clients 2%'}) vs ours ({setting})\n")
            print("| momentum | accel. init | local reg | method | paper acc. % | ours: final EMA acc. % | "
                  "ours − FedAvg |\n|---|---|---|---|---|---|---|")
            base = st["fedavg"]["final"].mean()
            for mom, acc, reg, m in ABLATION_ROWS:
                p = PAPER["n500"].get(m)
                print(f"| {mom} | {acc} | {reg} | {LABEL[m]} | {p:.2f} | {pm(st[m]['final'])} | "
                      f"{st[m]['final'].mean() - base:+.2f} |")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", default="results/paper/fedacg", help="the sweep's directory")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: " + ",".join(SETTINGS))
    parser.add_argument("--figures", default="docs/paper")
    args = parser.parse_args(argv)
    args.settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    return summarize(args)


if __name__ == "__main__":
    sys.exit(main())
