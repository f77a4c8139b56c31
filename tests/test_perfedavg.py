"""Per-FedAvg's three estimators against independent autograd computations, its reduction to SGD
at α = 0, the work a task declares, the personalized evaluation protocol computed by hand, and
its bad-input lines."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from conftest import small_scenario
from omegaconf import OmegaConf
from scipy import stats
from test_bad_input import cli, one_error_line

from raysim.algorithms import AlgorithmEnv, ClientContext, RowData
from raysim.algorithms.keys import PerFedAvgKeys
from raysim.algorithms.local import local_train
from raysim.algorithms.perfedavg import MetaGradientOracle, PerFedAvg
from raysim.scenario import ModelConfig
from raysim.data import FederatedDataset
from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.models import build_model
from raysim.streams import Purpose, stream

CLIENTS = [0, 1, 2]


@pytest.fixture
def setup():
    """Three clients with 30 training and 5 test rows of 4 features, 3 classes; an ELU MLP."""
    rng = np.random.default_rng(5)
    train_x = [rng.normal(size=(30, 4)) for _ in CLIENTS]
    train_y = [rng.integers(0, 3, 30) for _ in CLIENTS]
    test_x = [rng.normal(size=(5, 4)) for _ in CLIENTS]
    test_y = [rng.integers(0, 3, 5) for _ in CLIENTS]
    ds = FederatedDataset.from_clients(train_x, train_y, test_x, test_y, 3, (4,))
    model_cfg = OmegaConf.structured(ModelConfig(kind="mlp", hidden=[5], activation="elu"))
    model = build_model(model_cfg, (4,), 3, seed=1)
    return ds, model, model_cfg


def _context(ds, model, dtype=torch.float32) -> ClientContext:
    rngs = [stream(0, Purpose.CLIENT_TRAIN, c, 7) for c in CLIENTS]
    data = RowData(torch.from_numpy(ds.features().copy()).to(dtype), torch.from_numpy(ds.labels().copy()),
                   ds.offsets()[np.array(CLIENTS)])
    return ClientContext(np.array(CLIENTS), rngs, model, data, torch.device("cpu"))


def _params(model, dtype=torch.float32) -> torch.Tensor:
    """A different point for each client."""
    base = model.initial_vector().to(dtype)
    return base + 0.1 * torch.randn(len(CLIENTS), base.numel(), generator=torch.Generator().manual_seed(2),
                                    dtype=dtype)


def _meta(ctx, variant, alpha, delta=1e-3, batches=(4, 5, 6)) -> MetaGradientOracle:
    plans = [ctx.plan(2, batches[0])] + [ctx.plan(2, b, coins=False) for b in batches[1:]]
    oracles = [ctx.oracle(p) for p in plans]
    return MetaGradientOracle(oracles[0], oracles[1], oracles[2], alpha, variant, delta)


def _batch_loss(model, ctx, rows):
    x, y = ctx.data.features[rows], ctx.data.labels[rows]
    return lambda p: F.cross_entropy(model.logits(p, x), y)


def test_hvp_direction_is_the_meta_gradient_computed_by_autograd(setup):
    ds, model, _ = setup
    ctx = _context(ds, model)
    alpha, step = 0.3, 1
    meta = _meta(ctx, "hvp", alpha)
    params = _params(model)
    direction, _ = meta.gradient(params, step)
    for c in range(len(CLIENTS)):
        s, s1, s2 = (oracle.plan.rows[step, c] for oracle in (meta.inner, meta.outer, meta.curvature))
        g = torch.func.grad(_batch_loss(model, ctx, s))(params[c])
        u = torch.func.grad(_batch_loss(model, ctx, s1))(params[c] - alpha * g)
        hessian = torch.func.hessian(_batch_loss(model, ctx, s2))(params[c])
        expected = u - alpha * hessian @ u  # (I − αH(v; S″)) ∇f(ŵ; S′)
        torch.testing.assert_close(direction[c], expected, rtol=1e-4, atol=1e-6)
        assert not torch.allclose(direction[c], u, atol=1e-4)  # the Hessian term matters here


def test_hessian_free_direction_approaches_hvp_as_delta_shrinks_in_float64(setup):
    ds, model, _ = setup
    params = _params(model, torch.float64)
    exact, _ = _meta(_context(ds, model, torch.float64), "hvp", 0.3).gradient(params, 0)
    errors = []
    for delta in (1e-1, 1e-2, 1e-3, 1e-4):
        approx, _ = _meta(_context(ds, model, torch.float64), "hf", 0.3, delta).gradient(params, 0)
        errors.append(float((approx - exact).norm() / exact.norm()))
    assert all(a > b for a, b in zip(errors, errors[1:])), errors  # a central difference: error ~ δ²
    assert errors[-1] < 1e-8 and errors[0] > 1e-5, errors


@pytest.mark.parametrize("variant", ["fo", "hf", "hvp"])
def test_with_alpha_zero_every_variant_is_sgd_on_the_outer_batches(setup, variant):
    ds, model, model_cfg = setup
    keys = PerFedAvgKeys(lr=0.2, local_steps=3, variant=variant, inner_lr=0.0, batch_size=4, outer_batch_size=6)
    algorithm = PerFedAvg(keys, AlgorithmEnv(model, model_cfg, num_clients=3, seed=0))
    payload = algorithm.payload(algorithm.init(model.initial_vector()))
    updates = algorithm.client_update([payload] * 3, _context(ds, model))

    ctx = _context(ds, model)  # the same streams: S is drawn first, then S′
    ctx.plan(3, 4)
    outer = ctx.plan(3, 6, coins=False)
    start = ctx.start([payload] * 3)
    sgd = local_train(start, ctx.oracle(outer), ctx.transform(outer, 0.2))
    if variant == "fo":
        assert torch.equal(updates.vector, start - sgd.params)
    else:
        torch.testing.assert_close(updates.vector, start - sgd.params, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(updates.train_loss, sgd.loss)


def test_a_task_declares_two_three_or_four_gradient_evaluations_per_step(setup):
    ds, model, model_cfg = setup
    sizes, steps = np.array([30, 50]), np.zeros(2, dtype=np.int64)
    work = {}
    for variant in ("fo", "hvp", "hf"):
        keys = PerFedAvgKeys(local_steps=10, variant=variant, batch_size=10, outer_batch_size=6,
                             hessian_batch_size=4)
        work[variant] = PerFedAvg(keys, AlgorithmEnv(model, model_cfg, 2, 0)).work(sizes, steps, {}).tolist()
    assert work == {"fo": [160, 160], "hvp": [200, 200], "hf": [240, 240]}


def test_personalized_evaluation_is_a_hand_computed_adaptation_step(tmp_path):
    """FedAvg + update with adapt_on=test: each client takes one SGD step of size 0.5 on a batch of
    its test rows (logistic regression, gradients by hand), then tests; the rounds row holds the
    pooled accuracy, the mean over clients and the t-based 95% half-width."""
    cfg = small_scenario(tmp_path, "data.num_clients=6", "model.kind=logreg", "execution.rounds=1",
                         "execution.clients_per_round=3", "algorithm.batch_size=4", "eval.personalized_steps=1",
                         "eval.personalized_lr=0.5", "eval.adapt_on=test")
    prepared = prepare(cfg)
    run_scenario(prepared, LocalRuntime())
    ds, theta = prepared.dataset, prepared.final_params.double().numpy()
    k, d = ds.num_classes, ds.num_features
    x, y = ds.features().astype(np.float64), ds.labels()
    correct, rows = [], []
    for c, (_, lo, hi) in enumerate(ds.offsets()):
        batch = lo + stream(cfg.seed, Purpose.CLIENT_PERSONALIZE, c, 0).permutation(hi - lo)[:4]
        W, b = theta[:k * d].reshape(k, d), theta[k * d:]
        logits = x[batch] @ W.T + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        err = (p - np.eye(k)[y[batch]]) / len(batch)
        W, b = W - 0.5 * err.T @ x[batch], b - 0.5 * err.sum(0)
        correct.append(int(((x[lo:hi] @ W.T + b).argmax(1) == y[lo:hi]).sum()))
        rows.append(hi - lo)
    accuracy = np.array(correct) / np.array(rows)
    last = pq.read_table(tmp_path / "out/rounds.parquet").to_pylist()[-1]
    assert last["personalized_accuracy"] == pytest.approx(sum(correct) / sum(rows), abs=1e-12)
    assert last["personalized_accuracy_mean"] == pytest.approx(accuracy.mean(), abs=1e-12)
    half = stats.t.ppf(0.975, len(accuracy) - 1) * accuracy.std(ddof=1) / math.sqrt(len(accuracy))
    assert last["personalized_accuracy_ci95"] == pytest.approx(half, rel=1e-9)
    assert last["personalized_accuracy_mean"] != last["test_accuracy"]


def test_a_seeded_sample_of_clients_is_evaluated(tmp_path):
    cfg = small_scenario(tmp_path, "execution.rounds=2", "eval.personalized_steps=1", "eval.clients=7")
    from raysim.engine.run_evaluation import evaluated_clients

    chosen = evaluated_clients(cfg, 40)
    assert len(chosen) == 7 and list(chosen) == sorted(set(chosen))
    assert list(chosen) == list(evaluated_clients(small_scenario(tmp_path, "eval.personalized_steps=1",
                                                                 "eval.clients=7"), 40))
    assert list(chosen) != list(evaluated_clients(small_scenario(tmp_path, "seed=1", "eval.personalized_steps=1",
                                                                 "eval.clients=7"), 40))
    summary = run_scenario(prepare(cfg), LocalRuntime())
    assert 0 < summary["final_personalized_accuracy_mean"] <= 1


SCENARIO = "scenarios/paper/perfedavg/perfedavg.yaml"


@pytest.mark.parametrize("overrides, line", [
    (["algorithm.hessian_delta=0"], "algorithm.hessian_delta = 0.0: expected a number > 0"),
    (["algorithm.inner_lr=-0.1"], "algorithm.inner_lr = -0.1: expected a number >= 0"),
    (["algorithm.variant=so"], "algorithm.variant = 'so': expected one of fo, hf, hvp"),
    (["algorithm.batch_size=26"], "algorithm.batch_size = 26: expected at most 25, the training rows of client 10 "
                                  "(10 of 20 clients have fewer than 26)"),
    (["algorithm.variant=hvp", "algorithm.hessian_batch_size=60"],
     "algorithm.hessian_batch_size = 60: expected at most 25, the training rows of client 10 (20 of 20 clients "
     "have fewer than 60)"),
    (["algorithm.variant=fo", "algorithm.hessian_delta=0.01"],
     "algorithm.hessian_delta = 0.01: expected no setting (it applies only with algorithm.variant = hf (here "
     "algorithm.variant = 'fo'))"),
    (["eval.personalized_steps=0", "eval.adapt_on=test"],
     "eval.adapt_on = 'test': expected no setting (it applies only with eval.personalized_steps > 0 or "
     "eval.personalized_epochs > 0 (here both are 0))"),
])
def test_bad_input_is_one_line(capsys, tmp_path, overrides, line):
    from raysim.cli import main

    assert main(["validate", SCENARIO, f"output.dir={tmp_path}/out", *overrides]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"


def test_a_batch_larger_than_a_client_is_refused_before_ray_starts(tmp_path):
    proc = cli("run", SCENARIO, f"output.dir={tmp_path}/out", "algorithm.outer_batch_size=26")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr) == ("error: algorithm.outer_batch_size = 26: expected at most 25, the training "
                                           "rows of client 10 (10 of 20 clients have fewer than 26)")
    assert not (tmp_path / "out").exists()
