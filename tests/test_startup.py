"""Start-up and shut-down of a run: the scenario and its data are checked without torch, Ray
starts while torch loads and the model is built, a model rejected meanwhile still gives one
clear line, and an embedded Ray leaves no process behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import weakref

import pytest

from conftest import small_scenario
from raysim import catalog
from raysim.preparation import prepare
from raysim.errors import ScenarioError
from raysim.models import ACTIVATIONS


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


def test_scenario_and_data_are_checked_without_importing_torch():
    proc = _python("""
        import sys
        from raysim.scenario import load_scenario
        from raysim.data import build_dataset
        from raysim.preparation import prepare
        from raysim.system import SystemModel
        from actors.runtime import embedded_resources, plan_actors
        cfg = load_scenario("scenarios/bench/w1.yaml", ["model.personal=output_layer", "algorithm.name=ffgg"])
        dataset = build_dataset(cfg.data, cfg.seed)
        SystemModel(cfg.system, dataset.num_clients, cfg.seed)
        cpus, gpus = embedded_resources(cfg.runtime)
        plan_actors(cfg.runtime, [(cpus, gpus or 0.0)])
        assert gpus is None, gpus  # CPU-only actors: Ray counts GPUs itself
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"



def test_a_run_reaches_prepare_before_torch_loads():
    """``raysim.api.execute`` (what ``raysim run`` calls) imports nothing that loads torch before
    ``prepare``, which loads it in a thread while Ray starts: torch's seconds overlap Ray's."""
    proc = _python("""
        import sys
        import raysim.api, raysim.preparation
        from raysim.scenario import load_scenario

        class Seen(Exception):
            pass

        def prepare(cfg, **kwargs):
            raise Seen(sorted(m for m in sys.modules if m == "torch"))

        raysim.preparation.prepare = prepare
        cfg = load_scenario("scenarios/bench/w1.yaml", ["output.dir=/nonexistent"])  # on Ray, not yet started
        try:
            raysim.api.execute(cfg)
        except Seen as seen:
            print(seen.args[0])
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"

def test_the_catalog_names_exactly_what_the_builders_build():
    for name, builtin in catalog.ALGORITHMS.items():
        keys = builtin.keys
        cls = catalog.algorithm_class(name)
        assert cls.Keys is keys, name  # the registry's keys are the class's own
        assert keys.__doc__ and catalog.algorithm_doc(keys), name
    assert set(catalog.ACTIVATIONS) == set(ACTIVATIONS)


def test_prepare_runs_meanwhile_once_and_returns_the_model(tmp_path):
    calls = []
    prepared = prepare(small_scenario(tmp_path), meanwhile=lambda: calls.append("started"))
    assert calls == ["started"]
    assert prepared.model.size > 0 and prepared.dataset.num_clients == 40


def test_a_model_rejected_while_meanwhile_ran_raises_after_it(tmp_path):
    calls = []
    with pytest.raises(ScenarioError, match=r"^model.personal = \['nothing_matches'\]"):
        prepare(small_scenario(tmp_path, "model.personal=[nothing_matches]", "algorithm.name=ffgg"),
                meanwhile=lambda: calls.append("started"))
    assert calls == ["started"]


def test_cli_model_rejected_after_ray_started_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml", "--quiet",
                           "algorithm.name=ffgg", "model.personal=[nothing_matches]", "runtime.num_cpus=1",
                           f"output.dir={tmp_path}/run"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: model.personal = ['nothing_matches']: expected "), \
        proc.stderr


def test_embedded_ray_closes_every_process_it_started():
    """The embedded Ray runs no autoscaler monitor (one node never autoscales) and no dashboard
    head (include_dashboard=False), and RayRuntime.close() ends every daemon and worker it started."""
    proc = _python("""
        import time, psutil
        from raysim.scenario import load_scenario
        from actors.runtime import RayRuntime
        cfg = load_scenario("scenarios/quickstart.yaml", ["runtime.num_cpus=1"])
        runtime = RayRuntime(cfg.runtime)
        runtime.start()
        runtime.start()  # a second call does nothing
        started = psutil.Process().children(recursive=True)
        print("monitor" if any("autoscaler" in " ".join(p.cmdline()) for p in started) else "no monitor",
              "dashboard" if any("dashboard.py" in " ".join(p.cmdline()) for p in started) else "no dashboard",
              "raylet" if any("raylet" in " ".join(p.cmdline()) for p in started) else "no raylet")
        runtime.close()
        gone, alive = psutil.wait_procs(started, timeout=30)
        print("alive:", [" ".join(p.cmdline())[:80] for p in alive])
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["no monitor no dashboard raylet", "alive: []"], proc.stdout


def test_long_lived_loads_without_gc_then_freezes():
    import gc

    from raysim.long_lived import long_lived

    class Node:
        pass

    frozen_before = gc.get_freeze_count()
    try:
        with long_lived():
            assert not gc.isenabled()
            loaded = [[i] for i in range(1000)]  # GC-tracked objects made while loading
            garbage = Node()
            garbage.itself = garbage  # a cycle only the collector can free
            left_behind = weakref.ref(garbage)
            del garbage
            assert left_behind() is not None
        assert gc.isenabled() and gc.get_freeze_count() >= frozen_before + len(loaded)
        assert left_behind() is None  # collected, not frozen
        gc.disable()
        with pytest.raises(RuntimeError):
            with long_lived():
                raise RuntimeError("load failed")
        assert not gc.isenabled()  # a collector the caller had turned off stays off
    finally:
        gc.unfreeze()
        gc.enable()
