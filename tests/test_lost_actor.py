"""ClientActors whose process dies: a new actor takes each one's place, its calls run again and
results stay bit-identical; one that keeps dying ends the run with one RunError line."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pyarrow.parquet as pq
import pytest
from conftest import small_scenario

from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.errors import RunError
from raysim.scenario import scenario_object

ray = pytest.importorskip("ray")

from actors.runtime import ACTOR_REPLACEMENTS, ClientActorGroup, RayRuntime  # noqa: E402  (needs ray)

ASYNC = ["execution.mode=async", "execution.concurrency=12", "execution.max_updates=40",
         "system.compute.kind=lognormal", "system.compute.noise=0.2"]
CASES = {  # overrides, where the scheduler runs
    "sync": (["execution.rounds=4", "eval.where=actors"], "driver"),  # evaluation calls, too, may be lost
    "fedbuff": (ASYNC + ["execution.aggregation=fedbuff", "execution.buffer_size=4"], "actor"),
    "fedasync": (ASYNC, "driver"),
}


@pytest.fixture
def flaky_pool(ray_session):
    """A ClientActorGroup of two tiny actors with ClientActor's interface (``run``, ``info``; defined
    here so that Ray ships the class by value), each in its bundle of a placement group."""
    from ray.util.placement_group import placement_group, remove_placement_group

    @ray.remote
    class Flaky:
        def __init__(self, actor_index):
            self.actor_index = actor_index

        def run(self, handles, tasks):
            time.sleep(0.5)
            return [2 * t for t in tasks]

        def info(self):
            return {"node": "n", "pid": os.getpid()}

    group = placement_group([{"CPU": 0.01}] * 2)
    pool = ClientActorGroup(Flaky, {"num_cpus": 0.01}, group, 2)
    try:
        yield pool
    finally:
        for actor in pool.actors:
            ray.kill(actor)
        remove_placement_group(group)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _actor_processes(title: str) -> list:
    """This process's descendants (the ray_session's workers) whose title starts with ``title``."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if " ".join(p.cmdline()).startswith(title):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_a_killed_actor_is_replaced_and_its_calls_run_again(flaky_pool):
    pool = flaky_pool
    pids = [info["pid"] for info in pool.describe()]
    pending = [pool.submit(0, {}, [1, 2]), pool.submit(1, {}, [3]), pool.submit(0, {}, [4])]
    _kill(pids[0])  # while its two calls are queued or running
    assert pool.gather(pending) == [[2, 4], [6], [8]]
    assert sorted(pool.lost_tasks()) == [(0, 1), (0, 2), (0, 4)]
    assert pool.lost_tasks() == []  # reported once
    assert pool.deaths() == [0] and pool.deaths() == []  # one death, though two of its calls were lost
    after = [info["pid"] for info in pool.describe()]
    assert after[1] == pids[1] and after[0] != pids[0]


def test_an_actor_that_keeps_dying_is_one_run_error(flaky_pool):
    pool, stop = flaky_pool, threading.Event()

    def keep_killing():  # every process an actor of the pool runs in
        while not stop.is_set():
            for p in _actor_processes("ray::Flaky"):
                _kill(p.pid)
            time.sleep(0.05)

    pool.describe()
    killer = threading.Thread(target=keep_killing)
    killer.start()
    try:
        with pytest.raises(RunError) as caught:
            pool.gather([pool.submit(0, {}, [1])])
    finally:
        stop.set()
        killer.join()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"ClientActor 0 died {ACTOR_REPLACEMENTS + 1} times (replaced at most "
                              f"{ACTOR_REPLACEMENTS} times): The actor died")


def _run_killing_actor_0(cfg, lost: list) -> dict:
    """Run ``cfg`` on Ray and SIGKILL ClientActor 0 after the first report; ``lost`` receives
    what the pool of this process reported as run again."""
    runtime = RayRuntime(cfg.runtime)
    killed = []

    def progress(report):
        if not killed and not report["done"]:
            killed.append(runtime.describe()[0]["pid"])
            _kill(killed[0])

    prepared = prepare(cfg)
    original = ClientActorGroup.lost_tasks

    def spy(pool):
        found = original(pool)
        lost.extend(found)
        return found

    ClientActorGroup.lost_tasks = spy
    try:
        summary = run_scenario(prepared, runtime, progress=progress)
    finally:
        ClientActorGroup.lost_tasks = original
        runtime.close()
    assert killed and not psutil.pid_exists(killed[0])
    assert summary["actors"][0]["pid"] != killed[0]  # actor 0 runs in a new process
    return summary


def _check_identical_after_a_kill(tmp_path, case, capsys):
    overrides, where = CASES[case]
    reference = small_scenario(tmp_path / "local", *overrides)
    expected = run_scenario(prepare(reference), LocalRuntime())
    # a checkpoint after every server step: the scheduler reports after each, the first one mid-run
    cfg = small_scenario(tmp_path / "ray", *overrides, "runtime.num_actors=2", f"runtime.scheduler={where}",
                         "output.checkpoint_every=1", backend="ray")
    lost = []
    summary = _run_killing_actor_0(cfg, lost)
    for key in ["model_sha256", "final_test_loss", "final_test_accuracy"]:
        assert summary[key] == expected[key], key
    if where == "driver":  # the pool is in this process: what it ran again is seen here
        assert lost and {actor for actor, _ in lost} == {0}
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ClientActor")]
    assert warnings == ["warning: ClientActor 0 died; a new one took its place and runs its lost tasks again "
                        "(with the same results; events.parquet marks them 'retried')"]  # one line per death


@pytest.mark.parametrize("case", ["sync", "fedbuff"])
def test_results_are_identical_after_a_client_actor_is_killed(ray_session, tmp_path, case, capsys):
    _check_identical_after_a_kill(tmp_path, case, capsys)


@pytest.mark.slow
def test_results_are_identical_after_a_client_actor_is_killed_fedasync(ray_session, tmp_path, capsys):
    _check_identical_after_a_kill(tmp_path, "fedasync", capsys)


def test_an_actor_killed_during_start_up_is_replaced(ray_session, tmp_path):
    """SIGKILL of the first ClientActor process seen while RayRuntime.load creates them."""
    cfg = small_scenario(tmp_path, "execution.rounds=1", "runtime.num_actors=1", backend="ray")
    runtime = RayRuntime(cfg.runtime)
    killed, stop = [], threading.Event()
    earlier = {p.pid for p in _actor_processes("ray::ClientActor")}  # of earlier tests, perhaps still exiting

    def kill_first_client_actor():
        while not stop.is_set() and not killed:
            for p in _actor_processes("ray::ClientActor"):
                if p.pid not in earlier:
                    _kill(p.pid)
                    killed.append(p.pid)
                    break
            time.sleep(0.02)

    killer = threading.Thread(target=kill_first_client_actor)
    prepared = prepare(cfg)
    at_reports = []  # whether the kill had happened, at each report
    killer.start()
    try:
        summary = run_scenario(prepared, runtime, progress=lambda report: at_reports.append(bool(killed)))
    finally:
        stop.set()
        killer.join()
        runtime.close()
    assert at_reports[0] and summary["actors"][0]["pid"] != killed[0]
    assert summary["rounds"] == 1


def test_a_lost_scheduler_actor_is_scheduler_lost_and_a_new_one_can_start(ray_session, tmp_path):

    from actors.runtime import SchedulerLost

    reference = small_scenario(tmp_path / "local", "execution.rounds=3")
    expected = run_scenario(prepare(reference), LocalRuntime())["model_sha256"]
    cfg = small_scenario(tmp_path / "ray", "execution.rounds=3", "runtime.num_actors=1", "runtime.scheduler=actor",
                         backend="ray")
    scenario = scenario_object(cfg)
    runtime = RayRuntime(cfg.runtime)
    earlier = {p.pid for p in _actor_processes("ray::SchedulerActor")}
    try:
        dataset = runtime.load(scenario, prepare(cfg).dataset)
        first = runtime.scheduler(scenario, dataset)
        first.advance(0.0)  # one server step
        [process] = [p for p in _actor_processes("ray::SchedulerActor") if p.pid not in earlier]
        _kill(process.pid)
        with pytest.raises(SchedulerLost, match=r"^the SchedulerActor was lost: "):
            first.advance(0.5)
        second = runtime.scheduler(scenario, dataset)
        second.advance(0.0)
        third = runtime.scheduler(scenario, dataset)  # the second, still alive, is killed
        with pytest.raises(SchedulerLost):
            second.advance(0.5)
        while not third.advance(0.5)["done"]:
            pass
        assert third.finish()["model_sha256"] == expected  # a new scheduler over the same ClientActors
        assert [info["actor"] for info in runtime.describe()] == [0]
    finally:
        runtime.close()


def test_a_run_restarts_a_lost_scheduler_actor_from_its_last_checkpoint(ray_session, tmp_path):
    reference = small_scenario(tmp_path / "local", "execution.rounds=6")
    expected = run_scenario(prepare(reference), LocalRuntime())
    cfg = small_scenario(tmp_path / "ray", "execution.rounds=6", "runtime.num_actors=1", "runtime.scheduler=actor",
                         "output.checkpoint_every=2", backend="ray")
    runtime = RayRuntime(cfg.runtime)
    earlier = {p.pid for p in _actor_processes("ray::SchedulerActor")}
    killed = {}

    def progress(report):
        """At steps 2 and 4, before their checkpoints: the run state cannot be taken, and the run
        goes back to the checkpoint before (the first one, at step 0, then step 2's)."""
        if report["version"] in (2, 4) and report["version"] not in killed:
            [process] = [p for p in _actor_processes("ray::SchedulerActor") if p.pid not in earlier]
            earlier.add(process.pid)
            killed[report["version"]] = process.pid
            _kill(process.pid)

    try:
        summary = run_scenario(prepare(cfg), runtime, progress=progress)
    finally:
        runtime.close()
    assert sorted(killed) == [2, 4] and summary["scheduler_restarts"] == 2
    assert summary["model_sha256"] == expected["model_sha256"] and summary["rounds"] == 6
    rounds = pq.read_table(f"{cfg.output.dir}/rounds.parquet")
    assert rounds.column("round").to_pylist() == list(range(1, 7))  # the steps run twice are written once
