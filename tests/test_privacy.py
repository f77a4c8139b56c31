"""Differential privacy: the ε a run reports is dp-accounting's for the events the run produced
(fixed-size sampling, Poisson sampling, each client's own participations); calibration lands
just below the target; every upload is clipped; central noise has the std it promises; adaptive
clipping finds the target quantile; bad privacy input is one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import small_scenario
from dp_accounting import pld, rdp

import raysim
from raysim.algorithms import ClientUpdates
from raysim.cli import main
from raysim.pipeline.privacy import CentralGaussianNoise, ClipUpdate
from raysim.pipeline.stage import Aggregate, ServerInput
from raysim.privacy.accounting import PLD_DISCRETIZATION
from raysim.privacy.config import AdaptiveClipConfig

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "scenarios" / "quickstart.yaml")
CENTRAL = ["privacy.mechanism=central", "privacy.clip_norm=0.5", "privacy.noise_multiplier=1.1",
           "privacy.delta=1e-4"]
REPLACE, ADD_REMOVE = dpa.NeighboringRelation.REPLACE_ONE, dpa.NeighboringRelation.ADD_OR_REMOVE_ONE


def _run(tmp_path, *overrides):
    result = raysim.run(small_scenario(tmp_path, *overrides))
    out = Path(result.output_dir)
    return (result.summary, pq.read_table(out / "rounds.parquet").to_pydict(),
            pq.read_table(out / "events.parquet").to_pandas(), pq.read_table(out / "privacy.parquet").to_pydict())


def _pld(event, relation=ADD_REMOVE, delta=1e-4) -> float:
    accountant = pld.PLDAccountant(relation, value_discretization_interval=PLD_DISCRETIZATION)
    return accountant.compose(event).get_epsilon(delta)


def test_fixed_size_sampling_spends_what_dp_accounting_computes_for_it(tmp_path):
    summary, rounds, events, ledger = _run(tmp_path, *CENTRAL, "execution.rounds=4")
    sampled = dpa.SampledWithoutReplacementDpEvent(40, 12, dpa.GaussianDpEvent(0.55))  # replace-one: z/2
    expected = [rdp.RdpAccountant(neighboring_relation=REPLACE).compose(dpa.SelfComposedDpEvent(sampled, t))
                .get_epsilon(1e-4) for t in (1, 2, 3, 4)]
    assert rounds["epsilon"] == expected  # eval.every=1: at every round
    p = summary["privacy"]
    assert p["final_epsilon"] == expected[-1] and p["accountant"] == "rdp" and p["amplification"] == "fixed_size"
    assert p["neighboring_relation"] == "replace_one" and p["noise_multiplier"] == 1.1 and p["delta"] == 1e-4
    # the ledger: every client, its participations as the events count them, the run's ε for each
    applied = events[events.status == "applied"].client_id.value_counts()
    assert ledger["client_id"] == list(range(40))
    assert ledger["participations"] == [int(applied.get(c, 0)) for c in range(40)] and sum(ledger["participations"]) == 48
    assert ledger["epsilon"] == [expected[-1]] * 40


def test_poisson_sampling_spends_what_dp_accounting_computes_and_round_sizes_vary(tmp_path):
    summary, rounds, _, _ = _run(tmp_path, *CENTRAL, "execution.sampling=poisson", "execution.rounds=12",
                                 "eval.every=4")
    event = dpa.PoissonSampledDpEvent(12 / 40, dpa.GaussianDpEvent(1.1))
    expected = {t: _pld(dpa.SelfComposedDpEvent(event, t)) for t in (4, 8, 12)}
    assert {r: e for r, e in zip(rounds["round"], rounds["epsilon"]) if e is not None} == expected
    assert summary["privacy"]["accountant"] == "pld" and summary["privacy"]["amplification"] == "poisson"
    sizes = rounds["clients"]
    assert len(set(sizes)) > 3 and abs(np.mean(sizes) - 12) < 3  # Binomial(40, 0.3): mean 12, std 2.9


@pytest.mark.parametrize("mechanism, multiplier", [("central", 1.1), ("local", 0.55)])
def test_without_amplification_each_client_composes_its_own_participations(tmp_path, mechanism, multiplier):
    overrides = [o.replace("central", mechanism) for o in CENTRAL]
    summary, rounds, events, ledger = _run(tmp_path, *overrides, "execution.rounds=5", "execution.over_selection=1.5")
    applied = events[events.status == "applied"].client_id.value_counts()
    counts = [int(applied.get(c, 0)) for c in range(40)]
    assert ledger["participations"] == counts and max(counts) >= 2
    for k, eps in zip(counts, ledger["epsilon"]):
        assert eps == (0.0 if k == 0 else _pld(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(multiplier), k)))
    p = summary["privacy"]
    assert p["amplification"] == "none" and p["final_epsilon"] == max(ledger["epsilon"])
    assert p["max_client_participations"] == max(counts)
    assert ("over_selection" in p["participation_law"]) == (mechanism == "central")


def test_target_epsilon_is_calibrated_to_land_just_below_it(tmp_path, capsys):
    summary, rounds, _, _ = _run(tmp_path, "privacy.mechanism=central", "privacy.target_epsilon=3",
                                 "execution.rounds=4")
    spent = summary["privacy"]["final_epsilon"]
    assert 0.99 * 3 <= spent <= 3 and rounds["epsilon"][-1] == spent
    assert summary["privacy"]["target_epsilon"] == 3
    assert main(["validate", QUICKSTART, "runtime.backend=local", "privacy.mechanism=central",
                 "privacy.target_epsilon=2", "privacy.delta=1e-3"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    z = float(line.split("noise_multiplier ")[1].split()[0])
    event = dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(100, 20, dpa.GaussianDpEvent(z / 2)), 30)
    assert 0.99 * 2 <= rdp.RdpAccountant(neighboring_relation=REPLACE).compose(event).get_epsilon(1e-3) <= 2
    assert "(calibrated to target_epsilon 2)" in line and "accountant rdp" in line


def test_every_upload_is_clipped_and_some_updates_needed_it(tmp_path):
    _, _, events, _ = _run(tmp_path, *CENTRAL, "execution.rounds=3", "algorithm.lr=0.5")
    applied = events[events.status == "applied"]
    assert (applied.norm_uploaded <= 0.5 * (1 + 1e-6)).all()  # float32 rounding of the scaled update
    assert (applied.norm_before_clip > 0.5).any() and (applied.clip_norm == 0.5).all()
    np.testing.assert_allclose(applied.norm_uploaded, np.minimum(applied.norm_before_clip, 0.5), rtol=1e-6)


def test_with_a_vanishing_learning_rate_the_model_moves_by_pure_noise_of_the_promised_std(tmp_path):
    still = raysim.run(small_scenario(tmp_path / "still", "algorithm.lr=1e-12", "execution.rounds=3"))
    noised = raysim.run(small_scenario(tmp_path / "noised", *CENTRAL, "algorithm.lr=1e-12", "execution.rounds=3"))
    before = torch.load(Path(still.output_dir) / "model.pt")
    after = torch.load(Path(noised.output_dir) / "model.pt")
    moved = torch.cat([(after[k] - before[k]).reshape(-1).double() for k in before])
    promised = 1.1 * 0.5 / 12 * math.sqrt(3)  # z·S / clients_per_round per round, three rounds
    assert len(moved) > 1000 and abs(moved.mean()) < 4 * promised / math.sqrt(len(moved))
    assert moved.std().item() == pytest.approx(promised, rel=0.06)


def test_adaptive_clipping_tracks_the_target_quantile_of_known_update_norms():
    rng = np.random.default_rng(0)
    adaptive = AdaptiveClipConfig(target_quantile=0.7, lr=0.2)
    clip = ClipUpdate(0.1, adaptive=True)
    server = CentralGaussianNoise(0.0, 0.1, 100, seed=0, adaptive=adaptive, count_noise=5.0)
    state = server.init()
    seen = []
    for step in range(300):  # log-normal norms: the 0.7-quantile is exp(0.5 · Φ⁻¹(0.7)) = 1.300
        norms = np.exp(0.5 * rng.standard_normal(100))
        direction = torch.from_numpy(rng.standard_normal((100, 8)))
        vector = (direction / direction.norm(dim=1, keepdim=True) * torch.from_numpy(norms)[:, None]).float()
        ids = np.arange(100)
        updates = ClientUpdates(ids, np.ones(100), np.zeros(100), vector)
        payload = server.broadcast(state)
        updates = clip.update(updates, None, [payload] * 100)
        assert (updates.vector.double().norm(dim=1) <= payload["clip_norm"] * (1 + 1e-6)).all()
        _, state = server.update(Aggregate(torch.zeros(8, dtype=torch.float64),
                                           ServerInput(updates, np.full(100, 0.01), step)), state)
        seen.append(state["clip_norm"])
    assert np.mean(seen[200:]) == pytest.approx(1.300, rel=0.05)


def test_adaptive_clipping_in_a_run_spends_the_noise_multiplier_it_was_given(tmp_path):
    summary, rounds, events, _ = _run(tmp_path, *CENTRAL, "privacy.adaptive_clip.target_quantile=0.5",
                                      "privacy.adaptive_clip.count_noise=1.0", "execution.rounds=4")
    fixed, _, _, _ = _run(tmp_path / "fixed", *CENTRAL, "execution.rounds=4")
    assert summary["privacy"]["final_epsilon"] == fixed["privacy"]["final_epsilon"]
    clip = events[events.status == "applied"].groupby("round").clip_norm.agg(["min", "max"])
    assert (clip["min"] == clip["max"]).all() and clip["min"].iloc[0] == 0.5 and clip["min"].nunique() == 4


def _one_line(capsys, *overrides) -> str:
    assert main(["validate", QUICKSTART, "runtime.backend=local", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("overrides, line", [
    (["privacy.mechanism=central", "privacy.clip_norm=0", "privacy.noise_multiplier=1"],
     "privacy.clip_norm = 0.0: expected a number > 0"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=-1"],
     "privacy.noise_multiplier = -1.0: expected a number >= 0"),
    (["privacy.mechanism=local", "privacy.noise_multiplier=1", "privacy.delta=1"],
     "privacy.delta = 1.0: expected a probability in (0, 1)"),
    (["privacy.mechanism=central", "privacy.target_epsilon=0"], "privacy.target_epsilon = 0.0: expected a number > 0"),
    (["privacy.mechanism=central", "privacy.target_epsilon=1e-9", "privacy.delta=1e-5"],
     "privacy.target_epsilon = 1e-09: expected an ε reachable in 30 rounds: even noise_multiplier 10000 spends 0.103 "
     "at δ = 1e-05 (20 of 100 clients uniformly without replacement)"),
    (["privacy.clip_norm=2"], "privacy.clip_norm = 2.0: expected no setting (it applies only with privacy.mechanism "
                              "in {central, local, dp_ftrl} (here privacy.mechanism = 'none'))"),
    (["privacy.mechanism=central"], "privacy.noise_multiplier = None: expected a number >= 0, or null with "
                                    "privacy.target_epsilon set (here target_epsilon = None): set exactly one of them"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.target_epsilon=2"],
     "privacy.noise_multiplier = 1.0: expected a number >= 0, or null with privacy.target_epsilon set"),
    (["execution.sampling=poisson", "execution.over_selection=1.5"],
     "execution.over_selection = 1.5: expected 1 with execution.sampling=poisson"),
    (["execution.mode=async", "execution.max_updates=10", "~execution.rounds", "~execution.clients_per_round",
      "execution.sampling=poisson"], "execution.sampling = 'poisson': expected no setting (it applies only with "
                                     "execution.mode = sync (here execution.mode = 'async'))"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=1", "algorithm.aggregator=median"],
     "algorithm.aggregator = 'median': expected mean with privacy.mechanism=central"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=1", "algorithm.name=scaffold", "~algorithm.batch_size",
      "~algorithm.local_epochs", "algorithm.local_steps=5"],
     "algorithm.name = 'scaffold': expected an algorithm whose clients upload only their update"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.accountant=pld"],
     "privacy.accountant = 'pld': expected rdp or auto with uniform fixed-size sampling"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.adaptive_clip.target_quantile=1.5"],
     "privacy.adaptive_clip.target_quantile = 1.5: expected a probability in (0, 1)"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.adaptive_clip.target_quantile=0.5",
      "privacy.adaptive_clip.lr=-1"], "privacy.adaptive_clip.lr = -1.0: expected a number > 0"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=2", "privacy.adaptive_clip.target_quantile=0.5",
      "privacy.adaptive_clip.count_noise=0.5"],
     "privacy.adaptive_clip.count_noise = 0.5: expected a std σ_b > z/2 = 1 (here σ_b = 0.5)"),
])
def test_bad_privacy_input_is_one_line(capsys, overrides, line):
    assert _one_line(capsys, *overrides).startswith(f"error: {line}")


def test_bad_privacy_input_in_a_real_process_exits_2_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", QUICKSTART, f"output.dir={out}",
                           "privacy.mechanism=central", "privacy.noise_multiplier=1", "algorithm.aggregator=krum"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.startswith("error: algorithm.aggregator = 'krum'"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_delta_not_below_one_over_n_is_a_warning_naming_the_rule(capsys, tmp_path):
    assert main(["validate", QUICKSTART, "runtime.backend=local", "privacy.mechanism=central",
                 "privacy.noise_multiplier=1", "privacy.delta=0.05"]) == 0
    err = capsys.readouterr().err
    assert "warning: privacy.delta = 0.05 is not below 1/N = 0.01 (100 clients): the usual rule is δ well below 1/N" in err


def test_the_summary_says_what_was_assumed(tmp_path):
    summary, _, _, _ = _run(tmp_path, *CENTRAL, "execution.rounds=2")
    text = json.dumps(summary["privacy"])
    assert "SampledWithoutReplacementDpEvent(source_dataset_size=40, sample_size=12" in summary["privacy"]["events"]
    assert "secret and independent of the data" in text and summary["privacy"]["mechanism"] == "central"


def test_the_report_plots_epsilon_and_accuracy_against_it_for_private_runs_only(tmp_path):
    from raysim.report.figures import write_report

    private = raysim.run(small_scenario(tmp_path / "dp", *CENTRAL, "execution.rounds=3"))
    plain = raysim.run(small_scenario(tmp_path / "plain", "execution.rounds=3"))
    written = [Path(p).name for p in write_report([private.output_dir])]
    assert "epsilon_vs_round.png" in written and "accuracy_vs_epsilon.png" in written
    written = [Path(p).name for p in write_report([plain.output_dir])]
    assert "epsilon_vs_round.png" not in written and "accuracy_vs_epsilon.png" not in written


def _released_nodes(n: int) -> set:
    """Brute force: every dyadic block some prefix sum 1 … j (j <= n) is made of."""
    nodes = set()
    for j in range(1, n + 1):
        start = 0
        for size in (2 ** p for p in reversed(range(j.bit_length()))):
            if j - start >= size:
                nodes.add((start + 1, start + size))
                start += size
    return nodes


def test_dp_ftrl_exposure_of_one_participation_per_tree_is_dp_accountings_tree_depth():
    from raysim.privacy.accounting import tree_exposure

    for steps in range(1, 70):
        worst = max(tree_exposure([leaf], None, steps) for leaf in range(steps))
        assert worst == math.ceil(math.log2(steps + 1)), steps
    # one participation in each of three trees of 8 steps: dp-accounting's restarted-tree event, exactly
    ours = dpa.GaussianDpEvent(0.9 / math.sqrt(tree_exposure([0, 8, 16], 8, 24)))
    theirs = dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(0.9, 8), 3)
    special = dpa.NeighboringRelation.REPLACE_SPECIAL  # dp-accounting's relation for trees: a record replaced by 0
    spent = [rdp.RdpAccountant(neighboring_relation=r).compose(e).get_epsilon(1e-5)
             for e, r in ((ours, ADD_REMOVE), (theirs, special))]
    assert spent[0] == pytest.approx(spent[1], rel=1e-12)


def test_dp_ftrl_spends_each_clients_exposure_over_the_released_tree_nodes(tmp_path):
    summary, rounds, events, ledger = _run(tmp_path, *[o.replace("central", "dp_ftrl") for o in CENTRAL],
                                           "execution.rounds=7", "privacy.tree_restart_every=4", "eval.every=7")
    applied = events[events.status == "applied"]
    exposures = []
    for client in range(40):
        under = {}
        for version in applied[applied.client_id == client].model_version:
            tree, leaf = divmod(int(version), 4)
            for node in _released_nodes(min(4, 7 - 4 * tree)):
                if node[0] <= leaf + 1 <= node[1]:
                    under[tree, node] = under.get((tree, node), 0) + 1
        exposures.append(sum(c * c for c in under.values()))
    expected = [0.0 if s == 0 else _pld(dpa.GaussianDpEvent(1.1 / math.sqrt(s))) for s in exposures]
    assert ledger["epsilon"] == expected and summary["privacy"]["final_epsilon"] == max(expected)
    assert rounds["epsilon"][-1] == max(expected) and summary["privacy"]["amplification"] == "none"


def test_dp_ftrl_noise_is_the_trees_prefix_noise_not_a_sum_of_independent_draws(tmp_path):
    def moved(name, *overrides):
        result = raysim.run(small_scenario(tmp_path / name, "algorithm.lr=1e-12", "execution.rounds=4", *overrides))
        return torch.load(Path(result.output_dir) / "model.pt")

    still, tree = moved("still"), moved("tree", *[o.replace("central", "dp_ftrl") for o in CENTRAL])
    shift = torch.cat([(tree[k] - still[k]).reshape(-1).double() for k in still])
    # after 4 steps the prefix sum is one node's noise: std z·S/m, not the √4 × that of four independent draws
    assert shift.std().item() == pytest.approx(1.1 * 0.5 / 12, rel=0.06)


def test_two_updates_of_one_client_in_one_sum_count_as_twice_its_sensitivity():
    from raysim.pipeline.privacy import ParticipationLedger

    ledger = ParticipationLedger(100, squared=True)  # central DP: k updates in one sum move it by k·S
    local = ParticipationLedger(100)  # local DP: each upload is noised on its own
    states = [ledger.init(), local.init()]
    for version, ids in enumerate(([3, 3, 5], [3, 7])):  # a FedBuff buffer holding client 3 twice, then once
        updates = ClientUpdates(np.array(ids), np.ones(len(ids)), np.zeros(len(ids)), torch.zeros(len(ids), 2))
        step = ServerInput(updates, np.full(len(ids), 0.5), version)
        states = [stage.update(step, state)[1] for stage, state in zip((ledger, local), states)]
    assert dict(ledger.entries(states[0])) == {3: (3, 5), 5: (1, 1), 7: (1, 1)}  # 2² + 1²
    assert dict(local.entries(states[1])) == {3: (3, 3), 5: (1, 1), 7: (1, 1)}
    assert states[0]["most"] == 5 and states[1]["most"] == 3
