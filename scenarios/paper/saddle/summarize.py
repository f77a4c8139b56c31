"""The saddle-escape experiment's tables and figures (scenarios/paper/saddle/README.md), after Vlaski,
Rizk and Sayed, "Second-Order Guarantees in Federated Learning", from its sweep.

    raysim sweep scenarios/paper/saddle/sweep.yaml --parallel 2
    python scenarios/paper/saddle/summarize.py [results/paper/saddle] [--figures docs/paper]

Reads the sweep's sweep.parquet and every completed point's run and prints one Markdown table per
setting (escape rounds, final J − J*, ‖∇J‖², λ_min, jitter: median [min, max] over seeds) and,
with ``--figures``, writes the figures ``saddle_*.png`` there.

Two escape rounds, each "never" if no evaluation (every 10 rounds) reaches it: half-way, the first
evaluated round at which J(w) has come half-way down from J(0) = log 2 to its minimum J*; and
curvature, the first at which λ_min(∇²J(w)) ≥ −μ = −0.01 (at the saddle λ_min ≈ −0.4; the vector
case's minima have λ_min = 0 exactly and are approached with λ_min slightly below 0, see the README).
Jitter: the root-mean-square move ‖w(t + 10) − w(t)‖ between evaluations over the last 500 rounds,
a measure of the noise around the minimum (the drift there is a few 10⁻⁴ per 10 rounds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

CLIENTS = (1, 5, 10, 25, 50, 100)  # L
ESCAPE = -0.01  # λ_min(∇²J) at or above −μ: out of the saddle's negative curvature
SETTINGS = {  # setting (a label of sweep.yaml) -> title
    "main": "E_k = 10, one coin per step, start 10⁻³·N(0, 1), scalar",
    "hetero_steps": "E_k ~ U{1..20}",
    "round_coins": "one coin per round",
    "at_origin": "start exactly at 0, gradient noise σ_v = 0.01",
    "dim2": "vector case, d = 2",
}


def completed(results: Path) -> dict:
    """{(setting, L): [(seed, run directory)] of the completed points, in seed order}."""
    found = {}
    for point in sorted(pq.read_table(results / "sweep.parquet").to_pylist(), key=lambda p: p["seed"]):
        if point["status"] == "completed":
            found.setdefault((point["setting"], point["execution.clients_per_round"]), []).append(
                (point["seed"], Path(point["output_dir"])))
    return found


def curves(path: Path) -> dict:
    """The evaluated rounds of one run: round, objective, grad_norm_sq, hessian_min_eig, parameters."""
    table = pq.read_table(path / "rounds.parquet",
                          columns=["round", "objective", "grad_norm_sq", "hessian_min_eig", "parameters"])
    rows = table.filter(table.column("objective").is_valid()).to_pydict()
    out = {k: np.array(v, dtype=np.float64) for k, v in rows.items() if k != "parameters"}
    out["parameters"] = np.array(rows["parameters"], dtype=np.float64)
    return out


def exact_minimum(run: Path) -> float:
    """J* = min J. The model's output w₁ᵀW₂h is vᵀh with v = W₂ᵀw₁, and the least (ρ/2)(‖w₁‖² + ‖W₂‖²)
    giving a v is ρ‖v‖ (a balanced rank-one pair), so J* = min over v ∈ R^d of the mean logistic
    loss of vᵀh plus ρ‖v‖, a convex problem (equal client sizes: p_k/n_k is the same for every row)."""
    import torch

    from raysim.scenario import load_scenario
    from raysim.data import build_dataset

    cfg = load_scenario(str(run / "scenario.yaml"))  # the run's scenario: its data, seed and ρ
    data = build_dataset(cfg.data, cfg.seed).materialize()
    train = np.concatenate([np.arange(lo, hi) for lo, hi, _ in data.offsets()])
    h = torch.from_numpy(data.features()[train].astype(np.float64))
    gamma = torch.from_numpy(2.0 * data.labels()[train] - 1.0)
    rho = cfg.algorithm.weight_decay
    v = torch.ones(h.shape[1], dtype=torch.float64, requires_grad=True)
    solver = torch.optim.LBFGS([v], max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-15,
                               line_search_fn="strong_wolfe")

    def objective():
        solver.zero_grad()
        value = torch.nn.functional.softplus(-gamma * (h @ v)).mean() + rho * v.norm()
        value.backward()
        return value

    solver.step(objective)
    return float(objective().detach())


def first_round(c: dict, reached: np.ndarray) -> float:
    """The first evaluated round where ``reached`` holds (NaN: never)."""
    hits = np.flatnonzero(reached)
    return float(c["round"][hits[0]]) if len(hits) else float("nan")


def jitter(c: dict) -> float:
    """RMS of ‖w(t + 10) − w(t)‖ over the evaluations of the last 500 rounds."""
    late = c["parameters"][c["round"] > c["round"][-1] - 500]
    return float(np.sqrt((np.diff(late, axis=0) ** 2).sum(1).mean()))


def spread(values: list, fmt: str) -> str:
    """'median [min, max]' of the finite values (and how many never happened)."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if not len(finite):
        return "never"
    text = (fmt.format(np.median(finite)) if len(finite) == 1 else
            f"{fmt.format(np.median(finite))} [{fmt.format(finite.min())}, {fmt.format(finite.max())}]")
    return text + (f", never in {len(values) - len(finite)}" if len(finite) < len(values) else "")


def summarize(results: Path, figures: Path | None) -> None:
    """Print a table per setting and write the figures."""
    found = completed(results)
    loaded = {key: [(seed, curves(run), json.loads((run / "summary.json").read_text())["wall_seconds"])
                    for seed, run in runs] for key, runs in found.items()}
    for setting, title in SETTINGS.items():
        rows = [(L, loaded[setting, L]) for L in CLIENTS if (setting, L) in loaded]
        if not rows:
            continue
        print(f"\n### {setting}: {title}\n")
        runs_of = {seed: run for L, _ in rows for seed, run in found[setting, L]}  # any L: the data is the seed's
        minimum = {s: exact_minimum(runs_of[s]) for s in sorted(runs_of)}
        print("J* (exact minimum) per seed: " + ", ".join(f"{j:.4f} (seed {s})" for s, j in minimum.items()))
        print("\n| L | seeds | escape: half-way | escape: λ_min ≥ −0.01 | final J − J* | final ‖∇J‖² | final λ_min "
              "| jitter | s per run |")
        print("|---|---|---|---|---|---|---|---|---|")
        for L, runs in rows:
            last = [c for _, c, _ in runs]
            halfway = [first_round(c, c["objective"] <= (np.log(2) + minimum[s]) / 2) for s, c, _ in runs]
            curvature = [first_round(c, c["hessian_min_eig"] >= ESCAPE) for c in last]
            print(f"| {L} | {len(runs)} | {spread(halfway, '{:.0f}')} | {spread(curvature, '{:.0f}')} "
                  f"| {spread([c['objective'][-1] - minimum[s] for s, c, _ in runs], '{:.1e}')} "
                  f"| {spread([c['grad_norm_sq'][-1] for c in last], '{:.1e}')} "
                  f"| {spread([c['hessian_min_eig'][-1] for c in last], '{:.3f}')} "
                  f"| {spread([jitter(c) for c in last], '{:.1e}')} "
                  f"| {np.median([w for _, _, w in runs]):.0f} |")
    if figures is not None:
        _figures(loaded, figures)


def _figures(loaded: dict, where: Path) -> None:
    """saddle_trajectories.png (the (w₁, W₂) plane, seed 0 of the main setting, one curve per L) and
    saddle_<setting>_curvature.png (median ‖∇J‖² and λ_min over seeds against rounds, one curve per L)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where.mkdir(parents=True, exist_ok=True)
    colors = dict(zip(CLIENTS, plt.cm.viridis(np.linspace(0, 0.9, len(CLIENTS)))))
    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(11, 5))
    for L in CLIENTS:
        seed0 = [c for s, c, _ in loaded.get(("main", L), []) if s == 0]
        if seed0:
            rounds, w = seed0[0]["round"], seed0[0]["parameters"]
            late = rounds > rounds[-1] - 1000
            whole.plot(w[:, 0], w[:, 1], color=colors[L], lw=1, label=f"L = {L}")
            whole.plot(w[-1, 0], w[-1, 1], "o", color=colors[L], ms=4)
            zoom.plot(rounds[late], np.abs(w[late].sum(1)) / np.sqrt(2), color=colors[L], lw=0.8)
    whole.plot(0, 0, "kx", ms=8, label="saddle (0, 0)")
    whole.set(xlabel="w₁", ylabel="W₂", title="main setting, seed 0: (w₁, W₂) every 10 rounds")
    zoom.set(xlabel="round", ylabel="|w₁ + W₂|/√2: distance from the saddle",
             title="the last 1,000 rounds: noise around the minimum")
    whole.set_aspect("equal")
    whole.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(where / "saddle_trajectories.png", dpi=120)
    plt.close(fig)
    for setting, title in SETTINGS.items():
        present = [L for L in CLIENTS if (setting, L) in loaded]
        if not present:
            continue
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
        for L in present:
            runs = [c for _, c, _ in loaded[setting, L]]
            rounds = runs[0]["round"]
            n = len(runs)
            top.semilogy(rounds, np.median([c["grad_norm_sq"] for c in runs], 0), color=colors[L],
                         label=f"L = {L} ({n} seed{'s' if n > 1 else ''})")
            bottom.plot(rounds, np.median([c["hessian_min_eig"] for c in runs], 0), color=colors[L])
        bottom.axhline(0, color="k", lw=0.6)
        top.set(ylabel="‖∇J(w)‖² (median over seeds)", title=f"{setting}: {title}")
        bottom.set(xlabel="round", ylabel="λ_min(∇²J(w)) (median)")
        top.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(where / f"saddle_{setting}_curvature.png", dpi=120)
        plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, default=Path("results/paper/saddle"),
                        help="the sweep's directory")
    parser.add_argument("--figures", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    summarize(args.results, args.figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
