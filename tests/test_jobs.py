"""`raysim submit` / `raysim jobs` against a real Ray head started with `ray start --head`,
bound to 127.0.0.1 (its job server on a free local port)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import free_port, kill_processes, session_processes

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def head():
    """A Ray head in its own temp dir; only its processes are stopped afterwards."""
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must stay short
    port, dashboard = free_port(), free_port()
    cmd = ["ray", "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
           "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
           f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
           f"--metrics-export-port={free_port()}", f"--temp-dir={temp}", "--disable-usage-stats"]
    starter = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = starter.communicate(timeout=180)
        assert starter.returncode == 0, out
        yield f"http://127.0.0.1:{dashboard}"
    finally:  # always shut the head down, also when a test fails: every process of its session
        kill_processes(session_processes(starter.pid))
        shutil.rmtree(temp, ignore_errors=True)


def _raysim(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "raysim.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_ADDRESS": ""})


def test_submit_runs_the_job_and_writes_results(head, tmp_path):
    out = tmp_path / "job"
    proc = _raysim("submit", "scenarios/quickstart.yaml", "execution.rounds=2", "eval.personalized_steps=0",
                   f"output.dir={out}", "--address", head, "--follow")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("submitted job ") and lines[-1].endswith("SUCCEEDED")
    # --follow streams the job's plain progress lines and its closing line (issue 41)
    assert "round 2/2" in proc.stdout
    assert any(line.startswith("quickstart: 2 rounds, 40 client updates, final test accuracy") for line in lines)
    job_id = lines[0].split()[2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["backend"] == "ray"
    assert (out / "rounds.parquet").exists() and (out / "events.parquet").exists()
    listing = _raysim("jobs", "--address", head)
    assert listing.returncode == 0 and job_id in listing.stdout and "SUCCEEDED" in listing.stdout


def test_a_failing_job_is_a_clear_error(head, tmp_path):
    proc = _raysim("submit", "scenarios/quickstart.yaml", "algorithm.lr=1e30", f"output.dir={tmp_path}/bad",
                   "--address", head)
    assert proc.returncode == 1
    assert proc.stdout.startswith("submitted job ")  # the id is printed before anything else happens
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: job ")
    assert "FAILED: error: round 1: client" in proc.stderr and "diverged" in proc.stderr


def test_bad_input_is_refused_before_submitting(head):
    proc = _raysim("submit", "scenarios/quickstart.yaml", "data.kind=nope", "--address", head)
    assert proc.returncode == 2 and proc.stderr.startswith("error: data.kind = 'nope'") and not proc.stdout
    proc = _raysim("submit", "scenarios/quickstart.yaml", "--address", "http://127.0.0.1:1")
    assert proc.returncode == 2 and "error: --address = 'http://127.0.0.1:1'" in proc.stderr


def test_plain_ray_job_submit_works_too(head, tmp_path):
    """The README's plain-Ray path: `ray job submit --working-dir . -- python -m raysim.cli run …`."""
    out = tmp_path / "plain"
    proc = subprocess.run(["ray", "job", "submit", "--address", head, "--working-dir", ".", "--",
                           "python", "-m", "raysim.cli", "run", "scenarios/quickstart.yaml", "execution.rounds=1",
                           "eval.personalized_steps=0", f"output.dir={out}", "--quiet"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RAY_ADDRESS": "", "RAY_AUTH_MODE": "token"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "succeeded" in proc.stdout.lower()
    assert json.loads((out / "summary.json").read_text())["rounds"] == 1


EXT = '''
from torch import nn
from raysim.algorithms.fedavg import FedAvg

class Damped(FedAvg):
    """FedAvg that applies half of the averaged update (a custom algorithm outside the repository)."""

    def server_direction(self, state, aggregate, updates, weights):
        return 0.5 * aggregate, state.extra, {}

def net(feature_shape, num_classes, width=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(feature_shape[0], width), nn.ReLU(), nn.Linear(width, num_classes))
'''


def test_submit_ships_a_custom_algorithm_and_model_from_outside_the_repository(head, tmp_path):
    package = tmp_path / "ext" / "my_ext"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "parts.py").write_text(EXT)
    out = tmp_path / "custom"
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "submit", "scenarios/examples/fednova.yaml",
                           "algorithm.name=my_ext.parts:Damped", "model.kind=my_ext.parts:net", "execution.rounds=2",
                           f"output.dir={out}", "runtime.backend=ray", "--address", head, "--follow"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(tmp_path / "ext")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["backend"] == "ray"
    assert summary["model"]["kind"] == "my_ext.parts:net" and summary["model"]["parameters"] == 60 * 32 + 32 + 32 * 10 + 10
    assert "my_ext.parts:Damped" in (out / "scenario.yaml").read_text()
