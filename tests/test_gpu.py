"""On a machine with a CUDA GPU (skipped elsewhere): clients train (and a synchronous run's model is
tested) on the GPU in fractional-GPU actors, and the results are the same bytes whatever the number
of actors sharing it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SMALL_W3 = ["data.num_clients=100", "execution.rounds=2", "execution.clients_per_round=20", "eval.clients=50",
            "runtime.clients_per_task=5"]
SMALL_W1_ASYNC = ["execution.max_updates=300", "execution.concurrency=40"]


def _run(tmp_path, workload: str, overrides: list, actors: int, share: float) -> dict:
    out = tmp_path / f"{workload}-{actors}x{share}"
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", f"scenarios/bench/{workload}.yaml", "--quiet",
                           *overrides, f"runtime.num_actors={actors}", f"runtime.gpus_per_actor={share}",
                           "runtime.num_gpus=1", f"output.dir={out}"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("workload, overrides", [("w3", SMALL_W3), ("w1_async", SMALL_W1_ASYNC)])
def test_one_two_and_four_actors_per_gpu_give_the_same_model(tmp_path, workload, overrides):
    runs = {actors: _run(tmp_path, workload, overrides, actors, 1.0 / actors) for actors in (1, 2, 4)}
    for summary in runs.values():
        assert {a["device"] for a in summary["actors"]} == {"cuda"}
        # eval.where auto: the GPU actors test a synchronous run's model, the driver an asynchronous one's
        assert summary["evaluated_on"] == ("actors" if workload == "w3" else "driver")
    for figure in ("model_sha256", "final_test_accuracy", "final_test_loss", "virtual_time", "client_updates"):
        assert len({s[figure] for s in runs.values()}) == 1, figure
