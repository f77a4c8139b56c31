"""Results pinned to their bytes: short runs across the algorithm families, whose final model's
SHA-256 was taken on commit 9a0df88 (before the scenario layer and the server-step pipeline were
reorganised). A structural change that moves a single bit of any of them fails here; a change
meant to alter results must say so and pin the new bytes."""

from __future__ import annotations

import pytest
from conftest import small_overrides

from raysim.scenario import load_scenario
from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare

FEDBUFF = ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=4",
           "execution.concurrency=6", "execution.max_updates=24"]
FEDASYNC = ["execution.mode=async", "execution.aggregation=fedasync", "execution.concurrency=6",
            "execution.max_updates=40", "execution.staleness.kind=polynomial"]
STRAGGLERS = ["system.compute.kind=lognormal", "system.compute.sigma=1.0"]
KRUM = ["system.byzantine.fraction=0.2", "system.byzantine.attack=sign_flip", "algorithm.aggregator=krum",
        "algorithm.bucket_size=2"]
QUADRATIC = ["data.kind=quadratic", "data.num_clients=8", "data.n=50", "data.d_theta=6", "data.d_w=4",
             "data.realizable=true", "model.kind=quadratic", "model.personal=[w]", "algorithm.name=ffgg",
             "algorithm.lr_unit=inverse_smoothness", "algorithm.server_lr=0.5", "eval.every=0"]

# name -> (scenario file, or None for the small Gaussian-mixture scenario; overrides)
CASES = {
    "fedavg_sync": (None, []),
    "fedavg_deadline": (None, [*STRAGGLERS, "execution.deadline=0.05", "execution.over_selection=1.5"]),
    "fedbuff": (None, [*FEDBUFF, *STRAGGLERS]),
    "fedasync": (None, [*FEDASYNC, *STRAGGLERS]),
    "fedasync_client_momentum": (None, [*FEDASYNC, "algorithm.client_momentum=0.5"]),
    "fedasync_ipm_window": (None, [*FEDASYNC, "system.byzantine.fraction=0.2", "system.byzantine.attack=ipm",
                                   "system.byzantine.window=4"]),
    "scaffold": (None, ["algorithm.name=scaffold"]),
    "scaffold_fedbuff": (None, [*FEDBUFF, "algorithm.name=scaffold"]),
    "fedacg": (None, ["algorithm.name=fedacg"]),
    "feddyn": (None, ["algorithm.name=feddyn"]),
    "fedyogi": (None, ["algorithm.name=fedyogi"]),
    "fedprox": (None, ["algorithm.name=fedprox", "algorithm.prox_mu=0.1"]),
    "perfedavg": (None, ["algorithm.name=perfedavg", "eval.personalized_steps=1"]),
    "ffgg_quadratic": (None, [*QUADRATIC, "algorithm.finetuner=cg", "algorithm.local_steps=5",
                                     "execution.clients_per_round=8"]),
    "ffgg_async": (None, [*QUADRATIC, "algorithm.finetuner=cg", "algorithm.local_steps=5", "execution.mode=async",
                          "execution.concurrency=4", "execution.max_updates=30", *STRAGGLERS]),
    "saddle": ("scenarios/paper/saddle/saddle.yaml", ["execution.rounds=30", "data.num_clients=20"]),
    "byzantine_krum_bucketing": (None, KRUM),
    "br_ffgg": ("scenarios/paper/br_ffgg/br_ffgg.yaml",
                ["execution.rounds=20", "algorithm.aggregator=krum", "algorithm.bucket_size=2"]),
}

PINNED = {  # name -> model_sha256 on 9a0df88
    "br_ffgg": "9fb0e5448f767991a181f8d86162c8dbdbd2a625b8511cbfe8e77e80c87496af",
    "byzantine_krum_bucketing": "ac32af1e6e3f25b5aee8a24effb1829f6522821ce3c1dba5b8e041826de7b8d9",
    "fedacg": "01e21b4c52c3ec8351abddb1685e5b521a294a5e62a392ae406c592cd3533652",
    "fedasync": "970bde1d9d4b882ec018300f9d8d800657864cbece3f7107eeff2bc1a4640cfe",
    "fedasync_client_momentum": "761ba64ff178850bfb1775a3664a52c56190db7c53dce92df77796e239eb360b",
    "fedasync_ipm_window": "259aebb4708284de258bfe1a6b6d30c05a43d9df12e8a3b6411864e04853ad0f",
    "fedavg_deadline": "242f29e69adb4fb3a087f7022fb0df5ef5840f039ef827aefd47f5098b353d2f",
    "fedavg_sync": "c7bcdc8c9645a6041de9969bdfb2256fb5887be89839763a819efcf06c046862",
    "fedbuff": "7204c1f2655a4a67e3a32c1a5dc258d2fc122f195a1847ff25d21fb5d4b1750c",
    "feddyn": "c36634506a1e2c88172bd07ada74d68b5039732f23d6ec7eb2f2918d4be45425",
    "fedprox": "f60a4d456b363cad495ed64282d146ae94b6e9087b4536529db27ca24cd38152",
    "fedyogi": "f86420a53a4644e50fd045dfdbf6067e6bcfc868b2d751f7b55590e5fee97ba4",
    "ffgg_async": "7f497becdafc333389f134be2abd258573c0f4716ee89804b89886d17f8d8937",
    "ffgg_quadratic": "bfd0a2406c6375ca5081a1657d5d35c6a808f308c6ed760012dabc1d085e6d5e",
    "perfedavg": "44d21b7b9d0a261e910bb017a00fe5a963215b3b2dcf98371f8bb41602d39259",
    "saddle": "d2558da9f6df5e3c5d4b1422121b3a1996c0334660b670a5bf1f5b9a9ce6ef00",
    "scaffold": "7b3f1a6967ed9286c20d297b44027a7233991740c0d7852958104a484cf12dcf",
    "scaffold_fedbuff": "76e8a7b0e5acef3ecaf4d7efd24d89cb321c2a11968764ff952ecbae6f8e7146",
}


def _overrides(tmp_path, scenario, overrides) -> list:
    if scenario is None:
        return small_overrides(tmp_path, *overrides)
    return [f"output.dir={tmp_path}/out", "runtime.backend=local", *overrides]


def model_sha256(tmp_path, name: str) -> str:
    scenario, overrides = CASES[name]
    cfg = load_scenario(scenario, _overrides(tmp_path, scenario, overrides))
    runtime = LocalRuntime()
    try:
        return run_scenario(prepare(cfg), runtime)["model_sha256"]
    finally:
        runtime.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_bytes_are_pinned(tmp_path, name):
    assert model_sha256(tmp_path, name) == PINNED[name]
