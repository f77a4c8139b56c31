"""How a run starts and ends as processes: a private embedded Ray even when another cluster is on
the host, input refused before Ray starts, exit statuses on signals, and no process left behind
(the guardian ends the driver's descendants, even after SIGKILL of the driver)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest
from conftest import free_port, kill_processes, session_processes

from raysim.scenario import load_scenario

pytest.importorskip("ray")

RUN = ["scenarios/quickstart.yaml", "runtime.backend=ray", "runtime.num_cpus=2", "--quiet"]


def _titles(processes: list) -> list:
    titles = []
    for p in processes:
        try:
            titles.append(" ".join(p.cmdline()).strip())
        except psutil.Error:
            continue
    return titles


def _wait_until(predicate, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def _guardians(driver_pid: int) -> list:
    return [p for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [])[-2:] == ["raysim.lifecycle", str(driver_pid)]]


@pytest.fixture
def raysim_run(tmp_path):
    """Start ``raysim run`` (a long Ray run) in a session of its own; afterwards kill whatever
    of that session, and its guardian, is still alive."""
    started = []

    def start(*overrides, env=None):
        proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", "run", *RUN, "execution.rounds=100000",
                                 f"output.dir={tmp_path}/run", *overrides], env=env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            kill_processes(session_processes(proc.pid) + _guardians(proc.pid))
            proc.kill()
            proc.wait()


def _wait_for_actors(proc) -> None:
    """Until the run's ClientActors exist (Ray and its agents started, the run about to go on),
    and a little longer, for the guardian to have recorded them."""
    assert _wait_until(lambda: any(t.startswith("ray::ClientActor") for t in _titles(session_processes(proc.pid))), 120), \
        proc.stderr.read() if proc.poll() is not None else "no ClientActor"
    time.sleep(1.0)


def _ended_cleanly(proc, status: int) -> str:
    """Wait for the driver's exit; check its status and that its session and guardian are gone
    within 10 s; returns its stderr."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert _wait_until(lambda: not session_processes(proc.pid) and not _guardians(proc.pid), 10), \
        _titles(session_processes(proc.pid))
    assert "Traceback" not in err and "SIGTERM received" not in err and "***" not in err, err
    return err


def test_sigkill_of_the_driver_leaves_no_process_and_says_so(raysim_run, tmp_path):
    proc = raysim_run()
    _wait_for_actors(proc)
    agents = [t for t in _titles(session_processes(proc.pid)) if t.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent"))]
    assert len(agents) == 2, agents  # the raylet's children, which outlived the driver before
    proc.send_signal(signal.SIGKILL)
    _check_reported_lost(_ended_cleanly(proc, -signal.SIGKILL), proc, tmp_path)


def _check_reported_lost(err: str, proc, tmp_path) -> None:
    """The guardian's line closes stderr, and the run's lock is gone."""
    assert err.strip().splitlines()[-1].startswith(
        f"error: the run's process (pid {proc.pid}) ended without finishing: it was killed, or Ray ended it because "
        f"its raylet was lost; what it wrote is in {tmp_path}/run ("), err
    assert os.path.exists(f"{tmp_path}/run/scenario.yaml") and not os.path.exists(f"{tmp_path}/run/.raysim.lock")


def test_a_guardian_killed_first_is_replaced_and_still_ends_what_the_driver_leaves(raysim_run, tmp_path):
    proc = raysim_run()
    _wait_for_actors(proc)
    first = _guardians(proc.pid)
    assert len(first) == 1
    first[0].kill()
    assert _wait_until(lambda: [g.pid for g in _guardians(proc.pid)] not in ([], [first[0].pid]), 10)
    time.sleep(1.0)  # the new guardian has recorded the driver's descendants (Ray's agents among them)
    proc.send_signal(signal.SIGKILL)
    _check_reported_lost(_ended_cleanly(proc, -signal.SIGKILL), proc, tmp_path)  # told the run, too


def test_losing_the_raylet_ends_the_run_with_one_line_and_no_lock(raysim_run, tmp_path):
    proc = raysim_run()
    _wait_for_actors(proc)
    raylets = [p for p in session_processes(proc.pid) if "raylet" in p.name()]
    assert len(raylets) == 1, _titles(session_processes(proc.pid))
    raylets[0].kill()  # Ray's core worker then ends the driver itself: no Python code of the run runs after
    _, err = proc.communicate(timeout=120)  # with Ray's own lines before (the actors' stack traces among them)
    assert proc.returncode == 1, err
    assert _wait_until(lambda: not session_processes(proc.pid) and not _guardians(proc.pid), 10), \
        _titles(session_processes(proc.pid))
    _check_reported_lost(err, proc, tmp_path)


def test_ctrl_c_while_ray_starts_exits_130_and_leaves_no_process(raysim_run, tmp_path):
    proc = raysim_run()
    assert _wait_until(lambda: any("gcs_server" in t for t in _titles(session_processes(proc.pid))), 120, step=0.01)
    proc.send_signal(signal.SIGINT)  # ray.init is still starting the raylet and the agents
    err = _ended_cleanly(proc, 130)
    # the checkpoint there is another scenario's: resuming it would not continue this run
    assert err.strip().splitlines()[-1] == (f"interrupted before the run's first checkpoint: nothing to resume in "
                                            f"{tmp_path}/run"), err


def test_ctrl_c_while_the_local_backend_loads_torch_waits_for_the_import():
    """A signal that arrives while torch is being imported (in the main thread, for the local
    backend) is delivered once the import is over: an import cut short would leave torch broken for
    the lines that follow (a traceback, or a crash)."""
    script = textwrap.dedent("""
        import signal, sys, threading, time
        from raysim.api import make_runtime
        from raysim.scenario import load_scenario
        from raysim.lifecycle import handle_signals
        cfg = load_scenario("scenarios/quickstart.yaml", ["runtime.backend=local"])
        assert "torch" not in sys.modules
        handle_signals()
        threading.Timer(0.2, signal.raise_signal, (signal.SIGINT,)).start()  # torch takes longer than that
        try:
            make_runtime(cfg)
            time.sleep(30)
        except KeyboardInterrupt:
            import torch
            print("usable", float(torch.ones(2).sum()))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "usable 2.0", proc.stderr


def test_ctrl_c_before_the_scenario_is_loaded_says_nothing_was_written(tmp_path, monkeypatch, capsys):
    from raysim.cli import main

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("raysim.scenario.load.load_scenario", interrupted)
    monkeypatch.setattr("raysim.lifecycle.guarded", __import__("contextlib").nullcontext)  # it would end this
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}     # session's Ray
    try:
        assert main(["run", "scenarios/quickstart.yaml", f"output.dir={tmp_path}/out"]) == 130
    finally:  # main() leaves its handlers, which after a first signal ignore the next ones
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert capsys.readouterr().err.strip() == "interrupted before the run started: nothing was written"
    assert not (tmp_path / "out").exists()


def test_two_quick_ctrl_c_exit_130_and_leave_no_process(raysim_run):
    proc = raysim_run()
    _wait_for_actors(proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # during the clean-up: must not interrupt it
    err = _ended_cleanly(proc, 130)
    assert err.strip().splitlines()[-1].startswith("interrupted"), err


def test_sigterm_stops_like_ctrl_c_with_status_143(raysim_run):
    proc = raysim_run()
    _wait_for_actors(proc)
    proc.send_signal(signal.SIGTERM)
    err = _ended_cleanly(proc, 143)
    assert err.strip().splitlines()[-1].startswith("terminated"), err


# ---------------------------------------------------------------------- the guardian, without Ray

FAKE_DRIVER = """
    import subprocess, sys, time
    from raysim.lifecycle import guarded

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with guarded():
        child = subprocess.Popen(sleeper)
        # a child that starts a grandchild and exits a second later (the guardian has seen the
        # grandchild by then): the grandchild is re-parented to PID 1
        middle = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                                   f"print(subprocess.Popen({sleeper!r}).pid, flush=True); time.sleep(1)"],
                                  stdout=subprocess.PIPE)
        grandchild = int(middle.stdout.readline())
        middle.wait()
        print(child.pid, grandchild, flush=True)
        time.sleep(float(sys.argv[1]))
"""


@pytest.mark.parametrize("ending", ["sigkill", "normal"])
def test_the_guardian_ends_only_what_descended_from_the_driver(ending):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    seconds = "60" if ending == "sigkill" else "1"  # that the fake driver lives
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(FAKE_DRIVER), seconds], stdout=subprocess.PIPE,
                              text=True)
    try:
        descendants = [psutil.Process(int(pid)) for pid in driver.stdout.readline().split()]
        if ending == "sigkill":
            time.sleep(1.0)  # the guardian has recorded them
            driver.kill()
        assert driver.wait(timeout=30) == (-signal.SIGKILL if ending == "sigkill" else 0)
        assert _wait_until(lambda: not any(p.is_running() for p in descendants) and not _guardians(driver.pid), 10)
        assert bystander.poll() is None  # never seen descending from the driver: left alone
    finally:
        kill_processes(descendants + _guardians(driver.pid))
        driver.kill()
        bystander.kill()
        bystander.wait()


# ---------------------------------------------------------------------- a private embedded Ray

@pytest.fixture(scope="module")
def foreign_cluster():
    """A Ray head started by ``ray start`` (1 CPU) in a session and temp dir of its own: the
    host's current cluster for processes with RAY_TMPDIR set to that dir. Yields
    (environment, GCS address, its session id); every process of that session is killed afterwards."""
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must stay short
    env = {**os.environ, "RAY_TMPDIR": temp}
    port = free_port()
    starter = subprocess.Popen(["ray", "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                                "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats"],
                               env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        out, _ = starter.communicate(timeout=180)
        assert starter.returncode == 0, out
        assert os.path.exists(os.path.join(temp, "ray", "ray_current_cluster"))
        yield env, f"127.0.0.1:{port}", starter.pid
    finally:  # always, also when a test fails
        kill_processes(session_processes(starter.pid))
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("route", ["ray_address", pytest.param("current_cluster", marks=pytest.mark.slow)])
def test_run_starts_its_own_ray_beside_a_ray_start_cluster(foreign_cluster, tmp_path, route):
    env, address, sid = foreign_cluster
    if route == "ray_address":
        env = {**env, "RAY_ADDRESS": address}
    before = {p.pid for p in session_processes(sid)}
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", *RUN, "execution.rounds=2",
                           "runtime.num_actors=2", f"output.dir={tmp_path}/run"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Token authentication" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["num_actors"] == 2  # 2 CPUs of its own: the foreign head has 1
    assert before <= {p.pid for p in session_processes(sid)}  # the foreign cluster is untouched


# ---------------------------------------------------------------------- input refused before Ray starts

def test_more_actors_than_the_embedded_cpus_is_refused_before_ray_starts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", *RUN, "runtime.num_actors=3",
                           f"output.dir={tmp_path}/run"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": "127.0.0.1:1"})  # not a Ray job's: ignored
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: runtime.num_actors = 3: expected at most 2 actors (1 node(s), 2 CPUs at runtime.cpus_per_actor=1), "
        "or 'auto'"], proc.stderr


def test_embedded_plan_checks_only_a_private_ray(monkeypatch):
    from actors.runtime import embedded_plan
    from raysim.errors import ScenarioError

    cfg = load_scenario("scenarios/quickstart.yaml", ["runtime.num_cpus=2", "runtime.num_actors=3"])
    with pytest.raises(ScenarioError, match=r"^runtime.num_actors = 3: expected at most 2 actors"):
        embedded_plan(cfg.runtime)
    assert embedded_plan(load_scenario("scenarios/quickstart.yaml", ["runtime.num_cpus=2"]).runtime) == 2
    joining = load_scenario("scenarios/quickstart.yaml", ["runtime.num_actors=3", "runtime.address=10.0.0.1:6379"])
    assert embedded_plan(joining.runtime) is None  # a cluster's size is known only there
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # as inside a Ray job
    assert embedded_plan(cfg.runtime) is None


@pytest.mark.parametrize("shares", [["runtime.num_cpus=3", "runtime.cpus_per_actor=0.1"],
                                    ["runtime.num_cpus=8", "runtime.num_gpus=2", "runtime.gpus_per_actor=0.5"]])
def test_the_memory_estimate_counts_the_actors_the_plan_starts(shares):
    from actors.runtime import embedded_plan
    from raysim.footprint import _actors

    cfg = load_scenario("scenarios/quickstart.yaml", shares)
    planned = embedded_plan(cfg.runtime)
    assert planned == (30 if "runtime.cpus_per_actor=0.1" in shares else 4)  # 3 / 0.1 is 29.99…; 2 GPUs / 0.5
    assert _actors(cfg.runtime) == planned  # the estimate's count of client hosts


# ---------------------------------------------------------------------- Ray's token

def test_the_ray_token_is_created_readable_by_its_user_only(tmp_path, monkeypatch):
    from actors.runtime import keep_token_private

    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / ".ray" / "auth_token"
    keep_token_private(str(path))
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0  # 256 random bits in hex, as Ray makes them
    path.chmod(0o644)  # as Ray writes it with a usual umask
    keep_token_private(str(path))
    assert oct(path.stat().st_mode & 0o777) == "0o600" and path.read_text() == token  # the same token, now private


@pytest.mark.parametrize("env", [{"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_TOKEN": "x" * 64}])
def test_no_token_file_is_made_when_ray_takes_none(tmp_path, monkeypatch, env):
    from actors.runtime import keep_token_private

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    keep_token_private(str(tmp_path / ".ray" / "auth_token"))
    assert not (tmp_path / ".ray").exists()
