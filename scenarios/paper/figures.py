"""Tables and plots of the FFGG reproductions (scenarios/paper/README.md) from their results.

Run the commands in scenarios/paper/README.md first, then:
    python scenarios/paper/figures.py [results/paper] [docs/paper] [exp_a exp_b exp_async exp_c]
It prints the README's tables (Markdown) and writes the PNGs (of the parts named; all by default).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def rounds(path: Path) -> dict:
    return pq.read_table(path / "rounds.parquet").to_pydict()


def exp_a(results: Path, figures: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    print("| tau | rel. error after 100 / 300 / 1000 rounds | final (1500) | first round ≤ 1e-8 |\n|---|---|---|---|")
    for tau in (5, 10, 20, 30, 40):
        r = rounds(results / "ffgg_quadratic_cg" / f"tau{tau}")
        err = np.array(r["rel_error"])
        hit = np.flatnonzero(err <= 1e-8)
        print(f"| {tau} | {err[99]:.1e} / {err[299]:.1e} / {err[999]:.1e} | {err[-1]:.1e} | "
              f"{r['round'][hit[0]] if len(hit) else 'never'} |")
        ax.semilogy(r["round"], err, label=f"τ = {tau}")
    ax.set(xlabel="round", ylabel="‖θ − θ*‖² / ‖θ⁰ − θ*‖²", title="Exp A: FFGG with CG fine-tuning")
    ax.legend()
    fig.tight_layout()
    fig.savefig(figures / "exp_a_ffgg_cg.png", dpi=110)


def exp_b(results: Path, figures: Path) -> None:
    methods = ["ffgg", "localgd", "scaffold", "l2gd"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    print("\n| tau | FFGG at w*(θ) | FFGG at its deployed w | localgd | scaffold | l2gd |\n|---|---|---|---|---|---|")
    for ax, tau in zip(axes, (100, 200, 500)):
        cells = []
        for m in methods:
            path = results / "ffgg_vs_baselines" / f"{m}_tau{tau}"
            if not path.exists():
                cells += ["—", "—"] if m == "ffgg" else ["—"]
                continue
            r = rounds(path)
            cells.append(f"{r['loss_gap'][-1]:.2e}")
            if m == "ffgg":  # the exact best response (every round) and what the fine-tuner deploys (evaluations)
                rnd, deployed = np.array(r["round"]), np.array(r["deployed_loss_gap"], dtype=float)
                keep = np.isfinite(deployed)
                cells.append(f"{deployed[keep][-1]:.2e}")
                ax.semilogy(rnd[keep], deployed[keep], label="ffgg, deployed w", color="C0")
                ax.semilogy(r["round"], r["loss_gap"], "--", label="ffgg at w*(θ)", color="C0", alpha=0.6)
            else:
                ax.semilogy(r["round"], r["loss_gap"], label=m, color=f"C{methods.index(m)}")
        print(f"| {tau} | " + " | ".join(cells) + " |")
        ax.set(xlabel="round", title=f"τ = {tau}")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("mean_m f_m(own model) − min f_m")
    fig.tight_layout()
    fig.savefig(figures / "exp_b_ffgg_vs_baselines.png", dpi=110)


def exp_async(results: Path, figures: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    print("\n| concurrency | async FFGG final rel. error | async SGD (non-personalised) | ratio | max staleness |\n"
          "|---|---|---|---|---|")
    for c in (8, 32):
        a = rounds(results / "async_ffgg" / f"c{c}")
        s = rounds(results / "async_sgd_nonpersonalized" / f"c{c}")
        stale = max(pq.read_table(results / "async_ffgg" / f"c{c}" / "events.parquet").column("staleness").to_pylist())
        print(f"| {c} | {a['rel_error'][-1]:.1e} | {s['rel_error'][-1]:.1e} | "
              f"{s['rel_error'][-1] / max(a['rel_error'][-1], 1e-300):.0e} | {stale} |")
        ax.semilogy(a["virtual_time"], a["rel_error"], label=f"async FFGG, {c} in flight")
        ax.semilogy(s["virtual_time"], s["rel_error"], "--", label=f"async SGD, {c} in flight")
    ax.set(xlabel="virtual time (s)", ylabel="‖θ − θ*‖² / ‖θ⁰ − θ*‖²", title="Asynchronous, log-normal(σ=1.5) delays")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(figures / "async_ffgg_vs_sgd.png", dpi=110)


def exp_c(results: Path, figures: Path) -> None:
    runs = {"FedAvg + fine-tuning": "fedavg_none", "Local FFGG (input layer)": "local_ffgg_input_layer",
            "Local FFGG (output layer)": "local_ffgg_output_layer", "Local FFGG (adapter)": "local_ffgg_adapter"}
    print("\n| method | personalised test accuracy % (mean ± std, seeds 0–2) | global model accuracy % |\n|---|---|---|")
    names, means = [], []
    for label, prefix in runs.items():
        summaries = [json.loads((results / "ffgg_digits" / f"{prefix}_seed{s}" / "summary.json").read_text())
                     for s in range(3)]
        pers = 100 * np.array([s["final_personalized_accuracy"] for s in summaries])
        glob = 100 * np.array([s["final_test_accuracy"] for s in summaries])
        print(f"| {label} | {pers.mean():.2f} ± {pers.std():.2f} | {glob.mean():.2f} ± {glob.std():.2f} |")
        names.append(label.replace(" + ", "\n+ ").replace(" (", "\n("))
        means.append(pers.mean())
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, means)
    ax.set(ylabel="personalised test accuracy %", ylim=(min(means) - 5, max(means) + 3),
           title="Digits with writer feature shift (3 seeds)")
    fig.tight_layout()
    fig.savefig(figures / "exp_c_digits.png", dpi=110)


PARTS = {"exp_a": exp_a, "exp_b": exp_b, "exp_async": exp_async, "exp_c": exp_c}


def main() -> None:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "results/paper")
    figures = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/paper")
    figures.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[3:] or PARTS:
        PARTS[name](results, figures)


if __name__ == "__main__":
    main()
