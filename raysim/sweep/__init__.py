"""``raysim sweep``: every point of a grid of scenario keys as a full run, then one table and plots.

    sweep = plan_sweep("scenarios/quickstart.yaml", ["runtime.num_actors=1,2"], ["execution.rounds=5"])
    run_sweep(sweep)  # <out>/<point>/ per run, <out>/sweep.parquet, <out>/*.png

:func:`plan_sweep` validates every point before anything runs (:mod:`raysim.sweep.plan`);
:func:`run_sweep` runs those not completed yet, each in a fresh process (or in this one), and
writes the results (:mod:`raysim.sweep.runner`, :mod:`raysim.sweep.results`,
:mod:`raysim.sweep.plots`). ``raysim tune`` samples configurations instead, as Ray Tune trials
with ASHA early stopping: :mod:`raysim.sweep.search_plan` validates a search without Ray,
:mod:`raysim.sweep.search` runs it (imported on its own: it imports Ray Tune).
"""

from raysim.sweep.plan import Point, Sweep, plan_sweep, read_scenario
from raysim.sweep.runner import run_sweep

__all__ = ["Point", "Sweep", "plan_sweep", "read_scenario", "run_sweep"]
