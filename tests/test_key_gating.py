"""Keys a scenario would ignore (another kind's, mode's, attack's) are refused when set, with one line
naming the key, the value and why; the same keys are taken where they apply; ``raysim list`` documents
every key; an int key's range in its out-of-64-bits message."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from omegaconf import OmegaConf

from raysim.catalog import ALGORITHMS
from raysim.cli import main
from raysim.scenario import Scenario, load_scenario, to_yaml
from raysim.schema import INT64_MAX, describe, fields_of, path_schema

ASYNC = ["execution.mode=async", "execution.max_updates=10"]
DIGITS = ["data.kind=digits"]
BYZANTINE = ["system.byzantine.fraction=0.2"]


@pytest.fixture
def scenario(tmp_path) -> str:
    """A scenario file that sets nothing but its name (every other key keeps its default)."""
    path = tmp_path / "gating.yaml"
    path.write_text("name: gating\n")
    return str(path)


def error_line(capsys, *args) -> str:
    assert main(list(args)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


# (overrides, the key refused, its value as the line shows it)
IGNORED = [
    (["system.compute.mu=2"], "system.compute.mu", "2.0"),
    (["system.compute.sigma=2"], "system.compute.sigma", "2.0"),
    (["system.compute.kind=lognormal", "system.compute.speed=3"], "system.compute.speed", "3.0"),
    (["system.compute.scale=3"], "system.compute.scale", "3.0"),
    (["system.compute.kind=lognormal", "system.compute.shape=3"], "system.compute.shape", "3.0"),
    (["system.compute.path=/tmp/x.csv"], "system.compute.path", "'/tmp/x.csv'"),
    (["system.compute.tiers=[{fraction: 1.0, speed: 2}]"], "system.compute.tiers[0].fraction", "1.0"),
    (["system.compute.kind=tiers", "system.compute.tiers=[{fraction: 0.5, speed: 1}, "
      "{fraction: 0.5, speed: 2, down_mbps: 3}]"], "system.compute.tiers[1].down_mbps", "3.0"),
    (["system.network.down_mbps=5"], "system.network.down_mbps", "5.0"),
    (["system.network.up_mbps=5"], "system.network.up_mbps", "5.0"),
    (["system.network.kind=tiers", "system.network.tiers=[{fraction: 1.0}]", "system.network.latency_s=1"],
     "system.network.latency_s", "1.0"),
    (["system.network.kind=constant", "system.network.sigma=0.3"], "system.network.sigma", "0.3"),
    (["system.network.kind=constant", "system.network.tiers=[{fraction: 1.0}]"], "system.network.tiers[0].fraction",
     "1.0"),
    (["system.network.kind=tiers", "system.network.tiers=[{fraction: 1.0, speed: 2}]"],
     "system.network.tiers[0].speed", "2.0"),
    (["system.availability.p=0.5"], "system.availability.p", "0.5"),
    (["system.availability.kind=bernoulli", "system.availability.period=100"], "system.availability.period",
     "100.0"),
    (["system.availability.on_fraction=0.3"], "system.availability.on_fraction", "0.3"),
    (["system.availability.kind=diurnal", "system.availability.path=/tmp/x.csv"], "system.availability.path",
     "'/tmp/x.csv'"),
    (["system.unreliable.noise_scale=0.1"], "system.unreliable.noise_scale", "0.1"),
    (["system.unreliable.participation.low=0.5"], "system.unreliable.participation.low", "0.5"),
    (["system.unreliable.participation.kind=uniform", "system.unreliable.participation.low=0.5",
      "system.unreliable.participation.value=0.5"],
     "system.unreliable.participation.value", "0.5"),
    (["system.unreliable.participation.mean=3"], "system.unreliable.participation.mean", "3.0"),
    (["system.unreliable.local_steps={kind: poisson, mean: 3, value: 2}"], "system.unreliable.local_steps.value",
     "2.0"),
    (["system.unreliable.local_steps={kind: constant, value: 2, high: 4}"], "system.unreliable.local_steps.high",
     "4.0"),
    (BYZANTINE + ["system.byzantine.sigma=2"], "system.byzantine.sigma", "2.0"),
    (BYZANTINE + ["system.byzantine.attack=ipm", "system.byzantine.z=1"], "system.byzantine.z", "1.0"),
    (DIGITS + ["data.partition.alpha=0.3"], "data.partition.alpha", "0.3"),
    (DIGITS + ["data.partition.kind=dirichlet", "data.partition.shards_per_client=3"],
     "data.partition.shards_per_client", "3"),
    (DIGITS + ["data.partition.kind=shards", "data.partition.per_class=3"], "data.partition.per_class", "3"),
    (DIGITS + ["data.partition.test_per_class=3"], "data.partition.test_per_class", "3"),
    (DIGITS + ["data.partition.diff_hetero=true"], "data.partition.diff_hetero", "True"),
    (ASYNC + ["execution.staleness.kind=polynomial", "execution.staleness.b=3"], "execution.staleness.b", "3.0"),
    (ASYNC + ["execution.staleness.a=0.3"], "execution.staleness.a", "0.3"),
]

# the same keys where they apply
APPLIED = [
    ["system.compute.kind=lognormal", "system.compute.mu=2", "system.compute.sigma=2"],
    ["system.compute.speed=3", "system.compute.noise=0.1", "system.compute.seconds_per_sample=0.01"],
    ["system.compute.kind=pareto", "system.compute.scale=3", "system.compute.shape=3"],
    ["system.compute.kind=tiers", "system.compute.tiers=[{fraction: 0.5, speed: 1}, {fraction: 0.5, speed: 2}]",
     "system.compute.slow_fraction=0.1", "system.compute.slow_factor=3"],
    ["system.network.kind=constant", "system.network.down_mbps=5", "system.network.up_mbps=5",
     "system.network.latency_s=1"],
    ["system.network.kind=lognormal", "system.network.down_mbps=5", "system.network.sigma=0.3"],
    ["system.network.kind=tiers", "system.network.tiers=[{fraction: 1.0, down_mbps: 5, up_mbps: 1, latency_s: 1}]"],
    ["system.availability.kind=bernoulli", "system.availability.p=0.5"],
    ["system.availability.kind=diurnal", "system.availability.period=100", "system.availability.on_fraction=0.3"],
    ["system.unreliable.gradient_noise=laplace", "system.unreliable.noise_scale=0.1"],
    ["system.unreliable.participation.kind=uniform", "system.unreliable.participation.low=0.5",
     "system.unreliable.participation.high=0.9", "system.unreliable.coin=round"],
    ["system.unreliable.participation.value=0.5", "system.unreliable.coin=round"],
    ["system.unreliable.local_steps={kind: poisson, mean: 3}"],
    ["system.unreliable.local_steps={kind: uniform_int, low: 2, high: 4}"],
    BYZANTINE + ["system.byzantine.attack=gaussian", "system.byzantine.sigma=2"],
    BYZANTINE + ["system.byzantine.scale=2"],
    ["system.byzantine.fraction=0", "system.byzantine.attack=gaussian", "system.byzantine.sigma=2"],  # a clean run
    ["system.byzantine.clients=[1, 2]", "system.byzantine.attack=ipm", "system.byzantine.epsilon=0.5"],
    BYZANTINE + ["system.byzantine.attack=alie", "system.byzantine.z=1"],
    DIGITS + ["data.partition.kind=dirichlet", "data.partition.alpha=0.3"],
    DIGITS + ["data.partition.kind=shards", "data.partition.shards_per_client=3"],
    DIGITS + ["data.partition.kind=pathological", "data.partition.per_class=3", "data.partition.test_per_class=3",
              "data.partition.diff_hetero=true"],
    ASYNC + ["execution.staleness.kind=polynomial", "execution.staleness.a=0.3"],
    ASYNC + ["execution.staleness.kind=hinge", "execution.staleness.a=0.3", "execution.staleness.b=3"],
]


@pytest.mark.parametrize("overrides, key, value", IGNORED, ids=[f"{key}-{i}" for i, (_, key, _) in enumerate(IGNORED)])
def test_an_ignored_key_is_refused_naming_it_its_value_and_why(capsys, scenario, overrides, key, value):
    line = error_line(capsys, "validate", scenario, *overrides)
    assert line.startswith(f"error: {key} = {value}: expected no setting (it applies only "), line


@pytest.mark.parametrize("overrides", APPLIED, ids=[o[-1] for o in APPLIED])
def test_the_same_keys_are_taken_where_they_apply(tmp_path, overrides):
    cfg = load_scenario(None, overrides)
    saved = tmp_path / "scenario.yaml"
    saved.write_text(to_yaml(cfg))
    assert load_scenario(str(saved)) == cfg  # what scenario.yaml keeps runs again as it is


def test_trace_paths_apply_to_trace_kinds(tmp_path):
    speeds, online = tmp_path / "speeds.csv", tmp_path / "online.csv"
    speeds.write_text("client_id,speed\n" + "".join(f"{c},1.5\n" for c in range(10)))
    online.write_text("client_id,start,end\n0,0,100\n")
    cfg = load_scenario(None, ["data.num_clients=10", "execution.clients_per_round=1", "system.compute.kind=trace",
                               f"system.compute.path={speeds}", "system.availability.kind=trace",
                               f"system.availability.path={online}"])
    assert cfg.system.compute.path == str(speeds)


def test_saved_scenarios_keep_only_the_keys_that_apply_and_old_ones_still_load():
    """scenario.yaml drops what this scenario ignores (a compute tier's network fields, another
    kind's parameters); a file written before these keys were conditional, holding every key, still
    loads as a run's saved scenario (raysim resume)."""
    cfg = load_scenario(None, ["system.compute.kind=tiers", "system.compute.tiers=[{fraction: 1.0, speed: 2}]"])
    saved = yaml.safe_load(to_yaml(cfg))["system"]
    assert saved["compute"] == {"kind": "tiers", "tiers": [{"fraction": 1.0, "speed": 2.0}], "slow_fraction": 0.0,
                                "slow_factor": 10.0, "seconds_per_sample": 0.001, "noise": 0.0}
    assert saved["network"] == {"kind": "none"} and saved["availability"] == {"kind": "always"}
    assert "sigma" not in saved["byzantine"] and "noise_scale" not in saved["unreliable"]
    assert set(saved["unreliable"]["participation"]) == {"kind", "value"}
    everything = OmegaConf.create(OmegaConf.to_container(cfg))  # as older versions wrote scenario.yaml
    assert everything.system.compute.tiers[0].down_mbps == 100.0 and "mu" in everything.system.compute
    assert load_scenario(everything) == cfg


def test_every_key_raysim_list_prints_has_a_doc(capsys):
    assert main(["list"]) == 0
    listing = yaml.safe_load(capsys.readouterr().out)
    scenario_keys = [row for row in describe(Scenario) if not row[0].startswith("algorithm")]  # listed apart
    assert list(listing["scenario keys"]) == [name for name, _, _ in scenario_keys]
    printed = {**listing["scenario keys"], **{f"algorithm.{k}[{name}]": v for name, a in
                                              listing["algorithms (algorithm.name; algorithm.<key>)"].items()
                                              for k, v in a["keys"].items()}}
    assert len(printed) > len(scenario_keys)
    assert not [k for k, entry in printed.items() if not entry.get("doc")]


def _undocumented(schema: type, prefix: str = "") -> list:
    """The keys of ``schema`` without a doc, sections (optional ones and list entries too) walked."""
    missing = []
    for f in fields_of(schema):
        sub = path_schema(schema, f.name)
        if sub is not None:
            missing += _undocumented(sub, f"{prefix}{f.name}.")
        if not f.metadata.get("doc") and (sub is None or f.default is None):
            missing.append(prefix + f.name)
    return missing


@pytest.mark.parametrize("schema", [Scenario, *(builtin.keys for builtin in ALGORITHMS.values())],
                         ids=["scenario", *ALGORITHMS])
def test_every_declared_key_has_a_doc(schema):
    assert dataclasses.is_dataclass(schema)
    assert _undocumented(schema) == []


BIG = "99999999999999999999"


@pytest.mark.parametrize("override, allowed", [
    (f"execution.rounds={BIG}", f"a positive integer (at most {INT64_MAX})"),
    (f"execution.rounds=-{BIG}", f"a positive integer (at most {INT64_MAX})"),
    (f"eval.every={BIG}", f"an integer >= 0 (at most {INT64_MAX})"),
    (f"algorithm.batch_size={BIG}", f"a positive integer (at most {INT64_MAX})"),
    (f"runtime.torch_threads={BIG}", "an integer in [1, 1024]"),
    (f"data.num_clients={BIG}", "an integer in [1, 2147483647]"),
    (f"data.num_samples={BIG}", f"an integer in [-9223372036854775808, {INT64_MAX}]"),  # no check of its own
])
def test_an_int_beyond_64_bits_names_the_keys_own_range(capsys, override, allowed):
    key, value = override.split("=")
    assert error_line(capsys, "validate", "scenarios/quickstart.yaml", override) == (
        f"error: {key} = {value}: expected {allowed}")


QUICKSTART = "scenarios/quickstart.yaml"  # sets algorithm.local_epochs, execution.rounds and clients_per_round


def test_a_key_the_file_sets_is_unset_with_a_tilde(capsys):
    line = error_line(capsys, "validate", QUICKSTART, "algorithm.local_steps=5")
    assert line == ("error: algorithm.local_epochs = 1: expected no setting (it applies only with "
                    "algorithm.local_steps = null (here algorithm.local_steps = 5)); ~algorithm.local_epochs unsets it")
    cfg = load_scenario(QUICKSTART, ["~algorithm.local_epochs", "algorithm.local_steps=5", "~execution.rounds"])
    assert cfg.algorithm.local_steps == 5 and cfg.algorithm.lr == 0.05  # the file's other keys stay
    assert cfg.execution.rounds == 20  # the default again (the file says 30)
    cfg = load_scenario(QUICKSTART, ["execution.mode=async", "execution.max_updates=50", "~execution.rounds",
                                     "~execution.clients_per_round"])
    assert cfg.execution.mode == "async"
    # a key that an override sets again is named without the ~ hint: the override is what to drop
    line = error_line(capsys, "validate", QUICKSTART, "~algorithm.local_epochs", "algorithm.local_epochs=2",
                      "algorithm.local_steps=5")
    assert line.endswith("(here algorithm.local_steps = 5))")


def test_an_entry_of_a_list_the_file_sets_names_the_list_to_unset(tmp_path, capsys):
    path = tmp_path / "tiers.yaml"
    path.write_text("name: t\nsystem:\n  compute:\n    kind: tiers\n    tiers:\n      - {fraction: 0.5, speed: 1.0}\n"
                    "      - {fraction: 0.5, speed: 2.0}\n")
    line = error_line(capsys, "validate", str(path), "system.compute.kind=constant")
    assert line.startswith("error: system.compute.tiers[0].fraction = 0.5: expected no setting")
    assert line.endswith("; ~system.compute.tiers unsets it")
    assert load_scenario(str(path), ["system.compute.kind=constant", "~system.compute.tiers"]).system.compute.kind == \
        "constant"


@pytest.mark.parametrize("item", ["~algorithm.nope", "~", "~algorithm.lr=0.1", "~data.kind.x"])
def test_a_tilde_for_a_key_the_file_does_not_set_is_one_line(capsys, item):
    assert error_line(capsys, "validate", QUICKSTART, item) == (
        f"error: override = {item!r}: expected ~KEY, for a key the scenario sets (its default then applies)")
