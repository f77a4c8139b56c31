"""On a machine with a CUDA GPU (skipped elsewhere): clients train on the GPU in fractional-GPU
actors, and the results are the same bytes whatever the number of actors sharing it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SMALL_W3 = ["data.num_clients=100", "execution.rounds=2", "execution.clients_per_round=20", "eval.clients=50",
            "runtime.clients_per_task=5"]


def _run(tmp_path, actors: int, share: float) -> dict:
    out = tmp_path / f"{actors}x{share}"
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/bench/w3.yaml", "--quiet", *SMALL_W3,
                           f"runtime.num_actors={actors}", f"runtime.gpus_per_actor={share}", "runtime.num_gpus=1",
                           f"output.dir={out}"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "summary.json").read_text())


def test_w3_on_one_two_and_four_actors_per_gpu_gives_the_same_model(tmp_path):
    runs = {actors: _run(tmp_path, actors, 1.0 / actors) for actors in (1, 2, 4)}
    for summary in runs.values():
        assert {a["device"] for a in summary["actors"]} == {"cuda"}
    assert len({s["model_sha256"] for s in runs.values()}) == 1
    assert len({s["final_test_accuracy"] for s in runs.values()}) == 1
