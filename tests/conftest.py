"""Shared fixtures: small scenarios and one Ray session for the whole test run."""

from __future__ import annotations

import os
import socket

import psutil
import pytest

from raysim.scenario import load_scenario
from raysim.data.kinds import CLIENTS_FROM_FILES

# 4 logical CPUs (so 4 one-CPU actors fit on this 2-core machine) and 1 logical GPU
# (fractional-GPU placement is checked without hardware).
RAY_CPUS, RAY_GPUS = 4, 1


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run the tests marked slow (full fault-injection "
                                                            "and scaling runs)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def small_scenario(tmp_path, *overrides, backend="local"):
    """A fast scenario (Gaussian mixture, 40 clients, MLP) with overrides, writing under tmp_path.
    The base's MLP size and round settings are left out when the overrides choose another model
    kind or asynchronous mode (a key that would be ignored is an error)."""
    return load_scenario(None, small_overrides(tmp_path, *overrides, backend=backend))


def small_overrides(tmp_path, *overrides, backend="local") -> list:
    """The ``key=value`` list that :func:`small_scenario` loads (for command lines)."""
    chosen = dict(o.split("=", 1) for o in overrides)
    base = ["name=small", "data.kind=gaussian_mixture", "model.kind=mlp",
            "runtime.clients_per_task=5", f"runtime.backend={backend}", f"output.dir={tmp_path}/out",
            "eval.every=1", "output.flush_seconds=0"]
    if chosen.get("data.kind") not in CLIENTS_FROM_FILES:  # else the files decide the clients
        base.append("data.num_clients=40")
    if chosen.get("model.kind", "mlp") == "mlp":
        base.append("model.hidden=[16]")
    if chosen.get("execution.mode", "sync") == "sync":
        base += ["execution.rounds=3", "execution.clients_per_round=12"]
    return base + list(overrides)


def checkpointed(tmp_path, *overrides) -> tuple:
    """The run state a small run checkpoints after its first round (of 3), and that round's events."""
    import io

    import pyarrow.parquet as pq
    import raysim
    import torch
    from test_resume import StopAfter

    cfg = small_scenario(tmp_path, *overrides, "execution.rounds=3", "output.checkpoint_every=1")
    with pytest.raises(KeyboardInterrupt):
        raysim.run(cfg, progress=StopAfter(1))
    outer = torch.load(tmp_path / "out/checkpoint.pt", weights_only=True)
    state = torch.load(io.BytesIO(outer["body"]), weights_only=True)["state"]
    return state, pq.read_table(tmp_path / "out/events.parquet").to_pylist()


def init_session_ray():
    """Start the test session's embedded Ray (RAY_CPUS logical CPUs, RAY_GPUS logical GPUs)."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # address="local": a Ray of its own, even while another test session's Ray runs on this machine
    ray.init(address="local", num_cpus=RAY_CPUS, num_gpus=RAY_GPUS, include_dashboard=False, logging_level="ERROR")


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for every test that needs it (RayRuntime reuses it and leaves it running);
    a module that needs another cluster (test_multinode) starts it again when done."""
    ray = pytest.importorskip("ray")
    init_session_ray()
    yield ray
    ray.shutdown()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_processes(sid: int) -> list:
    """The live processes of session ``sid`` (a process started with ``start_new_session=True``
    leads one; Ray's daemons and agents started under it stay in it)."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


def kill_processes(processes: list) -> None:
    """SIGKILL each of ``processes`` that is still alive."""
    for p in processes:
        try:
            p.kill()
        except psutil.Error:
            pass


# Two clients of a tiny row data set for pinning an algorithm's client step by hand in numpy:
# 12 training and 5 test rows of 3 features each, 3 classes, logistic regression.
HAND_CLIENTS = [0, 1]
HAND_TRAIN, HAND_TEST, HAND_FEATURES, HAND_CLASSES = 12, 5, 3, 3



def cli_in_own_session(*args, timeout=300):
    """``python -m raysim.cli ARGS`` in a process (and session) of its own, as a CompletedProcess:
    whatever of its Ray is left when it ends is killed, also when the test fails."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        kill_processes(session_processes(proc.pid))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def hand_rows(model_cfg):
    """(data set, model built from ``model_cfg``) of the two :data:`HAND_CLIENTS`."""
    import numpy as np

    from raysim.data import FederatedDataset
    from raysim.models import build_model

    rng = np.random.default_rng(3)
    train_x = [rng.normal(size=(HAND_TRAIN, HAND_FEATURES)) for _ in HAND_CLIENTS]
    train_y = [rng.integers(0, HAND_CLASSES, HAND_TRAIN) for _ in HAND_CLIENTS]
    test_x = [rng.normal(size=(HAND_TEST, HAND_FEATURES)) for _ in HAND_CLIENTS]
    test_y = [rng.integers(0, HAND_CLASSES, HAND_TEST) for _ in HAND_CLIENTS]
    ds = FederatedDataset.from_clients(train_x, train_y, test_x, test_y, HAND_CLASSES, (HAND_FEATURES,))
    return ds, build_model(model_cfg, (HAND_FEATURES,), HAND_CLASSES, seed=1)


@pytest.fixture
def logreg_clients():
    """:func:`hand_rows` with logistic regression: (data set, model, model section)."""
    from omegaconf import OmegaConf

    from raysim.scenario import ModelConfig

    model_cfg = OmegaConf.structured(ModelConfig(kind="logreg"))
    return (*hand_rows(model_cfg), model_cfg)


def hand_context(ds, model, states=None, purpose=None):
    """The ClientContext of a task of the two :data:`HAND_CLIENTS` (float64 rows; their streams of
    seed 0, task counter 4, for ``purpose``, client training by default)."""
    import numpy as np
    import torch

    from raysim.algorithms import ClientContext, RowData
    from raysim.streams import Purpose, stream

    rngs = [stream(0, purpose or Purpose.CLIENT_TRAIN, c, 4) for c in HAND_CLIENTS]
    data = RowData(torch.from_numpy(ds.features().copy()).double(), torch.from_numpy(ds.labels().copy()),
                   ds.offsets()[np.array(HAND_CLIENTS)])
    return ClientContext(np.array(HAND_CLIENTS), rngs, model, data, torch.device("cpu"), states=states)


def logreg_grad(theta, x, y):
    """The mean cross-entropy's gradient of logistic regression (θ = [W (k×d) row-major, b]) by hand."""
    import numpy as np

    weights = HAND_CLASSES * HAND_FEATURES
    W, b = theta[:weights].reshape(HAND_CLASSES, HAND_FEATURES), theta[weights:]
    logits = x @ W.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    err = (p - np.eye(HAND_CLASSES)[y]) / len(y)
    return np.concatenate([(err.T @ x).ravel(), err.sum(0)])
