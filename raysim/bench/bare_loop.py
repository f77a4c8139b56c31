"""The reference: a bare single-process, single-thread PyTorch FedAvg loop over a scenario's data.

No vectorization, no Ray: one client after another, plain SGD steps written out
(no optimizer object, so none of its overhead). Same data, model, sampling and hyperparameters
as ``raysim run``. Usage: ``python -m raysim.bench.bare_loop SCENARIO OUT_JSON``.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from raysim.scenario import load_scenario
from raysim.data import build_dataset
from raysim.models import build_model
from raysim.system import SystemModel


def bare_fedavg(cfg) -> dict:
    """Train like ``cfg`` describes (FedAvg, sync rounds) in a plain loop; returns timings and accuracy."""
    torch.set_num_threads(1)
    began = time.perf_counter()
    dataset = build_dataset(cfg.data, cfg.seed).materialize()  # a plain loop over one table
    x = torch.from_numpy(dataset.features().copy())
    y = torch.from_numpy(dataset.labels().copy())
    offsets = dataset.offsets()
    net = build_model(cfg.model, dataset.feature_shape, dataset.num_classes, cfg.seed).module
    global_state = {k: v.clone() for k, v in net.state_dict().items()}
    a, ex = cfg.algorithm, cfg.execution
    gen = torch.Generator().manual_seed(cfg.seed)
    system = SystemModel(cfg.system, dataset.num_clients, cfg.seed)
    round_seconds = []
    for r in range(ex.rounds):
        round_began = time.perf_counter()
        total = {k: torch.zeros_like(v) for k, v in global_state.items()}
        clients = system.sample_available(0.0, r, ex.clients_per_round)  # raysim's sampling (always available)
        samples = int(sum(offsets[c, 1] - offsets[c, 0] for c in clients))
        for c in clients:
            lo, hi = offsets[c, 0], offsets[c, 1]
            net.load_state_dict(global_state)
            params = list(net.parameters())
            for _ in range(a.local_epochs):
                perm = torch.randperm(hi - lo, generator=gen) + lo
                for i in range(0, hi - lo, a.batch_size):
                    idx = perm[i:i + a.batch_size]
                    grads = torch.autograd.grad(F.cross_entropy(net(x[idx]), y[idx]), params)
                    with torch.no_grad():
                        for p, g in zip(params, grads):
                            p.sub_(g + a.weight_decay * p, alpha=a.lr)
            for k, v in net.state_dict().items():
                total[k] += v * ((hi - lo) / samples)
        global_state = total
        round_seconds.append(time.perf_counter() - round_began)
    net.load_state_dict(global_state)
    test = np.concatenate([np.arange(lo, hi) for _, lo, hi in offsets])
    with torch.no_grad():
        accuracy = float((net(x[test]).argmax(1) == y[test]).float().mean())
    return {"round_seconds": round_seconds, "final_test_accuracy": accuracy,
            "wall_seconds": time.perf_counter() - began, "clients_per_round": ex.clients_per_round}


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    result = bare_fedavg(load_scenario(scenario, ["runtime.backend=local"]))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
