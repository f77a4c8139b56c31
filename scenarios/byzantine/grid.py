"""Run and summarise the robustness study (README.md in this folder).

    python scenarios/byzantine/grid.py run [--data digits,gaussian_mixture] [--modes sync,fedbuff] [--shard I/N]
    python scenarios/byzantine/grid.py summarize [--figure docs/byzantine_heatmap.png]

``run`` executes every (data set, mode, attack, aggregator) of the study once (seed 0), plus the
clean run of each data set and mode (no Byzantine client, plain mean), skipping runs whose
``summary.json`` exists; ``--shard I/N`` keeps every N-th run from I, so N processes share the
grid. Each run is ``raysim run scenarios/byzantine/<data>.yaml`` (sync) or ``<data>_fedbuff.yaml``
with the overrides printed before it starts. ``summarize`` prints one Markdown table of final test accuracy per data set and
mode (rows: attacks; columns: aggregators, without and with bucketing) and draws the heat map of
accuracy minus the clean run's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "results" / "byzantine"

MODES = {"sync": "", "fedbuff": "_fedbuff"}  # mode -> suffix of the scenario file (<data><suffix>.yaml)
ATTACKS = {
    "sign_flip": ["system.byzantine.attack=sign_flip", "system.byzantine.scale=4"],
    "gaussian": ["system.byzantine.attack=gaussian", "system.byzantine.sigma=1"],
    "label_flip": ["system.byzantine.attack=label_flip"],
    "alie": ["system.byzantine.attack=alie"],
    "ipm": ["system.byzantine.attack=ipm", "system.byzantine.epsilon=0.1"],
}
RULES = {
    "mean": [], "median": [], "trimmed_mean": ["algorithm.trim=0.2"], "krum": [], "geometric_median": [],
    "centered_clipping": ["algorithm.clip_radius=1", "algorithm.clip_iterations=3"],
}
AGGREGATORS = {"mean": ["algorithm.aggregator=mean"],  # bucketing wraps the robust rules only
               **{f"{rule}{'' if s == 1 else f' s={s}'}": [f"algorithm.aggregator={rule}",
                                                          f"algorithm.bucket_size={s}", *keys]
                  for s in (1, 2) for rule, keys in RULES.items() if rule != "mean"}}


def runs(datasets, modes):
    """Every (scenario file, data set, mode, attack or 'clean', aggregator label, overrides)."""
    for data in datasets:
        for mode in modes:
            scenario = f"{data}{MODES[mode]}.yaml"
            yield scenario, data, mode, "clean", "mean", ["system.byzantine.fraction=0",
                                                          f"output.dir={RESULTS / data / mode / 'clean'}"]
            for attack, attack_keys in ATTACKS.items():
                for label, keys in AGGREGATORS.items():
                    out = RESULTS / data / mode / attack / label.replace(" s=", "_s")
                    yield scenario, data, mode, attack, label, attack_keys + keys + [f"output.dir={out}"]


def out_dir(overrides) -> Path:
    return Path(next(o for o in overrides if o.startswith("output.dir=")).split("=", 1)[1])


def cmd_run(args) -> int:
    from raysim.config import load_scenario
    from raysim.engine.runtime import LocalRuntime
    from raysim.engine.simulation import prepare, run_scenario
    from raysim.errors import RunError

    index, count = (int(x) for x in args.shard.split("/"))
    todo = [r for i, r in enumerate(runs(args.data, args.modes)) if i % count == index]
    for n, (scenario, _, _, _, _, overrides) in enumerate(todo, 1):
        if (out_dir(overrides) / "summary.json").exists():
            continue
        print(f"[{n}/{len(todo)}] raysim run scenarios/byzantine/{scenario} {' '.join(overrides)}", flush=True)
        began = time.time()
        cfg = load_scenario(str(HERE / scenario), overrides)
        try:
            status = run_scenario(cfg, prepare(cfg), LocalRuntime())["status"]
        except RunError as exc:  # a diverged model: the summary says it failed, and why
            status = f"failed ({exc})"
        print(f"    {status} in {time.time() - began:.0f} s", flush=True)
    return 0


def final_accuracy(overrides) -> float | None:
    """The run's final test accuracy (0 when it stopped with a non-finite model), None when not run."""
    path = out_dir(overrides) / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return summary["final_test_accuracy"] if summary["status"] == "completed" else 0.0


def cmd_summarize(args) -> int:
    grids = {}
    for _, data, mode, attack, label, overrides in runs(args.data, args.modes):
        grids.setdefault((data, mode), {})[(attack, label)] = final_accuracy(overrides)
    show = lambda v: "–" if v is None else f"{100 * v:.1f}"
    for (data, mode), cells in grids.items():
        clean = cells[("clean", "mean")]
        print(f"\n**{data}, {mode}** (clean run, plain mean: {show(clean)})\n")
        print("| attack | " + " | ".join(AGGREGATORS) + " |")
        print("|---|" + "---|" * len(AGGREGATORS))
        for attack in ATTACKS:
            print(f"| {attack} | " + " | ".join(show(cells[(attack, label)]) for label in AGGREGATORS) + " |")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(grids), 1, figsize=(12, 2.9 * len(grids)), squeeze=False)
        for ax, ((data, mode), cells) in zip(axes[:, 0], grids.items()):
            clean = cells[("clean", "mean")] or np.nan
            drop = np.array([[100 * ((cells[(a, label)] if cells[(a, label)] is not None else np.nan) - clean)
                              for label in AGGREGATORS] for a in ATTACKS])
            image = ax.imshow(drop, cmap="RdYlGn", vmin=-30, vmax=5, aspect="auto")
            ax.set_xticks(range(len(AGGREGATORS)), list(AGGREGATORS), fontsize=7, rotation=25, ha="right")
            ax.set_yticks(range(len(ATTACKS)), list(ATTACKS), fontsize=8)
            for (i, j), value in np.ndenumerate(drop):
                ax.text(j, i, "" if np.isnan(value) else f"{value:.0f}", ha="center", va="center", fontsize=7)
            ax.set_title(f"{data}, {mode}: accuracy − clean (points)", fontsize=9)
            fig.colorbar(image, ax=ax)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
        print(f"\nwrote {args.figure}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("run", cmd_run), ("summarize", cmd_summarize)):
        p = sub.add_parser(name)
        p.add_argument("--data", type=lambda s: s.split(","), default=["digits", "gaussian_mixture"])
        p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
        p.set_defaults(func=func)
    sub.choices["run"].add_argument("--shard", default="0/1", help="I/N: run every N-th run from I")
    sub.choices["summarize"].add_argument("--figure", help="write the heat map here (PNG)")
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
