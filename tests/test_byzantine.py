"""Byzantine clients: who they are, what each attack sends, how runs absorb or refuse them, and
bad input. Determinism across actors is in test_ray.py (MODES byzantine_*), across a crash and
resume in test_resume.py (CASES byzantine_*)."""

from __future__ import annotations

import math
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import raysim
from raysim.algorithms.oracles import RowOracle
from raysim.cli import main
from raysim.errors import RunError, ScenarioError
from raysim.models import build_model
from raysim.system import SystemModel
from raysim.system.byzantine import Attack, alie_z
from tests.conftest import small_scenario
from tests.test_bad_input import QUICKSTART, run_main


def attack(name, **keys):
    cfg = SimpleNamespace(attack=name, scale=1.0, sigma=1.0, z=None, epsilon=0.1, window=None)
    vars(cfg).update(keys)
    return Attack(cfg, seed=3)


UPDATES = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 4.0], [100.0, -100.0]])
BYZANTINE = np.array([False, False, False, True])


def test_the_byzantine_set_is_drawn_once_from_the_seed_with_exactly_fraction_times_n_clients():
    system = small_scenario("/tmp/unused", "system.byzantine.fraction=0.2").system
    sets = [np.flatnonzero(SystemModel(system, 40, seed).profile["byzantine"]) for seed in (0, 0, 1)]
    assert len(sets[0]) == 8 and np.array_equal(sets[0], sets[1]) and not np.array_equal(sets[0], sets[2])
    listed = small_scenario("/tmp/unused", "system.byzantine.clients=[3,17]").system
    assert np.flatnonzero(SystemModel(listed, 40, 0).profile["byzantine"]).tolist() == [3, 17]


def test_sign_flip_gaussian_and_nan_replace_only_the_byzantine_rows():
    flipped = attack("sign_flip", scale=2.0)(UPDATES, BYZANTINE, step=0)
    assert torch.equal(flipped[:3], UPDATES[:3]) and flipped[3].tolist() == [-200.0, 200.0]
    nan = attack("nan")(UPDATES, BYZANTINE, step=0)
    assert torch.isnan(nan[3]).all() and torch.equal(nan[:3], UPDATES[:3])
    many = torch.zeros(3, 20000)
    noise = attack("gaussian", sigma=0.5)(many, np.array([True, False, True]), step=7)
    assert torch.equal(noise, attack("gaussian", sigma=0.5)(many, np.array([True, False, True]), step=7))
    assert not torch.equal(noise, attack("gaussian", sigma=0.5)(many, np.array([True, False, True]), step=8))
    assert noise[1].abs().sum() == 0 and abs(float(noise[[0, 2]].std()) - 0.5) < 0.01


def test_ipm_sends_minus_epsilon_times_the_honest_mean():
    sent = attack("ipm", epsilon=0.5)(UPDATES, BYZANTINE, step=0)
    assert sent[3].tolist() == [-1.5, -2.0]  # honest mean (3, 4)


def test_alie_sends_mean_minus_z_std_with_baruchs_z():
    # n = 20, f = 4: s = floor(20/2 + 1) - 4 = 7 supporters, z = Phi^-1((20 - 7)/20) = Phi^-1(0.65)
    assert alie_z(20, 4) == pytest.approx(0.385320466, abs=1e-8)
    n, f = 4, 1  # s = 3 - 1 = 2, z = Phi^-1(2/4) = 0
    assert alie_z(n, f) == 0.0
    sent = attack("alie", z=1.0)(UPDATES, BYZANTINE, step=0)
    # honest columns (1, 3, 5) and (2, 6, 4): means 3 and 4, sample standard deviations 2 and 2
    assert sent[3].tolist() == [1.0, 2.0]
    z = NormalDist().inv_cdf((5 - 2) / 5)  # n = 5 (4 seen + 1 Byzantine), f = 1: s = 2
    seen = torch.tensor([[0.0], [2.0], [4.0], [6.0]])
    alone = attack("alie")(torch.tensor([[9.0]]), np.array([True]), step=0, seen=seen)
    assert alone.item() == pytest.approx(3.0 - z * math.sqrt(20 / 3))


def test_label_flip_trains_the_byzantine_clients_on_flipped_labels():
    model = build_model(SimpleNamespace(kind="logreg", personal="none", options={}), (3,), 4, seed=0)
    features = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    offsets = np.array([[0, 4, 4], [4, 8, 8]])
    params = model.initial_vector().expand(2, -1)
    flipped = RowOracle(model, features, labels, offsets, None, torch.device("cpu"),
                        (torch.tensor([False, True]), 4)).full_gradient(params)[0]
    by_hand = RowOracle(model, features, torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]), offsets, None,
                        torch.device("cpu")).full_gradient(params)[0]
    honest = RowOracle(model, features, labels, offsets, None, torch.device("cpu")).full_gradient(params)[0]
    assert torch.equal(flipped, by_hand) and torch.equal(flipped[0], honest[0]) and not torch.equal(flipped[1],
                                                                                                    honest[1])


def test_nan_attack_completes_with_the_median_and_stops_the_mean_naming_the_byzantine_client(tmp_path):
    attack_keys = ["system.byzantine.clients=[5,9]", "system.byzantine.attack=nan", "execution.clients_per_round=40"]
    robust = raysim.run(small_scenario(tmp_path / "median", *attack_keys, "algorithm.aggregator=median")).summary
    assert robust["status"] == "completed" and math.isfinite(robust["final_test_accuracy"])
    events = pq.read_table(tmp_path / "median/out/events.parquet").to_pandas()
    assert sorted(events.loc[events.byzantine, "client_id"].unique()) == [5, 9]
    with pytest.raises(RunError, match=r"server step 1: Byzantine client 5 sent a non-finite update "
                                              r"\(system.byzantine.attack=nan\) and the mean cannot absorb it"):
        raysim.run(small_scenario(tmp_path / "mean", *attack_keys))
    assert (tmp_path / "mean/out/summary.json").read_text().count('"failed"') == 1


def test_a_robust_aggregator_resists_sign_flip_where_the_mean_fails(tmp_path):
    keys = ["execution.rounds=15", "execution.clients_per_round=20", "algorithm.lr=0.1"]
    attacked = keys + ["system.byzantine.fraction=0.2", "system.byzantine.attack=sign_flip",
                       "system.byzantine.scale=4"]
    accuracy = {name: raysim.run(small_scenario(tmp_path / name, *k)).summary["final_test_accuracy"] for name, k in
                [("clean", keys), ("mean", attacked), ("multi_krum", attacked + ["algorithm.aggregator=multi_krum"])]}
    assert accuracy["mean"] < accuracy["clean"] - 0.2, accuracy  # 0.16 against 0.66 when written
    assert accuracy["multi_krum"] > accuracy["clean"] - 0.1, accuracy  # 0.61


@pytest.mark.parametrize("overrides, line", [
    (["system.byzantine.fraction=0.5"], "system.byzantine.fraction = 0.5: expected a share in [0, 0.5) "
                                        "(Byzantine clients are a minority)"),
    (["system.byzantine.clients=[3,100]"], "system.byzantine.clients = [3, 100]: expected client ids in [0, 99] "
                                           "([100] are not)"),
    (["algorithm.aggregator=krum", "execution.clients_per_round=4", "algorithm.byzantine_f=2"],
     "algorithm.byzantine_f = 2: expected at most f = 1 for krum with n=4 inputs (execution.clients_per_round=4): "
     "n - f leaves fewer than three candidates"),
    (["algorithm.aggregator=krum", "execution.clients_per_round=2"],
     "algorithm.aggregator = 'krum': expected a rule other than krum for steps of n=2 inputs "
     "(execution.clients_per_round=2): it needs at least 3"),
    (["algorithm.aggregator=median", "algorithm.bucket_size=20"],
     "algorithm.aggregator = 'median': expected a rule other than median for steps of n=1 inputs "
     "(execution.clients_per_round=20 in buckets of algorithm.bucket_size=20): it needs at least 2"),
    (["execution.mode=async", "execution.max_updates=50", "~execution.rounds", "~execution.clients_per_round",
      "algorithm.aggregator=geometric_median"],
     "algorithm.aggregator = 'geometric_median': expected a rule other than geometric_median for steps of n=1 "
     "inputs (execution.aggregation=fedasync: one update per step): it needs at least 2"),
    (["system.byzantine.fraction=0.001"], "system.byzantine.fraction = 0.001: expected 0, or a share that marks at "
                                          "least one of the data.num_clients=100 clients (round(fraction × clients) "
                                          "Byzantine clients)"),
    (["algorithm.bucket_size=2"], "algorithm.bucket_size = 2: expected no setting (it applies only with "
                                  "algorithm.aggregator != mean (here algorithm.aggregator = 'mean'))"),
    (["algorithm.aggregator=multi_krum", "system.byzantine.fraction=0.2", "algorithm.krum_m=9",
      "execution.clients_per_round=10"],
     "algorithm.krum_m = 9: expected at most n - f = 8 (n=10 inputs: execution.clients_per_round=10; f=2)"),
    (["algorithm.aggregator=bulyan", "system.byzantine.fraction=0.2", "algorithm.bucket_size=2",
      "execution.clients_per_round=10"],
     "system.byzantine.fraction = 0.2: expected at most f = 0 for bulyan with n=5 inputs "
     "(execution.clients_per_round=10 in buckets of algorithm.bucket_size=2): it needs n >= 4f + 3 (f = 2, the "
     "Byzantine updates of a step of 10; or set algorithm.byzantine_f)"),
    (["algorithm.aggregator=trimmed_mean", "algorithm.trim=0.5"], "algorithm.trim = 0.5: expected a share in [0, 0.5)"),
    (["algorithm.aggregator=median", "algorithm.bucket_size=0"],
     "algorithm.bucket_size = 0: expected a positive integer"),
    (["execution.mode=async", "execution.max_updates=50", "system.byzantine.fraction=0.2",
      "system.byzantine.attack=ipm"],
     "system.byzantine.window = None: expected a positive number of honest updates for attack ipm under "
     "execution.aggregation=fedasync (a step holds one update: the attack sees the last `window` honest ones)"),
    (["algorithm.aggregator=median3"], "algorithm.aggregator = 'median3': expected one of bulyan, centered_clipping, "
                                       "geometric_median, krum, mean, median, multi_krum, trimmed_mean, or "
                                       "package.module:function"),
])
def test_byzantine_bad_input_is_one_line(capsys, overrides, line):
    assert run_main(capsys, "validate", QUICKSTART, *overrides) == f"error: {line}"


def test_a_custom_aggregator_is_called_with_its_options(tmp_path, monkeypatch):
    module = tmp_path / "my_rules.py"
    module.write_text("import torch\nCALLS = []\n"
                      "def shrunk_mean(updates, weights, factor):\n"
                      "    CALLS.append(factor)\n"
                      "    return factor * updates.double().mean(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    summary = raysim.run(small_scenario(tmp_path, "algorithm.aggregator=my_rules:shrunk_mean",
                                        "algorithm.aggregator_options={factor: 0.5}")).summary
    import my_rules

    assert summary["status"] == "completed" and my_rules.CALLS == [0.5, 0.5, 0.5]
    with pytest.raises(ScenarioError, match="algorithm.aggregator = 'my_rules:nothing'"):
        small_scenario(tmp_path, "algorithm.aggregator=my_rules:nothing")
    assert main(["validate", QUICKSTART, "algorithm.aggregator_options={a: 1}"]) == 2


def test_client_momentum_sends_each_clients_running_average_of_its_updates(tmp_path, monkeypatch):
    (tmp_path / "recording.py").write_text("import torch\nSEEN = {}\n"
                                           "def frozen(updates, weights, run):\n"
                                           "    SEEN.setdefault(run, []).append(updates.clone())\n"
                                           "    return torch.zeros(updates.shape[1], dtype=torch.float64)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    keys = ["algorithm.aggregator=recording:frozen", "execution.clients_per_round=40", "execution.rounds=2"]
    for run, beta in (("raw", 0.0), ("momentum", 0.5)):  # the model never moves: the same raw updates in both
        raysim.run(small_scenario(tmp_path / run, *keys, f"algorithm.client_momentum={beta}",
                                  f"algorithm.aggregator_options={{run: {run}}}"))
    import recording

    (u1, u2), (m1, m2) = recording.SEEN["raw"], recording.SEEN["momentum"]
    assert torch.allclose(m1, 0.5 * u1) and torch.allclose(m2, 0.25 * u1 + 0.5 * u2)
    assert not torch.allclose(u1, u2)
