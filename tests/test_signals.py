"""A second Ctrl-C or SIGTERM stops a run promptly, even when its current step never ends (issue 41:
signals waited for the step, and a model whose forward hangs, or a huge number of local steps,
ignored two of them for 45 s and more): the run keeps its last checkpoint, writes an interrupted
summary, releases its directory and leaves no actor behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HANGING_MODEL = '''
import os, pathlib, time
from torch import nn


class Hang(nn.Module):
    def __init__(self, feature_shape, num_classes):
        super().__init__()
        self.linear = nn.Linear(feature_shape[0], num_classes)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 3:  # the first step's forward hangs, as a model that never returns
            pathlib.Path(os.environ["HANG_MARKER"]).write_text("hanging")
            time.sleep(10_000)
        return self.linear(x)


def hang(feature_shape, num_classes):
    return Hang(feature_shape, num_classes)
'''


@pytest.mark.parametrize("backend, signum", [("local", signal.SIGINT), ("ray", signal.SIGTERM)])
def test_a_second_signal_stops_a_step_that_never_ends(tmp_path, backend, signum):
    (tmp_path / "hanging.py").write_text(HANGING_MODEL)
    marker, out = tmp_path / "marker", tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml",
                             "model.kind=hanging:hang", "~model.hidden", "~model.activation", f"output.dir={out}",
                             f"runtime.backend={backend}", *(["runtime.num_cpus=2"] if backend == "ray" else [])],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "HANG_MARKER": str(marker), "PYTHONPATH": f"{REPO}:{tmp_path}"})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signum)
        time.sleep(1.5)
        assert proc.poll() is None  # the first signal waits for the step
        proc.send_signal(signum)
        began = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - began < 10, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum if signum == signal.SIGTERM else proc.returncode == 130
    assert "stopping after the current step (Ctrl-C again to stop now)" in err and "Traceback" not in err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert not (out / ".raysim.lock").exists()


@pytest.mark.parametrize("address, ending", [
    ("http://127.0.0.1:1", "or auto (http:// is a job server's address: raysim submit --address takes it)"),
    ("ray://127.0.0.1:1", "or auto: nothing answers at 127.0.0.1:1 ([Errno 111] Connection refused)"),
])
def test_a_cluster_address_that_cannot_be_joined_is_one_line_in_seconds(tmp_path, address, ending):
    """These ended in tracebacks."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml",
                           f"runtime.address={address}", f"output.dir={tmp_path / 'out'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": ""})
    assert time.monotonic() - began < 30
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: runtime.address = '{address}': expected host:port of a running Ray "
                               "cluster's head (GCS), ray://host:port, or auto") and ending in lines[0]


def test_auto_with_a_stale_cluster_file_is_refused_in_seconds(tmp_path, monkeypatch):
    """`auto` with the file of a cluster long gone hung for 150 s and more, printing Ray's GCS
    retries. Ray's `auto` prefers a GCS process running on the host, when there is exactly one,
    to the file (a test session's own Ray would be joined): here none is found, as on a machine
    where the recorded cluster has gone."""
    ray_services = pytest.importorskip("ray._private.services")
    from actors.runtime import _check_reachable
    from raysim.errors import ScenarioError

    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_services, "find_gcs_addresses", lambda: [])
    began = time.monotonic()
    with pytest.raises(ScenarioError) as refused:
        _check_reachable("auto")
    assert time.monotonic() - began < 15
    assert re.fullmatch(r"runtime.address = 'auto': expected host:port of a running Ray cluster's head \(GCS\), "
                        r"ray://host:port, or auto: nothing answers at (\S+):1 \(auto found \1:1\) \(.*refused\)",
                        str(refused.value))  # Ray writes 127.0.0.1 as the node's address
