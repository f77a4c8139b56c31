"""Client selection: power-of-choice with d = k is uniform sampling draw for draw and otherwise keeps
the highest reported losses, Oort's score is the paper's formula on a hand-made history,
importance sampling's aggregate is unbiased, every policy resumes and runs alike on any backend,
and bad input is one line."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import small_scenario

import raysim
from raysim.cli import main
from raysim.engine.selection import Selection, oort_scores
from raysim.scenario.schema import SelectionConfig

SEL = "execution.selection"


def _events(result):
    return pq.read_table(f"{result.output_dir}/events.parquet").to_pandas()


def test_power_of_choice_with_d_equal_to_k_draws_what_uniform_draws(tmp_path):
    uniform = raysim.run(small_scenario(tmp_path / "u", "execution.rounds=4"))
    choice = raysim.run(small_scenario(tmp_path / "p", "execution.rounds=4", f"{SEL}.kind=power_of_choice",
                                       f"{SEL}.candidates=12"))
    a, b = _events(uniform), _events(choice)
    assert a[["round", "client_id"]].equals(b[["round", "client_id"]])
    assert uniform.summary["model_sha256"] == choice.summary["model_sha256"]


def test_power_of_choice_keeps_the_highest_reported_losses_and_tries_unseen_clients_first():
    cfg = SimpleNamespace(seed=0, execution=SimpleNamespace(selection=SelectionConfig(kind="power_of_choice",
                                                                                      candidates=6)))
    policy = Selection(cfg, np.full(10, 50), uniform=True)
    state = policy.observe(policy.init(), np.array([1, 2, 3, 4]), np.array([0.5, 2.0, 0.1, 2.0]), np.ones(4),
                           np.empty(0, dtype=np.int64), np.empty(0))
    candidates = np.array([1, 2, 3, 4, 7, 9])
    chosen, _ = policy.choose(state, lambda n: candidates[:n], None, 3, counter=5)
    assert chosen.tolist() == [2, 7, 9]  # 7 and 9 never reported (+∞); then of 2 and 4 (both 2.0), the lower id
    chosen, _ = policy.choose(state, lambda n: candidates[:n], None, 4, counter=5)
    assert chosen.tolist() == [2, 4, 7, 9]


def test_oort_scores_are_the_papers_utility_with_staleness_and_the_speed_penalty():
    rewards = np.array([10.0, 40.0, 20.0, 80.0])
    durations = np.array([5.0, 5.0, 20.0, 5.0])
    last = np.array([1, 3, 2, 4])
    scores = oort_scores(rewards, durations, last, selection_round=5, preferred=10.0, penalty=2.0, clip_bound=0.9)
    # by hand: clipped at the 0.9 quantile (sorted[3] = 80: nothing clipped), scaled above 0.999·10 over
    # (80 − 9.99); the bonus sqrt(0.1 ln 5 / L); client 2 slower than T = 10: times (10 / 20)²
    low, spread = 9.99, 80 - 9.99
    expected = (rewards - low) / spread + np.sqrt(0.1 * math.log(5) / last)
    expected[2] *= (10 / 20) ** 2
    np.testing.assert_allclose(scores, expected, rtol=1e-12)
    # the clip: the top reward above the 0.5 quantile counts as that quantile's
    clipped = oort_scores(rewards, durations, last, 5, math.inf, 2.0, clip_bound=0.5)
    assert clipped[3] == pytest.approx((40 - low) / (80 - low) + math.sqrt(0.1 * math.log(5) / 4))


def test_oort_explores_first_then_exploits_what_it_learned():
    cfg = SimpleNamespace(seed=0, execution=SimpleNamespace(selection=SelectionConfig(
        kind="oort", exploration=0.5, exploration_min=0.5, exploration_decay=1.0)))
    n = 40
    policy = Selection(cfg, np.full(n, 50), uniform=True)
    ids = np.arange(n)
    state = policy.init()
    chosen, state = policy.choose(state, lambda k: ids[:k], lambda: ids, 10, counter=0)  # round 1: uniform
    assert chosen.tolist() == list(range(10))
    # clients 0-9 report; 0-4 with a high loss
    losses = np.where(np.arange(10) < 5, 3.0, 0.1)
    state = policy.observe(state, chosen, losses, np.ones(10), np.empty(0, dtype=np.int64), np.empty(0))
    chosen, state = policy.choose(state, None, lambda: ids, 10, counter=1)
    exploited = set(state["exploited"])
    assert len(exploited) == 5 and exploited <= set(range(10))  # half exploits what it has seen
    assert len(set(chosen.tolist()) - set(range(10))) == 5  # half explores clients never selected
    assert state["round"] == 2 and state["epsilon"] == 0.5


def test_importance_sampling_by_data_size_is_unbiased():
    rng = np.random.default_rng(0)
    n, k = 30, 6
    sizes = rng.integers(5, 200, n)
    target = sizes / sizes.sum()
    cfg = SimpleNamespace(seed=0, execution=SimpleNamespace(selection=SelectionConfig(kind="importance")))
    policy = Selection(cfg, sizes, uniform=False)
    assert np.array_equal(policy.target, target)
    updates = rng.standard_normal((n, 3))
    ids = np.arange(n)
    draws = 20000
    total = np.zeros(3)
    counts = np.zeros(n)
    for counter in range(draws):
        chosen, _ = policy.choose({}, None, lambda: ids, k, counter)
        total += policy.weights(chosen, k) @ updates[chosen]
        counts[chosen] += 1
    expected = target @ updates
    chance = np.minimum(1, k * target)
    np.testing.assert_allclose(counts / draws, chance, atol=4 * np.sqrt(chance * (1 - chance) / draws).max() + 1e-9)
    # the mean of the estimates converges to Σ p_k Δ_k; its standard error from the per-draw variance
    spread = np.sqrt(((np.minimum(1, k * target) ** -1 - 1) * target ** 2) @ updates ** 2 / draws)
    np.testing.assert_array_less(np.abs(total / draws - expected), 4 * spread)
    assert np.abs(total / draws - expected).max() > 0  # the draws are random


@pytest.mark.parametrize("kind", ["power_of_choice", "oort", "importance"])
def test_a_policy_learns_only_from_what_the_server_saw_and_runs_to_the_end(tmp_path, kind):
    extra = ["execution.deadline=8", "system.compute.kind=lognormal", "system.compute.seconds_per_sample=0.05"]
    if kind == "importance":
        extra = []
    result = raysim.run(small_scenario(tmp_path, f"{SEL}.kind={kind}", "execution.rounds=6", *extra))
    events = _events(result)
    assert result.summary["status"] == "completed" and (events.groupby("round").size() > 0).all()
    described = result.summary["selection"]
    assert described["kind"] == kind
    if kind != "importance":  # what it learned: every client that uploaded (or, for Oort, was late)
        reported = events[events.status.isin(["applied", "late"] if kind == "oort" else ["applied"])]
        assert described["clients_seen"] == reported.client_id.nunique()
    if kind == "importance":  # a Poisson-like round: its size varies around clients_per_round
        assert events.groupby("round").size().nunique() > 1


@pytest.mark.parametrize("overrides, line", [
    ([f"{SEL}.kind=best"], f"{SEL}.kind = 'best': expected one of importance, oort, power_of_choice, uniform"),
    ([f"{SEL}.kind=power_of_choice", f"{SEL}.candidates=5"],
     f"{SEL}.candidates = 5: expected at least the clients a round samples, 20"),
    ([f"{SEL}.kind=oort", f"{SEL}.exploration=1.5"], f"{SEL}.exploration = 1.5: expected a number in [0, 1]"),
    ([f"{SEL}.kind=oort", f"{SEL}.exploration=0.2"],
     f"{SEL}.exploration_min = 0.3: expected at most {SEL}.exploration = 0.2"),
    ([f"{SEL}.candidates=30"], f"{SEL}.candidates = 30: expected no setting"),
    ([f"{SEL}.kind=importance", "system.availability.kind=bernoulli", "system.availability.p=0.5"],
     "system.availability.kind = 'bernoulli': expected always with execution.selection.kind=importance"),
    ([f"{SEL}.kind=oort", "execution.sampling=poisson"],
     "execution.sampling = 'poisson': expected uniform with execution.selection.kind=oort"),
])
def test_bad_selection_input_is_one_line(capsys, overrides, line):
    assert main(["validate", "scenarios/quickstart.yaml", "runtime.backend=local", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {line}"), err
