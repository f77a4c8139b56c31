"""Scenario loading and validation: every bad input is one clear line naming key, value and what is allowed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raysim.cli import main
from raysim.scenario import TOP_LEVEL_KEYS, load_scenario, to_yaml
from raysim.errors import ScenarioError


def test_top_level_keys_are_the_interface():
    assert TOP_LEVEL_KEYS == ("name", "seed", "data", "model", "algorithm", "execution", "system", "privacy", "communication",
                              "runtime", "eval", "output")


def test_overrides_and_interpolation():
    cfg = load_scenario("scenarios/quickstart.yaml", ["algorithm.lr=0.1", "execution.rounds=5",
                                                      "runtime.num_actors=2", "output.dir=results/${name}-x"])
    assert cfg.algorithm.lr == 0.1 and cfg.execution.rounds == 5 and cfg.runtime.num_actors == 2
    assert cfg.output.dir == "results/quickstart-x"


@pytest.mark.parametrize("overrides, key, must_contain", [
    (["data.foo=1"], "data.foo", ["num_clients", "kind"]),
    (["nonsense=3"], "nonsense", ["algorithm", "execution"]),
    (["execution.rounds=abc"], "execution.rounds", ["abc", "int"]),
    (["data.num_clients=-5"], "data.num_clients", ["-5", "an integer in [1, 2147483647]"]),
    (["execution.clients_per_round=500"], "execution.clients_per_round",
     ["500", "[1, 100] (the data set's number of clients)"]),
    (["algorithm.lr=0"], "algorithm.lr", ["0", "> 0"]),
    (["algorithm.lr=-0.1"], "algorithm.lr", ["-0.1", "> 0"]),
    (["data.kind=imagenet"], "data.kind", ["imagenet", "digits, fashion_mnist, gaussian_mixture, leaf, leaf_synthetic"]),
    (["model.kind=resnet"], "model.kind", ["resnet", "cnn, logreg, mlp"]),
    (["algorithm.name=fedfoo"], "algorithm.name", ["fedfoo", "fedavg"]),
    (["runtime.backend=spark"], "runtime.backend", ["spark", "local, ray"]),
    (["runtime.num_actors=0"], "runtime.num_actors", ["0", "'auto'"]),
    (["runtime.gpus_per_actor=-1"], "runtime.gpus_per_actor", ["-1"]),
    (["data.kind=parquet", "data.path=/no/such/file.parquet"], "data.path", ["/no/such/file.parquet", "existing Parquet"]),
    (["data.kind=digits", "data.partition.kind=zipf"], "data.partition.kind", ["zipf", "dirichlet, iid, pathological, shards"]),
])
def test_bad_input_names_key_value_and_allowed(overrides, key, must_contain):
    with pytest.raises(ScenarioError) as info:
        load_scenario("scenarios/quickstart.yaml", overrides)
    message = str(info.value)
    assert message.startswith(f"{key} = "), message
    for text in must_contain:
        assert text in message, message
    assert "\n" not in message


def test_missing_scenario_file():
    with pytest.raises(ScenarioError, match="scenario = 'nope.yaml': expected an existing YAML file"):
        load_scenario("nope.yaml")


def test_cli_prints_one_line_and_exits_2(capsys):
    assert main(["validate", "scenarios/quickstart.yaml", "execution.clients_per_round=101"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: execution.clients_per_round = 101: expected an integer in [1, 100] (the data set's number "
                   "of clients)"]


def test_cli_validate_ok(capsys):
    assert main(["validate", "scenarios/quickstart.yaml", "model.hidden=[32,32]"]) == 0
    out = capsys.readouterr().out
    assert "ok:" in out and "100 clients" in out and "mlp" in out


@pytest.mark.parametrize("scenario, overrides, budget", [
    ("quickstart", [], "algorithm fedavg, 30 rounds of 20 clients;"),
    ("quickstart", ["execution.deadline=50"], "30 rounds of 20 clients, deadline 50 s;"),
    ("bench/w1_async", [], "algorithm fedavg, async fedasync, 100 in flight, until 2000 updates;"),
    ("bench/w1_async", ["execution.aggregation=fedbuff", "execution.buffer_size=5", "execution.max_updates=null",
                        "execution.max_virtual_time=900", "execution.target_accuracy=0.8", "eval.every=10"],
     "async fedbuff (buffer 5), 100 in flight, until 900 virtual seconds or test accuracy 0.8;"),
])
def test_cli_validate_describes_the_budget(capsys, scenario, overrides, budget):
    assert main(["validate", f"scenarios/{scenario}.yaml", *overrides]) == 0
    assert budget in capsys.readouterr().out


def test_quadratic_run_ends_with_its_own_metrics(tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["run", "scenarios/paper/ffgg_quadratic_cg.yaml", "execution.rounds=3", "data.n=50",
                 f"output.dir={out}"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    final = json.loads((out / "summary.json").read_text())["final_diagnostics"]
    assert set(final) == {"rel_error", "grad_norm_sq", "loss_gap", "deployed_loss_gap"} and 0 < final["rel_error"] < 1
    assert final["deployed_loss_gap"] >= final["loss_gap"]  # w*(θ) minimises each client's loss: CG's w cannot beat it
    assert f"3 rounds, 96 client updates, final rel_error {final['rel_error']:.4g}, " in line
    assert "accuracy" not in line


def test_cli_bad_input_has_no_traceback_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml", "data.kind=cifar"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("error: data.kind = 'cifar': expected one of blobs, cifar10, cifar100, digits, "
                                   "fashion_mnist, gaussian_mixture, leaf, leaf_synthetic, mnist, parquet, quadratic, "
                                   "saddle, synthetic_images")


def test_list_shows_names_and_keys_as_yaml(capsys):
    import yaml

    from raysim.catalog import ALGORITHMS

    assert main(["list"]) == 0
    listing = yaml.safe_load(capsys.readouterr().out)
    assert {"blobs", "cifar10", "cifar100", "digits", "fashion_mnist", "gaussian_mixture", "leaf", "leaf_synthetic",
            "mnist", "parquet", "quadratic", "saddle", "synthetic_images"} == set(listing["datasets (data.kind)"])
    assert {"dirichlet", "pathological"} <= set(listing["partitioners (data.partition.kind)"])
    assert {"logreg", "mlp", "cnn"} <= set(listing["models (model.kind)"])
    algorithms = listing["algorithms (algorithm.name; algorithm.<key>)"]
    assert set(algorithms) == set(ALGORITHMS)
    assert algorithms["fedprox"]["keys"]["prox_mu"] == {"default": 0.01, "doc": "μ of the proximal term "
                                                        "(μ/2)‖v − θ‖² added to the local loss"}
    assert algorithms["fedacg"]["keys"]["acg_lambda"]["default"] == 0.85
    assert "server_optimizer" not in algorithms["fedacg"]["keys"] and algorithms["fedacg"]["doc"].startswith("FedACG")
    keys = listing["scenario keys"]
    assert keys["runtime.gpus_per_actor"]["default"] == 0.0 and keys["data.partition.kind"]["default"] == "iid"
    assert keys["execution.deadline"]["doc"].startswith("sync:")


def test_list_of_one_algorithm_shows_its_keys_also_for_a_custom_class(capsys, monkeypatch):
    import yaml

    assert main(["list", "fedprox"]) == 0
    fedprox = yaml.safe_load(capsys.readouterr().out)
    assert list(fedprox) == ["fedprox"] and fedprox["fedprox"]["keys"]["prox_mu"]["default"] == 0.01
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # custom classes import from the current directory
    assert main(["list", "examples.fednova:FedNova"]) == 0
    nova = yaml.safe_load(capsys.readouterr().out)["examples.fednova:FedNova"]
    assert nova["doc"].startswith("FedNova:") and nova["keys"]["lr"]["default"] == 0.05
    assert nova["server_diagnostics"] == ["tau_eff"] and "client_diagnostics" not in nova  # the columns it logs
    assert main(["list", "fedsgd"]) == 2
    assert capsys.readouterr().err.startswith("error: algorithm.name = 'fedsgd': expected one of apfl, ditto, fedacg, ")


@pytest.mark.parametrize("source, overrides", [
    ("scenarios/quickstart.yaml", []), ("scenarios/quickstart.yaml", ["algorithm.name=scaffold", "data.kind=digits"]),
    (None, ["execution.mode=async", "algorithm.name=fedadam", "execution.max_updates=10"])])
def test_the_saved_scenario_runs_again_as_it_is(tmp_path, source, overrides):
    """scenario.yaml holds only the keys that apply, so loading it back gives the same scenario
    (a saved file holding another mode's keys would be refused as setting ignored keys)."""
    cfg = load_scenario(source, overrides)
    text = to_yaml(cfg)
    if source is None:
        assert "deadline" not in text and "clients_per_round" not in text and "partition" not in text
    saved = tmp_path / "scenario.yaml"
    saved.write_text(text)
    assert load_scenario(str(saved)) == cfg


# the sweep files with hundreds of points (15-25 s each to validate on 2 cores): CI's short version skips them
LARGE_SWEEPS = {"scenarios/byzantine/sweep.yaml", "scenarios/paper/fedacg/sweep.yaml",
                "scenarios/paper/fedacg/sweep_tuned.yaml", "scenarios/personalization/sweep.yaml"}


@pytest.mark.parametrize("path", [pytest.param(path, marks=[pytest.mark.slow] if path in LARGE_SWEEPS else [])
                                  for path in sorted(str(p.relative_to(Path(__file__).resolve().parents[1]))
                                                     for p in (Path(__file__).resolve().parents[1] /
                                                               "scenarios").rglob("*.yaml"))])
def test_every_checked_in_scenario_is_valid(path, monkeypatch, tmp_path):
    import yaml

    from raysim.data.kinds import DATA_FILES
    from raysim.sweep import plan_sweep, read_scenario
    from raysim.sweep.search_plan import plan_search, search_section

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    if read_scenario(path)[1]:  # a sweep file: every point validates
        assert plan_sweep(path).points
        return
    if search_section(path):  # a search file: its ranges and options validate
        assert plan_search(path).space
        return
    data = yaml.safe_load(Path(path).read_text()).get("data") or {}
    # the standard data sets' examples name files each user brings (tests/test_loaders.py runs them)
    brought = data.get("kind") in DATA_FILES and not Path(str(data.get("path"))).exists()
    assert load_scenario(path, [f"data.path={tmp_path}"] if brought else []).name
