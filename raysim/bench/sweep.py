"""``raysim bench --sweep``: a four-point W1 sweep against four isolated W1 runs and against four
times W1's steady training time, in one command.

The sweep (``--grid algorithm.lr=0.02,0.05,0.1,0.2``) runs once per way of running its points
(isolated processes, ``--in-process``, ``--runner tune``), each as a whole ``raysim sweep``
process into a fresh directory; the four isolated runs are ``raysim run`` of the same four points
one after another. W1's steady training time is a run's rounds times its steady seconds per
round: what the points cost without any start-up. Every repeat runs everything, interleaved.
"""

from __future__ import annotations

import shutil
import statistics
import sys

from raysim.bench import SCENARIOS, run_raysim
from raysim.measure import measure

RATES = ("0.02", "0.05", "0.1", "0.2")  # the sweep's four points: W1 at four client learning rates
RUNNERS = {"processes": (), "in_process": ("--in-process",), "tune": ("--runner", "tune")}


def run_sweep_bench(out, repeat: int) -> dict:
    """Print every measurement, then each runner's sweep wall time against the four isolated runs
    and against four times W1's steady training time (medians over ``repeat``); returns them."""
    walls = {name: [] for name in (*RUNNERS, "isolated")}
    training = []
    for _ in range(repeat):
        isolated = 0.0
        for rate in RATES:
            r = run_raysim("w1", out, overrides=(f"algorithm.lr={rate}",), side=f"lr{rate}")
            isolated += r["wall_seconds"]
            training.append(r["seconds_per_round"] * _rounds())
            print(f"isolated run lr={rate:5s} {r['wall_seconds']:8.2f} s wall, steady training "
                  f"{training[-1]:.2f} s", flush=True)
        walls["isolated"].append(isolated)
        for name, flags in RUNNERS.items():
            directory = (out / "sweep" / name).resolve()
            shutil.rmtree(directory, ignore_errors=True)  # a sweep skips points done: each repeat starts afresh
            cmd = [sys.executable, "-m", "raysim.cli", "sweep", str(SCENARIOS / "w1.yaml"), "--quiet",
                   "--grid", f"algorithm.lr={','.join(RATES)}", "--out", str(directory), *flags]
            figures = measure(cmd)
            if figures["returncode"] != 0:
                raise RuntimeError(f"the {name} sweep failed with exit code {figures['returncode']}")
            walls[name].append(figures["wall_seconds"])
            print(f"sweep ({name:10s})       {figures['wall_seconds']:8.2f} s wall", flush=True)
    med = {name: statistics.median(values) for name, values in walls.items()}
    steady_four = 4 * statistics.median(training)
    print(f"four isolated W1 runs {med['isolated']:.2f} s; four times W1's steady training {steady_four:.2f} s "
          f"(medians of {repeat})")
    ratios = {}
    for name in RUNNERS:
        ratios[name] = {"over_isolated": med[name] / med["isolated"], "over_training": med[name] / steady_four}
        print(f"four-point W1 sweep, {name}: {med[name]:.2f} s = {ratios[name]['over_isolated']:.2f}x four isolated "
              f"runs, {ratios[name]['over_training']:.1f}x four times the steady training")
    return {"walls": walls, "steady_training_seconds": training, "medians": med, "ratios": ratios}


def _rounds() -> int:
    """W1's rounds, from its scenario file."""
    from omegaconf import OmegaConf

    return int(OmegaConf.load(SCENARIOS / "w1.yaml").execution.rounds)
