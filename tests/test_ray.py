"""Runs on real Ray actors: accuracy, determinism across backends and actor counts, fractional GPUs."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from conftest import small_scenario

from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare

WALL_COLUMNS = {"wall_time", "updates_per_second", "eval_seconds", "compute_seconds", "actor", "node"}


def _run(cfg, runtime):
    prepared = prepare(cfg)
    try:
        return run_scenario(prepared, runtime)
    finally:
        runtime.close()


def _ray_runtime(cfg):
    from actors.runtime import RayRuntime

    return RayRuntime(cfg.runtime)


def _deterministic_columns(path):
    table = pq.read_table(path)
    return {c: table.column(c).to_pylist() for c in table.column_names if c not in WALL_COLUMNS}


def test_quickstart_on_two_actors_reaches_accuracy(ray_session, tmp_path):
    from raysim.scenario import load_scenario

    cfg = load_scenario("scenarios/quickstart.yaml", ["runtime.num_actors=2", f"output.dir={tmp_path}/q",
                                                      "execution.rounds=40"])
    summary = _run(cfg, _ray_runtime(cfg))
    assert summary["num_actors"] == 2 and summary["client_updates"] == 40 * 20
    assert summary["final_test_accuracy"] >= 0.62  # chance: 0.10; the global optimum is about 0.67
    assert summary["final_personalized_accuracy"] > summary["final_test_accuracy"]
    events = pq.read_table(tmp_path / "q/events.parquet").to_pydict()
    assert set(events["actor"]) == {0, 1}  # both actors did work


STRAGGLERS = ["system.compute.kind=lognormal", "system.compute.slow_fraction=0.1", "system.compute.noise=0.2",
              "system.compute.seconds_per_sample=0.05", "system.dropout=0.05"]
MODES = {
    # differential privacy: Poisson rounds, central noise with adaptive clipping; local DP under FedBuff
    "central_dp_poisson_adaptive": ["execution.rounds=4", "execution.sampling=poisson", "runtime.clients_per_task=3",
                                    "privacy.mechanism=central", "privacy.noise_multiplier=0.8",
                                    "privacy.clip_norm=0.5", "privacy.adaptive_clip.target_quantile=0.5",
                                    "privacy.adaptive_clip.count_noise=1"],
    "topk_ef_fedbuff": STRAGGLERS + ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=6",
                                     "execution.concurrency=12", "execution.max_updates=36",
                                     "communication.uplink.kind=topk", "communication.uplink.fraction=0.05",
                                     "communication.uplink.error_feedback=ef"],
    # secure aggregation with dropouts and deadlines: some rounds fall below the threshold and fail
    "secagg_dropouts": STRAGGLERS + ["execution.rounds=5", "execution.clients_per_round=20", "execution.deadline=10",
                                     "runtime.clients_per_task=3", "system.dropout=0.15",
                                     "communication.secure_aggregation.protocol=secagg_plus",
                                     "communication.secure_aggregation.threshold=10"],
    # Elias-coded QSGD with error feedback: each round computed whole, then timed by its uploads' sizes
    "qsgd_elias_ef_deadline": STRAGGLERS + ["execution.rounds=4", "execution.clients_per_round=20",
                                            "execution.deadline=10", "runtime.clients_per_task=3",
                                            "communication.uplink.kind=qsgd", "communication.uplink.coding=elias",
                                            "communication.uplink.error_feedback=ef"],
    # Oort: what it learns of each client (losses, durations) steers the next rounds
    "oort_deadline": STRAGGLERS + ["execution.rounds=5", "execution.clients_per_round=10", "execution.deadline=10",
                                   "runtime.clients_per_task=3", "execution.selection.kind=oort"],
    "local_dp_fedbuff": STRAGGLERS + ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=6",
                                      "execution.concurrency=12", "execution.max_updates=36",
                                      "privacy.mechanism=local", "privacy.noise_multiplier=0.3"],
    "sync": ["execution.rounds=4", "execution.clients_per_round=20", "runtime.clients_per_task=3", "eval.every=2",
             "eval.personalized_steps=2", "data.on_demand=true", "eval.clients=15"],
    # the global model tested by the hosts (eval.where: actors), each evaluation spread over them
    "sync_eval_on_actors": ["execution.rounds=4", "execution.clients_per_round=20", "runtime.clients_per_task=3",
                            "eval.every=1", "eval.where=actors", "data.on_demand=true", "eval.clients=15"],
    "sync_deadline": STRAGGLERS + ["execution.rounds=4", "execution.clients_per_round=20", "execution.deadline=10",
                                   "execution.over_selection=1.2", "runtime.clients_per_task=3"],
    "fedasync": STRAGGLERS + ["execution.mode=async", "execution.concurrency=12", "execution.max_updates=40",
                              "execution.staleness.kind=polynomial", "algorithm.server_lr=0.3", "eval.every=10"],
    # calls of 50 clients, each from its own model version (stacked payloads), and more versions in use than
    # MAX_HANDLES (the broadcast handles' clear-out)
    "fedasync_large_tasks": STRAGGLERS + ["data.num_clients=400", "model.kind=logreg", "execution.mode=async",
                                          "execution.concurrency=150", "execution.max_updates=300",
                                          "runtime.clients_per_task=50", "eval.every=100"],
    "fedbuff": STRAGGLERS + ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=4",
                             "execution.concurrency=12", "execution.max_updates=40", "eval.every=3",
                             "algorithm.lr_decay=0.95", "data.on_demand=true", "system.availability.kind=bernoulli",
                             "system.availability.p=0.7"],
    "async_ffgg": STRAGGLERS + ["data.kind=quadratic", "data.n=60", "data.d_theta=6", "data.d_w=3",
                                "data.realizable=true", "model.kind=quadratic", "model.personal=[w]",
                                "algorithm.name=ffgg", "algorithm.finetuner=cg", "algorithm.local_steps=2",
                                "algorithm.lr_unit=inverse_smoothness", "algorithm.server_lr=0.5",
                                "execution.mode=async", "execution.concurrency=12", "execution.max_updates=40",
                                "data.on_demand=true", "data.cache_mb=0.01"],  # statistics of ~17 clients kept
    "fedacg": ["algorithm.name=fedacg", "execution.rounds=4", "execution.clients_per_round=20",
               "runtime.clients_per_task=3"],
    "feddyn_stateful": ["algorithm.name=feddyn", "execution.rounds=4", "execution.clients_per_round=20",
                        "runtime.clients_per_task=3"],
    "fedyogi": ["algorithm.name=fedyogi", "execution.rounds=4", "execution.clients_per_round=20",
                "runtime.clients_per_task=3"],
    "fedadam_fedbuff": STRAGGLERS + ["algorithm.name=fedadam", "execution.mode=async", "execution.aggregation=fedbuff",
                                     "execution.buffer_size=4", "execution.concurrency=12", "execution.max_updates=40"],
    **{f"perfedavg_{variant}": ["algorithm.name=perfedavg", f"algorithm.variant={variant}", "algorithm.local_steps=2",
                                "algorithm.lr=0.05", "execution.rounds=3", "execution.clients_per_round=20",
                                "runtime.clients_per_task=3", "eval.personalized_steps=1", *extra]
       for variant, extra in [("fo", []), ("hvp", []), ("hf", ["system.unreliable.participation.value=0.5"])]},
    # Ditto: personal models kept per client, tested as they are at each evaluation (on the actors, with their
    # states), and under FedBuff adapted by one step from them
    "ditto": ["algorithm.name=ditto", "algorithm.local_steps=3", "algorithm.personal_steps=4",
              "algorithm.ditto_lambda=0.5", "execution.rounds=4", "execution.clients_per_round=20",
              "runtime.clients_per_task=3", "eval.every=2", "data.on_demand=true", "eval.clients=15"],
    "ditto_fedbuff": STRAGGLERS + ["algorithm.name=ditto", "algorithm.personal_lr=0.1", "execution.mode=async",
                                   "execution.aggregation=fedbuff", "execution.buffer_size=4",
                                   "execution.concurrency=12", "execution.max_updates=40", "eval.every=3",
                                   "eval.personalized_steps=1"],
    # APFL: v_k and α_k kept per client (α under the unreliable-agent model's coins), the mixtures tested as they
    # are; pFedMe: the inner solve's θ̃_k kept and tested on the actors
    "apfl": ["algorithm.name=apfl", "algorithm.local_steps=3", "algorithm.alpha_lr=0.2", "execution.rounds=4",
             "execution.clients_per_round=20", "runtime.clients_per_task=3", "eval.every=2",
             "system.unreliable.participation.value=0.5"],
    "pfedme": ["algorithm.name=pfedme", "algorithm.local_steps=3", "algorithm.inner_steps=2", "execution.rounds=4",
               "execution.clients_per_round=20", "runtime.clients_per_task=3", "eval.every=2", "eval.where=actors"],
    # FedRep and FedPer: heads kept per client, only the body sent; the heads tested at each evaluation (FedRep:
    # as they are, on the actors; FedPer under FedAsync: after a step on the head)
    "fedrep": ["algorithm.name=fedrep", "model.personal=output_layer", "model.personal_state=stateful",
               "algorithm.local_steps=3", "algorithm.head_steps=2", "algorithm.head_lr=0.1", "execution.rounds=4",
               "execution.clients_per_round=20", "runtime.clients_per_task=3", "eval.every=2", "eval.where=actors",
               "data.on_demand=true", "eval.clients=15"],
    "fedper_fedasync": STRAGGLERS + ["algorithm.name=fedper", "model.personal=output_layer",
                                     "model.personal_state=stateful", "execution.mode=async",
                                     "execution.concurrency=12", "execution.max_updates=40", "eval.every=10",
                                     "eval.personalized_steps=1", "system.unreliable.participation.value=0.5"],
    # FedBN: the BatchNorm CNN's normalization layers kept per client; the server model tested on the actors, on
    # batches of one client's rows (batch statistics)
    "fedbn": ["algorithm.name=fedbn", "model.personal=normalization", "model.personal_state=stateful",
              "data.kind=digits", "data.num_clients=20", "model.kind=bn_cnn", "algorithm.local_steps=2",
              "algorithm.batch_size=8", "execution.rounds=2", "execution.clients_per_round=12",
              "runtime.clients_per_task=2", "eval.every=2", "eval.where=actors"],
    # local-only training: updates of no entries, each client's own model kept and tested
    "local_only_fedbuff": STRAGGLERS + ["algorithm.name=local_only", "execution.mode=async",
                                        "execution.aggregation=fedbuff", "execution.buffer_size=4",
                                        "execution.concurrency=12", "execution.max_updates=40", "eval.every=3"],
    "scaffold_stateful": ["data.kind=quadratic", "data.n=60", "data.d_theta=6", "data.d_w=3", "model.kind=quadratic",
                          "algorithm.name=scaffold", "algorithm.local_steps=3", "algorithm.lr_unit=inverse_smoothness",
                          "execution.rounds=4", "execution.clients_per_round=20", "runtime.clients_per_task=3"],
    "saddle_unreliable": ["data.kind=saddle", "model.kind=bilinear", "data.samples_per_client=20", "algorithm.lr=0.1",
                          "algorithm.weight_decay=0.1", "algorithm.local_steps=4", "algorithm.batch_size=1",
                          "system.unreliable.participation.value=0.5", "system.unreliable.coin=round",
                          "system.unreliable.local_steps={kind: uniform_int, low: 1, high: 6}",
                          "system.unreliable.weights=uniform", "system.unreliable.normalize_steps=true",
                          "system.unreliable.gradient_noise=gaussian", "system.unreliable.noise_scale=0.01",
                          "eval.curvature=true", "execution.rounds=4", "execution.clients_per_round=20",
                          "runtime.clients_per_task=3"],
    "byzantine_alie_krum_buckets": ["system.byzantine.fraction=0.2", "system.byzantine.attack=alie",
                                    "algorithm.aggregator=krum", "algorithm.bucket_size=2", "execution.rounds=4",
                                    "execution.clients_per_round=20", "runtime.clients_per_task=3"],
    "byzantine_label_flip_fedbuff": STRAGGLERS + ["system.byzantine.fraction=0.2",
                                                  "system.byzantine.attack=label_flip",
                                                  "algorithm.aggregator=centered_clipping", "algorithm.bucket_size=2",
                                                  "execution.mode=async", "execution.aggregation=fedbuff",
                                                  "execution.buffer_size=6", "execution.concurrency=12",
                                                  "execution.max_updates=40"],
    "byzantine_ipm_fedasync": STRAGGLERS + ["system.byzantine.fraction=0.3", "system.byzantine.attack=ipm",
                                            "system.byzantine.window=5", "execution.mode=async",
                                            "execution.concurrency=12", "execution.max_updates=40"],
}


# CI's short version runs one mode per engine path and per kind of stage; these variants of a path or
# stage another mode covers run with --runslow only, to keep the short version's time: the asynchronous
# modes of baselines whose synchronous mode it runs (ditto, fedrep), Per-FedAvg's second-order variants
# (perfedavg_fo runs the same task shape), FedYogi (the server optimizers' path: fedacg, fedadam_fedbuff),
# local DP (a client stage like top-k with EF, under the same FedBuff loop), pFedMe and FedBN (kept per-client
# models and parts: ditto, apfl and fedrep run those paths)
FULL_VERSION_ONLY = {"ditto_fedbuff", "fedper_fedasync", "perfedavg_hvp", "perfedavg_hf", "fedyogi",
                     "local_dp_fedbuff", "pfedme", "fedbn", "apfl"}


@pytest.mark.parametrize("mode", list(MODES))
def test_identical_results_on_local_and_ray_with_1_2_4_actors(ray_session, tmp_path, mode, request):
    overrides = MODES[mode]
    full = request.config.getoption("--runslow")
    if mode in FULL_VERSION_ONLY and not full:
        pytest.skip("a variant of a mode the short version covers: run with --runslow")
    runs = {"local": small_scenario(tmp_path / "local", *overrides)}
    counts = (1, 2, 4) if full else (2,)  # CI's short version: 2 actors, with the SchedulerActor
    for n in counts:  # the SchedulerActor, except for 2 actors in the full version: the scheduler in this process
        where = "driver" if n == 2 and full else "actor"
        runs[f"ray{n}"] = small_scenario(tmp_path / f"ray{n}", *overrides, f"runtime.num_actors={n}",
                                         f"runtime.scheduler={where}", backend="ray")
    summaries = {}
    for name, cfg in runs.items():
        runtime = LocalRuntime() if name == "local" else _ray_runtime(cfg)
        summaries[name] = _run(cfg, runtime)
    assert [summaries[n]["num_actors"] for n in runs] == [1, *counts]
    reference = summaries["local"]
    for name in runs:
        assert summaries[name]["model_sha256"] == reference["model_sha256"], name
        for key in ["final_test_accuracy", "final_test_loss", "final_personalized_accuracy", "client_updates",
                    "privacy"]:
            assert summaries[name][key] == reference[key], (name, key)
        for table in ["rounds.parquet", "events.parquet"]:
            assert _deterministic_columns(tmp_path / name / "out" / table) == \
                _deterministic_columns(tmp_path / "local" / "out" / table), (name, table)
    actors_used = set(pq.read_table(tmp_path / f"ray{counts[-1]}/out/events.parquet").column("actor").to_pylist())
    assert actors_used - {-1} == set(range(counts[-1]))  # every actor trained


def test_fractional_gpus_two_actors_share_gpu_0(ray_session, tmp_path):
    cfg = small_scenario(tmp_path, "runtime.gpus_per_actor=0.5", "runtime.num_actors=auto",
                         "execution.rounds=1", backend="ray")
    runtime = _ray_runtime(cfg)
    prepared = prepare(cfg)
    runtime.load(prepared.scenario, prepared.dataset)
    try:
        info = runtime.describe()
    finally:
        runtime.close()
    assert runtime.num_actors == 2  # 1 logical GPU / 0.5 per actor
    assert [i["gpu_ids"] for i in info] == [["0"], ["0"]]
    assert [i["cuda_visible_devices"] for i in info] == ["0", "0"]
    assert len({i["pid"] for i in info}) == 2
    assert all(i["device"] == "cpu" for i in info)  # no CUDA on this machine: falls back to CPU


def test_more_actors_than_resources_is_an_input_error(ray_session, tmp_path):
    from raysim.errors import ScenarioError

    cfg = small_scenario(tmp_path, "runtime.num_actors=9", backend="ray")
    runtime = _ray_runtime(cfg)
    prepared = prepare(cfg)
    with pytest.raises(ScenarioError, match=r"runtime.num_actors = 9: expected at most 4 actors"):
        runtime.load(prepared.scenario, prepared.dataset)


def test_cli_run_on_embedded_ray(tmp_path):
    """The README's command: `raysim run` starts its own Ray, shows progress, writes results."""
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml",
                           "algorithm.lr=0.1", "execution.rounds=5", "runtime.num_actors=2", "runtime.num_cpus=2",
                           f"output.dir={tmp_path}/run"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "round 5/5, test accuracy 0." in proc.stderr  # progress: plain lines, stderr being no terminal
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["backend"] == "ray" and summary["num_actors"] == 2 and summary["rounds"] == 5
    assert "final test accuracy" in proc.stdout


def test_payloads_travel_stacked_by_structure_and_arrive_as_their_own_tensors(ray_session):
    """A call's inline payloads are stacked, one array per key for the versions of one structure;
    the actor gets each version back as tensors of its own (writable, equal to what was sent), and
    object-store payloads as they were put."""
    import numpy as np
    import ray
    import torch

    from actors.payloads import pack, unpack

    rng = np.random.default_rng(0)
    inline = {v: {"params": rng.random(5, dtype=np.float32)} for v in (3, 4, 9)}
    inline[7] = {"params": rng.random(2), "m": rng.random((2, 2))}  # another structure
    stored = {"params": torch.arange(3.0)}
    refs, groups = pack({**inline, 11: ray.put(stored)})
    assert list(refs) == [11]
    assert [(versions, {k: a.shape for k, a in arrays.items()}) for versions, arrays in groups] == [
        ((3, 4, 9), {"params": (3, 5)}), ((7,), {"params": (1, 2), "m": (1, 2, 2)})]
    for _, arrays in groups:
        for array in arrays.values():
            array.setflags(write=False)  # as Ray hands them to the actor
    payloads = unpack(refs, groups)
    assert torch.equal(payloads[11]["params"], stored["params"])
    for version, payload in inline.items():
        assert payloads[version].keys() == payload.keys()
        for key, array in payload.items():
            got = payloads[version][key]
            assert got.dtype == torch.from_numpy(array).dtype and np.array_equal(got.numpy(), array)
            assert got.storage_offset() == 0 and got.is_contiguous()  # a tensor of its own, not a view
            assert got.untyped_storage().nbytes() == array.nbytes
            got += 1  # writable


def test_errors_are_reported_by_what_the_task_or_constructor_raised():
    """summary.json's error names the exception a Ray task raised, not Ray's wrapper (whose first
    line is a coloured ``ray::ClientActor.run()``); a constructor's failure, its last line."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from raysim.engine.run import _error_line
    from raysim.errors import RunError, last_line

    raised = "Traceback (most recent call last):\n  File \"algos.py\", line 3, in client_update\nRuntimeError: boom"
    task = RayTaskError("ClientActor.run", raised, RuntimeError("boom")).as_instanceof_cause()
    assert _error_line(task) == "RuntimeError: boom"
    assert _error_line(ValueError("bad\nmore")) == "ValueError: bad"
    assert _error_line(RunError("client 5 diverged")) == "client 5 diverged"
    died = ActorDiedError(RayTaskError("ClientActor.__init__", raised, RuntimeError("boom")))
    assert "\x1b[" in str(died) and last_line(died) == "RuntimeError: boom"
