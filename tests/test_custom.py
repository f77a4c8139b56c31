"""Algorithms, models and data sets from outside the package (``package.module:name``), the
Python API (``raysim.run``, ``raysim.load_model``) and the errors of custom entries."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import small_scenario

import raysim
from raysim.cli import main

REPO = Path(__file__).resolve().parents[1]

PARTS = '''
import numpy as np
from torch import nn
from raysim.data import FederatedDataset

def tiny_net(feature_shape, num_classes, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(feature_shape[0], width), nn.Tanh(), nn.Linear(width, num_classes))

def not_a_module(feature_shape, num_classes):
    return "nope"

def two_blobs(num_clients, test_fraction, seed, dim=5):
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for _ in range(num_clients):
        y = rng.integers(0, 2, 30)
        xs.append((rng.normal(size=(30, dim)) + 2 * y[:, None]).astype(np.float32))
        ys.append(y)
    return FederatedDataset.from_clients([x[:24] for x in xs], [y[:24] for y in ys], [x[24:] for x in xs],
                                         [y[24:] for y in ys], 2, (dim,))

def a_list(num_clients, test_fraction, seed):
    return [1, 2, 3]

def one_client_more(num_clients, test_fraction, seed):
    return two_blobs(num_clients + 1, test_fraction, seed)

def a_nan(num_clients, test_fraction, seed):
    x = [np.zeros((3, 2), np.float32) for _ in range(num_clients)]
    x[1][2, 1] = np.nan
    y = [np.zeros(3, np.int64)] * num_clients
    return FederatedDataset.from_clients(x, y, x, y, 2, (2,))

def one_output_too_many(feature_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(feature_shape[0], num_classes + 1))

def batch_norm(feature_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(feature_shape[0], 4), nn.BatchNorm1d(4), nn.Linear(4, num_classes))

from raysim.algorithms import Algorithm
from raysim.algorithms.keys import FedAvgKeys

class NoClientUpdate(Algorithm):
    Keys = FedAvgKeys

class DictKeys(Algorithm):
    Keys = dict

    def client_update(self, payloads, ctx):
        raise NotImplementedError

from dataclasses import dataclass
from raysim.algorithms.keys import AlgorithmKeys, MinibatchKeys

class NoStepKeys(DictKeys):
    Keys = AlgorithmKeys  # only a name: no lr, local_steps, … which every client's steps read

@dataclass
class IntAggregatorKeys(MinibatchKeys):
    aggregator: int = 3

class IntAggregator(DictKeys):
    Keys = IntAggregatorKeys

class ColumnDiagnostic(DictKeys):
    Keys = FedAvgKeys
    server_diagnostics = ("norm", "train_loss")

from raysim.algorithms.fedavg import FedAvg

class UndeclaredDiagnostic(FedAvg):
    def server_direction(self, state, aggregate, updates, weights):
        return aggregate, state.extra, {"norm": 1.0}

class VectorDiagnostic(FedAvg):
    server_diagnostics = ("norm",)

    def server_direction(self, state, aggregate, updates, weights):
        return aggregate, state.extra, {"norm": aggregate[:3]}

class UpdateNorms(FedAvg):
    """Logs each client's update norm in events.parquet."""
    client_diagnostics = ("update_norm",)

    def client_update(self, payloads, ctx):
        out = super().client_update(payloads, ctx)
        out.diagnostics["update_norm"] = out.vector.norm(dim=1, keepdim=True)
        return out

class NormsMissing(FedAvg):
    client_diagnostics = ("update_norm",)

class ProfileDiagnostic(DictKeys):
    Keys = FedAvgKeys
    client_diagnostics = ("speed",)

class OddStepNorm(FedAvg):
    """Reports the aggregate's norm (as a one-element tensor) at odd server steps only."""
    server_diagnostics = ("update_norm", "grad_norm_sq")

    def server_direction(self, state, aggregate, updates, weights):
        step = state.extra.get("step", 0) + 1
        seen = {"update_norm": aggregate.norm().reshape(1), "grad_norm_sq": float(aggregate.square().sum())}
        return aggregate, {**state.extra, "step": step}, seen if step % 2 else {}
'''


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """A package ``my_parts`` outside the repository, importable in this process."""
    (tmp_path / "my_parts").mkdir()
    (tmp_path / "my_parts" / "__init__.py").write_text("")
    (tmp_path / "my_parts" / "lib.py").write_text(textwrap.dedent(PARTS))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.split(".")[0] == "my_parts"]:  # a previous test's copy
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


def test_fednova_example_runs_through_the_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/examples/fednova.yaml",
                           "execution.rounds=8", "eval.every=0", f"output.dir={tmp_path}", "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds"] == 8 and summary["model"]["kind"] == "examples.fednova:two_layer"
    assert 0.25 < summary["final_test_accuracy"] <= 1  # chance is 0.1
    tau_eff = pq.read_table(tmp_path / "rounds.parquet").column("tau_eff").to_pylist()
    assert len(tau_eff) == 8 and all(t > 1 for t in tau_eff)  # clients of 50+ rows take several steps of 10
    assert summary["final_diagnostics"]["tau_eff"] == tau_eff[-1]


ASYNC_STALENESS = ["execution.mode=async", "execution.max_updates=30", "execution.staleness.kind=polynomial",
                   "execution.staleness.a=1"]


@pytest.mark.parametrize("mode", [[], ASYNC_STALENESS, [*ASYNC_STALENESS, "execution.aggregation=fedbuff",
                                                        "execution.buffer_size=3"]],
                         ids=["sync", "fedasync", "fedbuff"])
def test_fednova_with_equal_local_steps_is_fedavg(tmp_path, monkeypatch, mode):
    """Every client takes τ steps: τ_eff·mean(Δ_i/τ) = mean(Δ_i), also when staleness weights
    (which need not sum to 1) weight the updates."""
    monkeypatch.syspath_prepend(str(REPO))
    common = ["algorithm.local_steps=4", "eval.every=0", *mode]
    nova = raysim.run(small_scenario(tmp_path / "nova", *common, "algorithm.name=examples.fednova:FedNova"))
    avg = raysim.run(small_scenario(tmp_path / "avg", *common))
    x = torch.randn(5, 60)
    torch.testing.assert_close(nova.model(x), avg.model(x), rtol=1e-4, atol=1e-5)
    if mode:
        return
    steps = ["system.unreliable.local_steps.kind=uniform_int", "system.unreliable.local_steps.low=1",
             "system.unreliable.local_steps.high=8"]  # unequal steps: FedNova is not FedAvg
    nova = raysim.run(small_scenario(tmp_path / "nova_k", *common, *steps, "algorithm.name=examples.fednova:FedNova"))
    avg = raysim.run(small_scenario(tmp_path / "avg_k", *common, *steps))
    assert nova.summary["model_sha256"] != avg.summary["model_sha256"]


def test_custom_model_and_data_with_options_and_the_python_api(tmp_path, parts):
    cfg = small_scenario(tmp_path, "model.kind=my_parts.lib:tiny_net", "model.options.width=3",
                         "data.kind=my_parts.lib:two_blobs", "data.options.dim=7", "execution.rounds=4")
    result = raysim.run(cfg)
    assert result.rounds.num_rows == 4 and result.events.num_rows == 4 * 12
    assert result.summary["model"] == {"kind": "my_parts.lib:tiny_net", "parameters": 7 * 3 + 3 + 3 * 2 + 2,
                                       "feature_shape": [7], "num_classes": 2}
    assert result.summary["final_test_accuracy"] > 0.7  # two well separated blobs
    loaded = raysim.load_model(result.output_dir)
    x = torch.randn(4, 7)
    assert torch.equal(loaded(x), result.model(x)) and not loaded.training


def test_load_model_of_a_custom_model_without_options(tmp_path, parts):
    """The run's scenario.yaml leaves out the empty model.options; loading fills it in again."""
    result = raysim.run(small_scenario(tmp_path, "model.kind=my_parts.lib:tiny_net", "execution.rounds=1"))
    x = torch.randn(4, 60)
    assert torch.equal(raysim.load_model(result.output_dir)(x), result.model(x))


@pytest.mark.parametrize("overrides, message", [
    (["model.kind=my_parts.nowhere:net"], "model.kind = 'my_parts.nowhere:net': expected an importable module "
                                          "(ModuleNotFoundError: No module named 'my_parts.nowhere')"),
    (["model.kind=my_parts.lib:missing"], "model.kind = 'my_parts.lib:missing': expected a name that module "
                                          "my_parts.lib defines (a function returning a torch.nn.Module)"),
    (["model.kind=my_parts.lib:not_a_module"], "model.kind = 'my_parts.lib:not_a_module': expected a function "
                                               "returning a torch.nn.Module (it returned str)"),
    (["data.kind=my_parts.lib:a_list"], "data.kind = 'my_parts.lib:a_list': expected a function returning a "
                                        "raysim.data.FederatedDataset (it returned list)"),
    (["data.options.dim=3"], "data.options = {'dim': 3}: expected no setting (it applies only with a custom "
                             "data.kind: package.module:function; here data.kind = 'gaussian_mixture')"),
])
def test_custom_entries_fail_with_one_line_naming_the_key(tmp_path, parts, overrides, message):
    kind = [o for o in overrides if o.startswith("model.kind")]
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "validate", str(REPO / "scenarios/quickstart.yaml"),
                           *(["model.hidden=[4]"] if not kind else []), *overrides],
                          cwd=parts, capture_output=True, text=True, timeout=300)
    if kind:  # quickstart's mlp keys do not apply to a custom model: use a scenario without them
        scenario = parts / "s.yaml"
        scenario.write_text("name: s\nmodel: {kind: mlp}\nruntime: {backend: local}\n")
        proc = subprocess.run([sys.executable, "-m", "raysim.cli", "validate", str(scenario), *overrides],
                              cwd=parts, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {message}"


@pytest.mark.parametrize("overrides, message", [
    (["data.kind=my_parts.lib:one_client_more"], "data.kind = 'my_parts.lib:one_client_more': expected a function "
                                                 "returning a raysim.data.FederatedDataset of data.num_clients=100 "
                                                 "clients (it returned 101)"),
    (["data.kind=my_parts.lib:a_nan"], "data.kind = 'my_parts.lib:a_nan': expected a function returning a "
                                       "raysim.data.FederatedDataset with finite features (client 1's row 2 is not)"),
    (["model.kind=my_parts.lib:one_output_too_many", "~model.hidden", "~model.activation"], "model.kind = 'my_parts.lib:one_output_too_many': expected a "
                                                      "function returning a torch.nn.Module whose output is [batch, "
                                                      "10] for the data's 10 classes (one example gives (1, 11))"),
    (["model.kind=my_parts.lib:batch_norm", "~model.hidden", "~model.activation"], "model.kind = 'my_parts.lib:batch_norm': expected a function returning "
                                             "a torch.nn.Module without running statistics (module '2' keeps them: "
                                             "use GroupNorm or LayerNorm, or track_running_stats=False)"),
    (["algorithm.name=my_parts.lib:NoClientUpdate"], "algorithm.name = 'my_parts.lib:NoClientUpdate': expected an "
                                                     "algorithm class that defines client_update"),
    (["algorithm.name=my_parts.lib:DictKeys"], "algorithm.name = 'my_parts.lib:DictKeys': expected an algorithm "
                                               "whose Keys is a dataclass derived from "
                                               "raysim.algorithms.keys.StepKeys (such as FedAvgKeys) (its Keys "
                                               "is dict)"),
    (["algorithm.name=my_parts.lib:NoStepKeys"], "algorithm.name = 'my_parts.lib:NoStepKeys': expected an algorithm "
                                                 "whose Keys is a dataclass derived from "
                                                 "raysim.algorithms.keys.StepKeys (such as FedAvgKeys) (its Keys "
                                                 "is AlgorithmKeys)"),
    (["algorithm.name=my_parts.lib:IntAggregator"], "algorithm.name = 'my_parts.lib:IntAggregator': expected an "
                                                    "algorithm whose Keys gives aggregator a type raysim's keys of "
                                                    "that name have (str), or another name to its own key (it "
                                                    "declares aggregator: int)"),
    (["algorithm.name=my_parts.lib:ColumnDiagnostic"], "algorithm.name = 'my_parts.lib:ColumnDiagnostic': expected "
                                                       "an algorithm whose server_diagnostics is a tuple of distinct "
                                                       "identifiers, none of them a column rounds.parquet already has "
                                                       "(aborted, clients, deployed_loss_gap, dropped, epsilon, eval_seconds, failed, "
                                                       "hessian_min_eig, late, loss_gap, new_client_accuracy, new_client_personalized_accuracy, "
                                                       "objective, parameters, personalized_accuracy, "
                                                       "personalized_accuracy_ci95, personalized_accuracy_mean, "
                                                       "personalized_accuracy_p10, personalized_accuracy_std, "
                                                       "rel_error, round, samples, stale, test_accuracy, test_loss, "
                                                       "total_bytes_down, total_bytes_up, "
                                                       "train_loss, updates_per_second, virtual_time, wall_time; "
                                                       "grad_norm_sq is allowed) (it declares ('norm', 'train_loss'))"),
    (["algorithm.name=my_parts.lib:ProfileDiagnostic"], "algorithm.name = 'my_parts.lib:ProfileDiagnostic': "
                                                        "expected an algorithm whose client_diagnostics is a tuple of "
                                                        "distinct identifiers, none of them a column events.parquet "
                                                        "already has (actor, bytes_down, bytes_up, byzantine, client_id, clip_norm, "
                                                        "compute_seconds, down_mbps, latency_s, local_steps, "
                                                        "model_version, net_tier, node, norm_before_clip, "
                                                        "norm_uploaded, participation, phase, round, samples, "
                                                        "secagg_clipped, slow, "
                                                        "speed, staleness, status, tier, train_loss, up_mbps, "
                                                        "virtual_end, virtual_start) (it declares ('speed',))"),
])
def test_custom_code_that_cannot_work_is_one_line_at_validate(parts, capsys, overrides, message):
    """What a custom data set, model or algorithm returns or declares is checked when it is built
    (in this process: the parts fixture makes my_parts importable)."""
    assert main(["validate", str(REPO / "scenarios/quickstart.yaml"), "runtime.backend=local", *overrides]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_submit_ships_local_code_only(tmp_path, parts):
    from actors.jobs import local_modules

    cfg = small_scenario(tmp_path, "model.kind=my_parts.lib:tiny_net", "algorithm.name=examples.fednova:FedNova")
    assert local_modules(cfg) == [str((parts / "my_parts").resolve())]  # examples/ travels in the working_dir
    assert local_modules(small_scenario(tmp_path, "model.kind=logreg", "algorithm.name=fedprox")) == []


def test_an_algorithm_says_whether_its_timing_reads_the_payload(tmp_path, monkeypatch):
    """The asynchronous driver times planned dispatches before their model versions exist, and then
    handles windows of completions at once, unless the algorithm says its timing reads the payload
    (timing_reads_payload, never inferred): FedNova, whose upload_size does not, takes windows; the
    same class saying it does is timed with each version's own payload, one completion at a time,
    with the same results."""
    from raysim.engine.asynchronous import AsyncUpdates

    monkeypatch.syspath_prepend(str(REPO))
    from examples.fednova import FedNova

    assert "timing_reads_payload" in vars(FedNova) and not FedNova.timing_reads_payload
    windows, handle = [], AsyncUpdates._handle_window
    monkeypatch.setattr(AsyncUpdates, "_handle_window", lambda self, window: windows.append(len(window))
                        or handle(self, window))
    hashes = []
    for reads in (False, True):
        monkeypatch.setattr(FedNova, "timing_reads_payload", reads)
        windows.clear()
        hashes.append(raysim.run(small_scenario(tmp_path / str(reads), *ASYNC_STALENESS, "execution.concurrency=10",
                                                "algorithm.name=examples.fednova:FedNova",
                                                "eval.every=0")).summary["model_sha256"])
        assert bool(windows) != reads
    assert hashes[0] == hashes[1]


def test_an_algorithm_logs_the_diagnostics_it_declares(tmp_path, parts):
    """Each name of server_diagnostics is a rounds.parquet column (null at steps that report
    nothing), its last value is in the summary, and raysim report draws a panel for it."""
    from raysim.report.figures import load_runs, write_report

    result = raysim.run(small_scenario(tmp_path / "run", "algorithm.name=my_parts.lib:OddStepNorm",
                                       "execution.rounds=4", "eval.every=0"))
    norms = result.rounds.column("update_norm").to_pylist()
    assert [n is None for n in norms] == [False, True, False, True] and all(n > 0 for n in norms[::2])
    assert result.rounds.column("grad_norm_sq").to_pylist()[::2] == pytest.approx([n * n for n in norms[::2]])
    assert result.summary["final_diagnostics"] == pytest.approx({"update_norm": norms[2], "grad_norm_sq": norms[2] ** 2})
    assert result.rounds.schema.field("update_norm").type == pa.float64()
    assert load_runs([result.output_dir])[0].own_diagnostics == ("update_norm",)  # grad_norm_sq: a column of its own
    assert "diagnostics_vs_round.png" in {Path(p).name for p in write_report([result.output_dir])}


@pytest.mark.parametrize("mode", [["execution.over_selection=1.5"], ASYNC_STALENESS], ids=["sync", "fedasync"])
def test_an_algorithm_logs_per_client_numbers_in_events(tmp_path, parts, mode):
    """Each name of client_diagnostics is an events.parquet column: the client's number where its
    task returned an update, null for the others (over-selection's surplus)."""
    result = raysim.run(small_scenario(tmp_path, "algorithm.name=my_parts.lib:UpdateNorms", "eval.every=0", *mode))
    events = result.events.to_pydict()
    applied = [status == "applied" for status in events["status"]]
    norms = events["update_norm"]
    assert all((n is not None and 0 < n < 100) == a for n, a in zip(norms, applied))
    assert any(applied) and (not mode[0].startswith("execution.over") or not all(applied))


@pytest.mark.parametrize("name, message", [
    ("NormsMissing", "NormsMissing.client_update returned the client diagnostic 'update_norm' as none for 20 "
                     "clients: one number per client ([20] or [20, 1]), as client_diagnostics names it"),
    ("UndeclaredDiagnostic", "UndeclaredDiagnostic.server_direction reported the diagnostic 'norm', which "
                             "UndeclaredDiagnostic.server_diagnostics does not name (it names []): declare every "
                             "name it reports"),
    ("VectorDiagnostic", "VectorDiagnostic.server_direction reported the diagnostic 'norm' as [3]: a diagnostic is "
                         "one number (a float or a one-element tensor)"),
])
def test_a_diagnostic_that_cannot_be_logged_ends_the_run_with_one_line(tmp_path, parts, capsys, name, message):
    out = tmp_path / "run"
    assert main(["run", str(REPO / "scenarios/quickstart.yaml"), "runtime.backend=local", "execution.rounds=3",
                 f"algorithm.name=my_parts.lib:{name}", f"output.dir={out}", "--quiet"]) != 0
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")] == [f"error: {message}"]
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
