"""The built-in aggregation rules (``algorithm.aggregator``), each declared once: its name, its
function, the keys of :class:`~raysim.algorithms.keys.AggregatorKeys` it reads (as its keyword
arguments), what its inputs must allow and its line in ``raysim list``. The keys' applicability,
the scenario's checks, the server's aggregation step and ``raysim list`` all derive from here.

Torch-free: the functions are named as ``package.module:function`` and imported by the server step.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AggregatorRule:
    """One built-in aggregation rule.

    ``params``: {the function's keyword argument: the AggregatorKeys key that sets it}.
    ``compares``: it returns one of its inputs as it is (median, trimmed mean, geometric median),
    so a step needs two inputs or more. ``takes_f``: it guards against f Byzantine inputs (the
    Krum family: keys byzantine_f, and a step needs three inputs or more; its f is capped where
    a step has too few, :func:`raysim.robust_f.capped_f`)."""

    name: str
    function: str
    doc: str
    params: dict = field(default_factory=dict)
    compares: bool = False
    takes_f: bool = False

    @property
    def least_inputs(self) -> int:
        """The fewest inputs a full step must hand this rule (0: any)."""
        return 3 if self.takes_f else 2 if self.compares else 0

    @property
    def keys(self) -> tuple:
        """The AggregatorKeys keys this rule reads."""
        return (*self.params.values(), *["byzantine_f"] * self.takes_f)


FUNCTIONS = "raysim.algorithms.aggregation_rules"  # the module of the built-in rules' functions

RULES = {rule.name: rule for rule in (
    AggregatorRule("mean", f"{FUNCTIONS}:mean", "weighted mean of the updates (FedAvg)"),
    AggregatorRule("median", f"{FUNCTIONS}:median", "coordinate-wise median (Yin et al. 2018)", compares=True),
    AggregatorRule("trimmed_mean", f"{FUNCTIONS}:trimmed_mean", "coordinate-wise mean without the trim·n largest and "
                   "smallest values (Yin et al. 2018); key trim", {"trim": "trim"}, compares=True),
    AggregatorRule("krum", f"{FUNCTIONS}:krum", "the update closest to its n - f - 2 nearest neighbours "
                   "(Blanchard et al. 2017); key byzantine_f", takes_f=True),
    AggregatorRule("multi_krum", f"{FUNCTIONS}:multi_krum", "mean of the m updates with the best Krum scores "
                   "(Blanchard et al. 2017); keys byzantine_f, krum_m", {"m": "krum_m"}, takes_f=True),
    AggregatorRule("geometric_median", f"{FUNCTIONS}:geometric_median", "smoothed Weiszfeld geometric median, "
                   "RFA (Pillutla et al. 2022); keys gm_nu, gm_iterations",
                   {"nu": "gm_nu", "iterations": "gm_iterations"}, compares=True),
    AggregatorRule("centered_clipping", f"{FUNCTIONS}:centered_clipping", "clipped steps around the previous "
                   "aggregate (Karimireddy et al. 2021); keys clip_radius, clip_iterations",
                   {"radius": "clip_radius", "iterations": "clip_iterations"}),
    AggregatorRule("bulyan", f"{FUNCTIONS}:bulyan", "Krum selection, then a coordinate-wise trimmed mean "
                   "around the median (El Mhamdi et al. 2018); key byzantine_f", takes_f=True),
)}
AGGREGATOR_DOCS = {name: rule.doc for name, rule in RULES.items()}  # raysim list


def using(key: str) -> tuple:
    """The names of the rules that read the AggregatorKeys key ``key``."""
    return tuple(name for name, rule in RULES.items() if key in rule.keys)
