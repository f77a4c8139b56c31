"""Client selection (``execution.selection``): which clients a synchronous round samples, from what a
real server knows — the losses clients reported, the durations it observed, who is available — and,
for importance sampling, the aggregation weights that keep the round's update unbiased.

A policy is a pure ``(init, choose, observe)`` triple over plain content, like a pipeline stage: the
state (per-client history in a :mod:`raysim.pipeline.per_client` tree, and the policy's own numbers)
lives in the run state, so a resumed run selects the same clients; its random draws come from the
stream ``(seed, SELECTION, counter)``.

* ``uniform``: the scheduler's uniform sample of the available clients.
* ``power_of_choice``: rpow-d of Cho, Wang, Joshi ("Client Selection in Federated Learning:
  Convergence Analysis and Power-of-Choice Selection Strategies", 2020): d candidates drawn as
  ``uniform`` draws them, then the k with the highest loss each last reported (a client never
  seen counts as +∞; ties: the lower id). With d = k it is ``uniform``, draw for draw.
* ``oort``: Oort (Lai, Zhu, Madhyastha, Chowdhury, "Oort: Efficient Federated Learning via Guided
  Participant Selection", 2021) as FedScale implements it (:func:`oort_scores`, :class:`Oort`).
* ``importance``: each available client independently with probability π_k = min(1, K·p_k), p_k
  its share of the aggregation (data size, or 1/N), aggregated with weight p_k / π_k: the
  Horvitz–Thompson estimator, whose expectation is Σ_k p_k Δ_k.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from raysim.pipeline import per_client
from raysim.streams import Purpose, stream

EXPLORE_POOL = 10  # Oort draws its exploited clients from at least this many times as many top scorers
SAMPLE_WINDOW = 5.0  # Oort draws unexplored clients from the SAMPLE_WINDOW·n' with the most data


def oort_scores(rewards: np.ndarray, durations: np.ndarray, last_round: np.ndarray, selection_round: int,
                preferred: float, penalty: float, clip_bound: float) -> np.ndarray:
    """Oort's score of explored clients (FedScale's ``get_norm`` and score): the statistical utility
    clipped at its ``clip_bound`` quantile and scaled to [0, 1] (above 0.999·min), plus the staleness
    bonus sqrt(0.1·ln R / L), L the round of the client's last upload; times (T / t)^α for a client
    whose duration t exceeds the preferred duration T."""
    n = len(rewards)
    clip = np.sort(rewards)[min(int(n * clip_bound), n - 1)]
    low = 0.999 * rewards.min()
    spread = max(rewards.max() - low, 1e-4)
    score = (np.minimum(rewards, clip) - low) / spread
    score = score + np.sqrt(0.1 * math.log(selection_round) / np.maximum(last_round, 1))
    slow = durations > preferred
    return np.where(slow, score * (preferred / np.where(slow, durations, 1.0)) ** penalty, score)


def shares(sizes: np.ndarray, uniform: bool) -> np.ndarray:
    """Aggregation shares p_k (summing to 1) of clients with ``sizes`` training rows: ∝ the rows, or 1/n."""
    if uniform:
        return np.full(len(sizes), 1.0 / len(sizes))
    return sizes / sizes.sum()


def _draw(rng: np.random.Generator, ids: np.ndarray, weights: np.ndarray, count: int) -> np.ndarray:
    """``count`` of ``ids`` drawn without replacement with probabilities ∝ ``weights`` (uniformly if
    they are all 0)."""
    if count <= 0 or not len(ids):
        return np.empty(0, dtype=np.int64)
    weights = np.maximum(weights, 0.0)
    p = weights / weights.sum() if weights.sum() > 0 else None
    return rng.choice(ids, size=min(count, len(ids)), replace=False, p=p)


class Selection:
    """The selection policy of scenario ``cfg`` for ``num_clients`` clients with ``train_sizes`` rows."""

    def __init__(self, cfg, train_sizes: np.ndarray, uniform: bool):
        self.cfg, self.kind = cfg.execution.selection, cfg.execution.selection.kind
        self.seed, self.train_sizes, self.uniform = cfg.seed, train_sizes, uniform
        self.levels = per_client.levels_for(len(train_sizes))

    @functools.cached_property
    def target(self) -> np.ndarray:
        """[N] p_k, each client's share of the aggregate the algorithm aims at (importance sampling only)."""
        return shares(self.train_sizes, self.uniform)

    def init(self) -> dict:
        """The policy's state before the first round."""
        if self.kind == "oort":
            return {"clients": {}, "round": 0, "epsilon": float(self.cfg.exploration),
                    "threshold": float(self.cfg.round_threshold), "exploit_utility": [], "exploited": []}
        return {"clients": {}} if self.kind == "power_of_choice" else {}

    def choose(self, state: dict, sample, available, k: int, counter: int) -> tuple[np.ndarray, dict]:
        """(the round's clients, sorted by id; the new state): ``sample(n)`` is the scheduler's
        uniform sample of n available clients, ``available()`` the ids of all clients available now."""
        rng = stream(self.seed, Purpose.SELECTION, counter)
        if self.kind == "power_of_choice":
            candidates = sample(self.cfg.candidates or 2 * k)
            losses = np.array([per_client.value_of(state["clients"], c, self.levels, math.inf)
                               for c in candidates.tolist()])
            order = np.lexsort((candidates, -losses))  # highest loss first, ties: the lower id
            return np.sort(candidates[order[:k]]), state
        if self.kind == "importance":
            ids = available()
            chance = np.minimum(1.0, k * self.target[ids])
            return ids[rng.random(len(ids)) < chance], state
        if self.kind == "oort":
            return self._oort(state, sample, available, k, rng)
        return sample(k), state

    def weights(self, client_ids: np.ndarray, k: int) -> np.ndarray | None:
        """Importance sampling's aggregation weights p / π of ``client_ids`` (None: the algorithm's)."""
        if self.kind != "importance":
            return None
        return self.target[client_ids] / np.minimum(1.0, k * self.target[client_ids])

    def observe(self, state: dict, reported: np.ndarray, losses: np.ndarray, durations: np.ndarray,
                late: np.ndarray, late_durations: np.ndarray) -> dict:
        """The state after a round whose ``reported`` clients uploaded ``losses`` after ``durations``
        virtual seconds, and whose ``late`` clients took ``late_durations`` (their updates discarded)."""
        if self.kind == "power_of_choice":
            moved = dict(zip(reported.tolist(), losses.tolist()))
            return {"clients": per_client.updated(state["clients"], moved, self.levels)}
        if self.kind != "oort":
            return state
        now, moved = state["round"], {}
        rewards = self.train_sizes[reported] * losses  # |B|·(mean reported loss)
        for c, reward, duration in zip(reported.tolist(), rewards.tolist(), durations.tolist()):
            count = per_client.value_of(state["clients"], c, self.levels, (0.0, 0.0, 0, 0))[3]
            moved[c] = (reward, duration, now, count + 1)
        mean_reward = float(rewards.mean()) if len(rewards) else 0.0
        for c, duration in zip(late.tolist(), late_durations.tolist()):  # stragglers: the round's mean utility
            reward, _, _, count = per_client.value_of(state["clients"], c, self.levels, (mean_reward, 0.0, 0, 0))
            moved[c] = (reward, duration, now, count + 1)
        exploited = set(state["exploited"]) & set(reported.tolist())
        utility = [moved[c][0] for c in sorted(exploited)]
        return {**state, "clients": per_client.updated(state["clients"], moved, self.levels),
                "exploit_utility": [*state["exploit_utility"], float(np.mean(utility)) if utility else 0.0]}

    def describe(self, state: dict) -> dict:
        """The summary's ``selection``: the policy, the clients it has met, and Oort's exploration
        share and the percentile of the observed durations that its preferred duration now is."""
        out = {"kind": self.kind}
        if "clients" in state:
            out["clients_seen"] = sum(1 for _ in per_client.items(state["clients"], self.levels))
        if self.kind == "oort":
            out.update(epsilon=state["epsilon"], duration_percentile=state["threshold"], rounds=state["round"])
        return out

    def _oort(self, state: dict, sample, available, k: int, rng) -> tuple[np.ndarray, dict]:
        cfg, state = self.cfg, {**state, "round": state["round"] + 1}
        if state["round"] == 1:  # nothing known yet: uniform
            return sample(k), {**state, "exploited": []}
        ids = available()  # sorted; the clients met so far are walked once (not every available client looked up)
        met = list(per_client.items(state["clients"], self.levels))
        met_ids = np.array([c for c, _ in met], dtype=np.int64)
        met_history = np.array([v for _, v in met], dtype=np.float64).reshape(-1, 4)
        seen = np.isin(met_ids, ids)
        explored, history, fresh = met_ids[seen], met_history[seen], np.setdiff1d(ids, met_ids)
        threshold = self._pace(state)
        everyone = met_history[:, 1]
        preferred = (math.inf if threshold >= 100 or not len(everyone)
                     else float(np.sort(everyone)[min(int(len(everyone) * threshold / 100), len(everyone) - 1)]))
        epsilon = max(state["epsilon"] * cfg.exploration_decay, cfg.exploration_min)
        scored = history[:, 0] > 0
        exploit_n = min(k - int(k * epsilon), int(scored.sum()))
        exploit = np.empty(0, dtype=np.int64)
        if exploit_n > 0:
            candidates, rows = explored[scored], history[scored]
            score = oort_scores(rows[:, 0], rows[:, 1], rows[:, 2], state["round"], preferred, cfg.round_penalty,
                                cfg.clip_bound)
            order = np.lexsort((candidates, -score))
            cut = score[order[min(exploit_n, len(order) - 1)]] * cfg.cut_off
            pool = max(EXPLORE_POOL * exploit_n, int((score >= cut).sum()))
            top = order[:pool]
            exploit = _draw(rng, candidates[top], score[top], exploit_n)
        explore_n = min(len(fresh), k - len(exploit))
        weights = self.train_sizes[fresh].astype(np.float64)
        window = np.lexsort((fresh, -weights))[:max(explore_n, int(SAMPLE_WINDOW * explore_n))]
        explore = _draw(rng, fresh[window], weights[window], explore_n)
        chosen = np.concatenate([exploit, explore])
        short = k - len(chosen)
        if short > 0:  # too few unexplored clients: the rest uniformly among the others available
            rest = np.setdiff1d(ids, chosen)
            chosen = np.concatenate([chosen, _draw(rng, rest, np.ones(len(rest)), short)])
        state = {**state, "epsilon": epsilon, "threshold": threshold, "exploited": sorted(exploit.tolist())}
        return np.sort(chosen.astype(np.int64)), state

    def _pace(self, state: dict) -> float:
        """Oort's pacer: every W rounds (from 2W on), compare the exploited clients' utility summed over
        the last W rounds with the W before: flat (within 10%) moves T's percentile up by
        ``pacer_delta``; a sharp change (over 5×) moves it down."""
        cfg, threshold, history = self.cfg, state["threshold"], state["exploit_utility"]
        w, now = cfg.pacer_step, state["round"]
        if now >= 2 * w and now % w == 0 and len(history) >= 2 * w:
            before, last = sum(history[-2 * w:-w]), sum(history[-w:])
            if abs(last - before) <= 0.1 * before:
                return min(100.0, threshold + cfg.pacer_delta)
            if abs(last - before) >= 5 * before:
                return max(cfg.pacer_delta, threshold - cfg.pacer_delta)
        return threshold
