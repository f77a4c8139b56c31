"""Run and summarise the BR-FFGG experiment on the realizable quadratic (README.md in this folder).

    python scenarios/paper/br_ffgg/grid.py run [--seeds 0,1,2]
    python scenarios/paper/br_ffgg/grid.py summarize [--figure docs/paper/br_ffgg.png]

``run`` executes every (attack, aggregator, seed) of br_ffgg.yaml, plus the clean run without
Byzantine clients, skipping runs whose ``summary.json`` exists; each is ``raysim run
scenarios/paper/br_ffgg/br_ffgg.yaml`` with the overrides printed before it starts. ``summarize``
prints the README's table (final rel_error = ‖θ − θ*‖² / ‖θ₀ − θ*‖², median over seeds and the
largest) and plots rel_error against rounds, one panel per attack.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[2] / "results" / "paper" / "br_ffgg"

ATTACKS = {  # attack -> its overrides (strong enough to break the plain mean on this problem, see README)
    "sign_flip": ["system.byzantine.attack=sign_flip", "system.byzantine.scale=10"],
    "gaussian": ["system.byzantine.attack=gaussian", "system.byzantine.sigma=10"],
    "nan": ["system.byzantine.attack=nan"],
    "alie": ["system.byzantine.attack=alie"],
    "ipm": ["system.byzantine.attack=ipm", "system.byzantine.epsilon=10"],
}
AGGREGATORS = {  # label -> overrides
    "mean": ["algorithm.aggregator=mean"],
    "bucketing ∘ Krum": ["algorithm.aggregator=krum", "algorithm.bucket_size=2"],
    "bucketing ∘ geometric median": ["algorithm.aggregator=geometric_median", "algorithm.bucket_size=2"],
    "bucketing ∘ median": ["algorithm.aggregator=median", "algorithm.bucket_size=2"],
    "centered clipping": ["algorithm.aggregator=centered_clipping", "algorithm.clip_radius=0.01",
                          "algorithm.clip_iterations=3"],
}
CLEAN = ("clean", "mean")  # no Byzantine client, plain mean


def runs(seeds):
    """Every (attack, aggregator label, seed, overrides); the clean run first."""
    for seed in seeds:
        yield (*CLEAN, seed, ["system.byzantine.fraction=0", f"seed={seed}",
                              f"output.dir={RESULTS / 'clean' / 'mean' / f'seed{seed}'}"])
        for attack, attack_keys in ATTACKS.items():
            for label, keys in AGGREGATORS.items():
                out = RESULTS / attack / label.replace(" ∘ ", "_").replace(" ", "_") / f"seed{seed}"
                yield attack, label, seed, attack_keys + keys + [f"seed={seed}", f"output.dir={out}"]


def out_dir(overrides) -> Path:
    return Path(next(o for o in overrides if o.startswith("output.dir=")).split("=", 1)[1])


def cmd_run(args) -> int:
    from raysim.config import load_scenario
    from raysim.engine.runtime import LocalRuntime
    from raysim.engine.simulation import prepare, run_scenario
    from raysim.errors import RunError

    for attack, label, seed, overrides in runs(args.seeds):
        if (out_dir(overrides) / "summary.json").exists():
            continue
        print(f"raysim run scenarios/paper/br_ffgg/br_ffgg.yaml {' '.join(overrides)}", flush=True)
        began = time.time()
        cfg = load_scenario(str(HERE / "br_ffgg.yaml"), overrides)
        try:
            status = run_scenario(cfg, prepare(cfg), LocalRuntime())["status"]
        except RunError as exc:  # e.g. the mean meeting NaN: the run's summary says it failed, and why
            status = f"failed ({exc})"
        print(f"    {status} in {time.time() - began:.0f} s", flush=True)
    return 0


def _curve(overrides):
    """rel_error per round of a finished run (None if it did not finish; inf past a divergence)."""
    import pyarrow.parquet as pq

    out = out_dir(overrides)
    if not (out / "summary.json").exists():
        return None
    status = json.loads((out / "summary.json").read_text())["status"]
    errors = pq.read_table(out / "rounds.parquet", columns=["rel_error"]).column("rel_error").to_pylist()
    errors = [math.inf if e is None or not math.isfinite(e) else e for e in errors]
    return errors if status == "completed" else errors + [math.inf]


def cmd_summarize(args) -> int:
    curves = {}
    for attack, label, seed, overrides in runs(args.seeds):
        curve = _curve(overrides)
        if curve is not None:
            curves.setdefault((attack, label), []).append(curve)
    show = lambda v: "diverged" if math.isinf(v) else f"{v:.1e}"
    clean = [c[-1] for c in curves.get(CLEAN, [])]
    print(f"Clean (no Byzantine client, mean): median {show(float(np.median(clean)))} over {len(clean)} seeds\n")
    print("| attack | " + " | ".join(AGGREGATORS) + " |")
    print("|---|" + "---|" * len(AGGREGATORS))
    for attack in ATTACKS:
        cells = []
        for label in AGGREGATORS:
            finals = [c[-1] for c in curves.get((attack, label), [])]
            cells.append(f"{show(float(np.median(finals)))} (max {show(max(finals))}, {len(finals)})" if finals
                         else "–")
        print(f"| {attack} | " + " | ".join(cells) + " |")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(ATTACKS), figsize=(4 * len(ATTACKS), 3.6), sharey=True)
        for ax, attack in zip(axes, ATTACKS):
            for label in AGGREGATORS:
                seeds = curves.get((attack, label))
                if seeds:
                    ax.semilogy(np.arange(1, len(seeds[0]) + 1), np.minimum(seeds[0], 1e6), label=label)
            if CLEAN in curves:
                ax.semilogy(np.arange(1, len(curves[CLEAN][0]) + 1), curves[CLEAN][0], "k:", label="clean, mean")
            ax.set_title(attack)
            ax.set_xlabel("round")
            ax.set_ylim(1e-6, 1e6)
        axes[0].set_ylabel("‖θ − θ*‖² / ‖θ₀ − θ*‖² (seed 0)")
        axes[-1].legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
        print(f"\nwrote {args.figure}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("run", cmd_run), ("summarize", cmd_summarize)):
        p = sub.add_parser(name)
        p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
        p.set_defaults(func=func)
    sub.choices["summarize"].add_argument("--figure", help="write the plot here (PNG)")
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
