"""Privacy accounting with Google's dp-accounting, fed the DP events a run really produces.

Which events, by the participation law (:func:`participation_law`):

- synchronous rounds that sample ``clients_per_round`` of N clients uniformly (everyone always
  available, no deadline, no over-selection, no failures): each round is sampling without
  replacement of a Gaussian mechanism (replace-one adjacency: the sum moves by at most 2S, so the
  Gaussian's multiplier is z/2), composed over the rounds;
- ``execution.sampling: poisson``: each round is Poisson subsampling with probability q =
  clients_per_round / N of the Gaussian mechanism (add/remove adjacency, multiplier z);
- any other law (availability, deadlines, over-selection, failures, asynchronous steps), and
  local DP: no amplification by sampling is claimed; each client's ε composes the Gaussian
  mechanism over the server steps it actually took part in (central: multiplier z, add/remove,
  k of its updates in one FedBuff buffer moving the sum by k·S, so k² times; local: z/2 per
  upload, any two updates of one client differ by at most 2S), and the run's ε is the largest
  client's;
- DP-FTRL: everything released is a function of the tree nodes' noisy sums, each node's noise of
  std z·S; a client's sensitivity over them is S·√(Σ over the released nodes of its
  participations under the node, squared) (:func:`tree_exposure`), so its ε is one Gaussian
  mechanism's of multiplier z/√that; the run's ε is the largest client's.

The PLD accountant discretizes the privacy loss at :data:`PLD_DISCRETIZATION` (pessimistically:
a valid upper bound, a few 0.01% above the exact value, and ten times cheaper than the library's
default of 1e-4).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from raysim.errors import ScenarioError
from raysim.privacy.config import count_noise, delta_of, expected_participants

PLD_DISCRETIZATION = 1e-3
MAX_NOISE_MULTIPLIER = 1e4  # a target_epsilon that needs more noise than this is refused as unreachable
MIN_NOISE_MULTIPLIER = 1e-2  # the least noise calibration tries (a target that allows less gets this)


@dataclass(frozen=True)
class Law:
    """How the run's participants are drawn, as far as privacy is concerned: ``kind`` is
    ``fixed_size`` (uniform without replacement), ``poisson``, ``none`` (no amplification by
    sampling is claimed) or ``tree`` (DP-FTRL: none claimed either), ``why`` says it in words for
    the summary."""

    kind: str
    why: str


def participation_law(cfg, num_clients: int) -> Law:
    """The participation law of scenario ``cfg`` with ``num_clients`` clients (see the module docstring)."""
    ex, system = cfg.execution, cfg.system
    if cfg.privacy.mechanism == "local":
        return Law("none", "local DP: each client's own reports compose, without amplification by sampling")
    if cfg.privacy.mechanism == "dp_ftrl":
        every = cfg.privacy.tree_restart_every
        trees = f"a new tree every {every} steps" if every else "one tree"
        return Law("tree", "DP-FTRL: no amplification by sampling; each client's exposure is the tree nodes its "
                           f"participations reach ({trees})")
    if ex.mode == "async":
        return Law("none", f"asynchronous ({ex.aggregation}): the virtual clock, not a sampling law, chooses who "
                           "takes part")
    blockers = [(system.availability.kind != "always", f"system.availability.kind={system.availability.kind}"),
                (ex.deadline is not None, f"execution.deadline={ex.deadline:g}" if ex.deadline is not None else ""),
                (ex.over_selection > 1, f"execution.over_selection={ex.over_selection:g}"),
                (system.dropout > 0, f"system.dropout={system.dropout:g}")]
    found = [why for blocks, why in blockers if blocks]
    if found:
        return Law("none", f"{', '.join(found)}: who takes part depends on more than a sampling law")
    if ex.sampling == "poisson":
        return Law("poisson", f"Poisson sampling, q = {ex.clients_per_round} / {num_clients}")
    return Law("fixed_size", f"{ex.clients_per_round} of {num_clients} clients uniformly without replacement")


def accountant_kind(privacy, law: Law) -> str:
    """``privacy.accountant`` resolved: ``auto`` is rdp for fixed-size sampling (dp-accounting's PLD
    accountant cannot compose sampling without replacement), else pld."""
    if privacy.accountant != "auto":
        return privacy.accountant
    return "rdp" if law.kind == "fixed_size" else "pld"


class Accountant:
    """The privacy a run spends: :meth:`epsilon` after some server steps, :meth:`client_epsilons`
    per client, :meth:`describe` for the summary. ``noise_multiplier``: z (resolved: the key's
    value, or the one calibrated to ``target_epsilon``)."""

    def __init__(self, cfg, num_clients: int, noise_multiplier: float):
        self.cfg, self.num_clients, self.z = cfg, num_clients, float(noise_multiplier)
        self.law = participation_law(cfg, num_clients)
        self.kind = accountant_kind(cfg.privacy, self.law)
        self.delta = delta_of(cfg.privacy, num_clients)

    @functools.cached_property
    def dp(self):
        """dp-accounting, imported on first use (0.9 s: not at the scheduler's start, but when ε is first wanted)."""
        import dp_accounting

        return dp_accounting

    @property
    def relation(self):
        rel = self.dp.NeighboringRelation
        return rel.REPLACE_ONE if self.law.kind == "fixed_size" else rel.ADD_OR_REMOVE_ONE

    def fresh(self):
        """A new dp-accounting accountant of the run's kind and neighbouring relation."""
        if self.kind == "pld":
            from dp_accounting import pld

            return pld.PLDAccountant(self.relation, value_discretization_interval=PLD_DISCRETIZATION)
        from dp_accounting import rdp

        return rdp.RdpAccountant(neighboring_relation=self.relation)

    def step_event(self, z: float | None = None):
        """The DP event of one server step for the run's law (amplified laws only), at multiplier ``z``."""
        dp, z = self.dp, self.z if z is None else z
        ex = self.cfg.execution
        if self.law.kind == "fixed_size":
            gaussian = dp.GaussianDpEvent(z / 2)  # replace-one: the sum moves by up to 2S
            return dp.SampledWithoutReplacementDpEvent(self.num_clients, ex.clients_per_round, gaussian)
        return dp.PoissonSampledDpEvent(ex.clients_per_round / self.num_clients, dp.GaussianDpEvent(z))

    def participation_event(self, z: float | None = None):
        """The DP event of one participation of one client, without amplification, at multiplier ``z``."""
        z = self.z if z is None else z
        return self.dp.GaussianDpEvent(z / 2 if self.cfg.privacy.mechanism == "local" else z)

    @property
    def amplified(self) -> bool:
        return self.law.kind in ("fixed_size", "poisson")

    def exposure(self, taken, steps: int) -> float:
        """A client's exposure after ``steps`` server steps, from its ledger entry ``taken``
        (:class:`~raysim.pipeline.privacy.ParticipationLedger`): the Gaussian mechanisms of
        multiplier z (local DP: z/2) its ε composes, i.e. its squared sensitivity in units of
        clip_norm² (local: of (2·clip_norm)²). Central: the sum over steps of its updates in the
        step, squared; local: its uploads; DP-FTRL (``taken``: the model versions of its steps): the
        sum over the released tree nodes of the square of its participations under each
        (:func:`tree_exposure`)."""
        if self.law.kind == "tree":
            return float(tree_exposure(taken, self.cfg.privacy.tree_restart_every, steps))
        return float(taken[1])

    def event(self, steps: int, exposure: float, z: float | None = None):
        """The run's DP event after ``steps`` server steps for a client of ``exposure`` (un-amplified
        laws: that client's): amplified, every step's sampled Gaussian; DP-FTRL, one Gaussian of
        multiplier z/√exposure over the released tree nodes; otherwise the client's participations."""
        dp, z = self.dp, self.z if z is None else z
        if self.amplified:
            return dp.SelfComposedDpEvent(self.step_event(z), steps)
        if self.law.kind == "tree":
            return dp.GaussianDpEvent(z / math.sqrt(exposure))
        return dp.SelfComposedDpEvent(self.participation_event(z), int(exposure))

    def epsilon(self, steps: int, exposure: float) -> float:
        """ε at δ after ``steps`` server steps for the client of ``exposure`` (:meth:`exposure`; under
        an amplified law every client's is the run's)."""
        return self._epsilon(steps, 0.0 if self.amplified else float(exposure))

    @functools.lru_cache(maxsize=4096)
    def _epsilon(self, steps: int, exposure: float) -> float:
        if (steps if self.amplified else exposure) == 0:
            return 0.0
        if self.z == 0:  # no noise: no privacy
            return math.inf
        return float(self.fresh().compose(self.event(steps, exposure)).get_epsilon(self.delta))

    def client_epsilons(self, steps: int, exposures: np.ndarray) -> np.ndarray:
        """[N] each client's ε at δ from its ``exposures``: the run's ε under an amplified law (the
        bound holds for every client, whatever it drew); its own composition otherwise."""
        if self.amplified:
            return np.full(len(exposures), self.epsilon(steps, 0.0))
        values, where = np.unique(exposures, return_inverse=True)
        return np.array([self.epsilon(steps, float(e)) for e in values])[where]

    def describe(self, steps: int, participations: np.ndarray, exposures: np.ndarray) -> dict:
        """The summary's ``privacy`` section after ``steps`` server steps."""
        most = float(exposures.max(initial=0.0))
        p = self.cfg.privacy
        return {"mechanism": p.mechanism, "clip_norm": p.clip_norm, "noise_multiplier": self.z,
                "target_epsilon": p.target_epsilon, "delta": self.delta, "final_epsilon": self.epsilon(steps, most),
                "accountant": self.kind, "neighboring_relation": self.relation.name.lower(),
                "amplification": self.law.kind if self.amplified else "none", "participation_law": self.law.why,
                "events": repr(self.event(steps, most)) if most or self.amplified else "none yet",
                "max_client_participations": int(participations.max(initial=0)),
                "assumptions": ASSUMPTIONS[self.law.kind if self.law.kind != "none" else p.mechanism]}


ASSUMPTIONS = {
    "fixed_size": "the server's uniform sample is secret and independent of the data; the clipped sum's "
                  "replace-one sensitivity is 2·clip_norm; N is public",
    "poisson": "each client's coin is secret and independent of the data; the clipped sum's add/remove "
               "sensitivity is clip_norm",
    "central": "no amplification by sampling claimed: each client's ε composes the Gaussian mechanism (add/remove "
               "sensitivity clip_norm) over the server steps it took part in, k of its updates in one step k² "
               "times; the run's ε is the largest",
    "local": "each client's reports are public: its ε composes the Gaussian mechanism (sensitivity 2·clip_norm) "
             "over its own uploads, without amplification; the run's ε is the largest",
    "tree": "no amplification by sampling claimed: every released tree node's noisy sum is public; a client's "
            "sensitivity over them is clip_norm·√(Σ over nodes of its participations under the node, squared); "
            "the run's ε is the largest",
}


def tree_nodes(position: int) -> set:
    """The nodes (level, index) of an aggregation tree whose sums add up to the prefix sum of its
    leaves 1 … ``position``: one per set bit of ``position`` (node (l, k) covers leaves
    k·2^l + 1 … (k + 1)·2^l)."""
    nodes, start = set(), 0
    for level in reversed(range(position.bit_length())):
        if position >> level & 1:
            nodes.add((level, start >> level))
            start += 1 << level
    return nodes


def tree_leaf(version: int, restart_every: int | None) -> tuple[int, int]:
    """(tree, leaf) of the server step from model ``version``: leaves count from 1 in each tree."""
    tree, position = divmod(version, restart_every) if restart_every else (0, version)
    return tree, position + 1


def tree_exposure(versions, restart_every: int | None, steps: int) -> int:
    """Σ over the tree nodes released in ``steps`` server steps (those the prefix sums use: node
    (l, k) with k even, complete) of the square of the participations (model ``versions``) under
    each: a client's squared sensitivity over everything DP-FTRL releases, in units of clip_norm²."""
    under = {}
    for version in versions:
        tree, leaf = tree_leaf(version, restart_every)
        grown = min(restart_every, steps - tree * restart_every) if restart_every else steps  # the tree's leaves
        for level in range(grown.bit_length()):
            index = (leaf - 1) >> level
            if index % 2 == 0 and (index + 1) << level <= grown:
                under[tree, level, index] = under.get((tree, level, index), 0) + 1
    return sum(count * count for count in under.values())


def planned_noise_multiplier(cfg, num_clients: int) -> float:
    """z: ``privacy.noise_multiplier``, or the smallest z with which the planned run spends at most
    ``privacy.target_epsilon`` at δ (dp-accounting's calibration; the planned run: every round, and
    without amplification a client that takes part in every one of them). ScenarioError when no
    z up to :data:`MAX_NOISE_MULTIPLIER` reaches it."""
    p = cfg.privacy
    if p.target_epsilon is None:
        return float(p.noise_multiplier)
    accountant = Accountant(cfg, num_clients, 1.0)
    rounds = cfg.execution.rounds
    make = lambda z: accountant.event(rounds, rounds, z)
    spends = lambda z: accountant.fresh().compose(make(z)).get_epsilon(accountant.delta)
    low = high = 1.0  # a bracket of z by doubling or halving (dp-accounting's own search starts at z = 0)
    while spends(high) > p.target_epsilon:
        if high >= MAX_NOISE_MULTIPLIER:
            raise ScenarioError("privacy.target_epsilon", p.target_epsilon,
                                f"an ε reachable in {rounds} rounds: even noise_multiplier {MAX_NOISE_MULTIPLIER:g} "
                                f"spends {spends(high):.3g} at δ = {accountant.delta:.3g} ({accountant.law.why})")
        low, high = high, min(2 * high, MAX_NOISE_MULTIPLIER)
    while low == high or spends(low) <= p.target_epsilon:  # z = 1 meets the target already: less noise
        if low <= MIN_NOISE_MULTIPLIER:
            return low  # the target allows hardly any noise: the least z tried
        low, high = low / 2, low
    return float(accountant.dp.calibrate_dp_mechanism(accountant.fresh, make, p.target_epsilon, accountant.delta,
                                                      accountant.dp.ExplicitBracketInterval(low, high)))


def plan_line(cfg, num_clients: int) -> str:
    """``raysim validate``'s line on privacy: z (and what it was calibrated to), δ, the accountant,
    the participation law, and the ε the planned run spends."""
    p = cfg.privacy
    accountant = Accountant(cfg, num_clients, p.noise_multiplier)
    rounds = cfg.execution.rounds
    worst = "" if accountant.amplified else " (a client in every round)"
    planned = (f"planned ε = {accountant.epsilon(rounds, rounds):.4g} after {rounds} rounds{worst}"
               if cfg.execution.mode == "sync" and accountant.law.kind != "tree"
               else "ε: from each client's actual participations, reported as the run goes")
    calibrated = f" (calibrated to target_epsilon {p.target_epsilon:g})" if p.target_epsilon is not None else ""
    name = {"central": "central DP", "local": "local DP", "dp_ftrl": "DP-FTRL"}[p.mechanism]
    return (f"privacy: {name}, clip_norm {p.clip_norm:g}, noise_multiplier {float(p.noise_multiplier)!r}"
            f"{calibrated}; δ = {accountant.delta:.3g}, accountant {accountant.kind}; {accountant.law.why}; "
            f"{planned}")


def check_count_noise(cfg, z: float) -> None:
    """Adaptive clipping splits the noise of multiplier ``z`` between the update and the count
    (:func:`~raysim.privacy.config.update_noise_multiplier`), which needs 2σ_b > z: ScenarioError otherwise."""
    p = cfg.privacy
    if p.mechanism != "central" or cfg.execution.mode != "sync" or p.adaptive_clip.target_quantile is None:
        return
    sigma_b = count_noise(p, expected_participants(cfg))
    if z > 0 and 2 * sigma_b <= z:
        raise ScenarioError("privacy.adaptive_clip.count_noise", p.adaptive_clip.count_noise,
                            f"a std σ_b > z/2 = {z / 2:.4g} (here σ_b = {sigma_b:.4g}): the count's noise and the "
                            f"update's together spend what noise_multiplier {z:.4g} alone would, so the count's "
                            "alone must spend less")


def check_delta(cfg, num_clients: int) -> str | None:
    """A warning line when δ is not below 1/N (the usual rule: δ ≪ 1/N, else the mechanism may
    reveal some client's data whole and still meet (ε, δ)); None otherwise."""
    delta = delta_of(cfg.privacy, num_clients)
    if cfg.privacy.mechanism == "none" or delta < 1.0 / num_clients:
        return None
    return (f"warning: privacy.delta = {delta:g} is not below 1/N = {1.0 / num_clients:g} ({num_clients} clients): the "
            "usual rule is δ well below 1/N, since an (ε, δ) guarantee with δ ≥ 1/N allows revealing one client's "
            "data whole")
