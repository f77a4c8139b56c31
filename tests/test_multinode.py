"""A real two-node Ray cluster on this machine (separate raylets, logical GPUs): placement over
both nodes, fractional GPUs seen from inside the actors, results equal the single-node run."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from conftest import init_session_ray, small_scenario

from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    session = ray.is_initialized()  # the test session's Ray: started again afterwards
    if session:
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2})
    try:
        cluster.add_node(num_cpus=2, num_gpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR")
        yield cluster
    finally:  # shut everything down, also when a test fails
        ray.shutdown()
        cluster.shutdown()
        if session:
            init_session_ray()


@pytest.mark.parametrize("placement", ["spread", "pack"])
def test_actors_on_both_nodes_with_fractional_gpus_and_identical_results(two_nodes, tmp_path, placement):
    from actors.runtime import RayRuntime

    rounds = ["execution.rounds=3", "execution.clients_per_round=16"]
    cfg = small_scenario(tmp_path / "cluster", "runtime.cpus_per_actor=0.5", "runtime.gpus_per_actor=0.5",
                         "runtime.num_actors=auto", f"runtime.placement={placement}", *rounds, backend="ray")
    runtime = RayRuntime(cfg.runtime)
    try:
        summary = run_scenario(prepare(cfg), runtime)
    finally:
        runtime.close()
    actors = summary["actors"]
    assert summary["num_actors"] == 8  # 2 nodes x min(2 CPUs / 0.5, 2 GPUs / 0.5)
    assert all(len(a["gpu_ids"]) == 1 for a in actors)  # each actor holds a share of one GPU
    per_gpu = {}
    for a in actors:
        per_gpu.setdefault((a["node"], a["gpu_ids"][0]), []).append(a["actor"])
    assert all(len(v) <= 2 for v in per_gpu.values())  # 0.5 GPU each: at most two actors per GPU
    nodes = {a["node"] for a in actors}
    assert len(nodes) == 2  # 8 actors do not fit on one node
    event_nodes = set(pq.read_table(tmp_path / "cluster/out/events.parquet").column("node").to_pylist())
    assert event_nodes <= nodes
    if placement == "spread":  # the round's 4 tasks go to actors 0-3, which SPREAD put on both nodes
        assert len(event_nodes) == 2

    single = small_scenario(tmp_path / "single", *rounds, backend="local")
    reference = run_scenario(prepare(single), LocalRuntime())
    assert summary["model_sha256"] == reference["model_sha256"]
    assert summary["final_test_accuracy"] == reference["final_test_accuracy"]


def test_auto_actor_count_fills_every_node():
    from omegaconf import OmegaConf

    from actors.runtime import plan_actors
    from raysim.scenario import RuntimeConfig
    from raysim.errors import ScenarioError

    quarter = OmegaConf.structured(RuntimeConfig(gpus_per_actor=0.25, cpus_per_actor=0.5))
    assert plan_actors(quarter, [(8.0, 2.0), (8.0, 2.0)]) == 16  # 2 nodes x 2 GPUs at 0.25
    assert plan_actors(quarter, [(1.0, 2.0), (8.0, 2.0), (4.0, 0.0)]) == 2 + 8  # CPUs bound the first node
    one_gpu = OmegaConf.structured(RuntimeConfig(gpus_per_actor=1.0, num_actors=3))
    with pytest.raises(ScenarioError, match=r"runtime.num_actors = 3: expected at most 2 actors"):
        plan_actors(one_gpu, [(4.0, 1.0), (4.0, 1.0)])
    with pytest.raises(ScenarioError, match=r"runtime.gpus_per_actor = 2.0: expected a share that fits"):
        plan_actors(OmegaConf.structured(RuntimeConfig(gpus_per_actor=2.0)), [(4.0, 1.0), (4.0, 1.0)])
