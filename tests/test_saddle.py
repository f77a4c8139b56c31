"""The saddle-escape experiment of Vlaski, Rizk and Sayed, "Second-Order Guarantees in Federated
Learning": the saddle data and bilinear model, the unreliable-agent model's step normalisation and
per-round coins, the curvature evaluation, bad input, escape and determinism."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import small_scenario
from test_bad_input import cli, one_error_line

import raysim
from raysim.algorithms import ClientContext
from raysim.scenario import load_scenario, scenario_object
from raysim.data import build_dataset
from raysim.engine.evaluation import CurvatureEvaluator
from raysim.engine.host import ClientHost, Task
from raysim.preparation import prepare
from raysim.errors import ScenarioError
from raysim.models import build_model
from raysim.streams import Purpose, stream

SCENARIO = "scenarios/paper/saddle/saddle.yaml"
RHO = 0.1  # the scenario's weight decay ρ


def scenario(*overrides):
    """The checked-in saddle scenario with overrides (validated)."""
    return load_scenario(SCENARIO, list(overrides))


def host_of(cfg) -> tuple:
    """(a ClientHost of the scenario, its data set)."""
    dataset = build_dataset(cfg.data, cfg.seed)
    return ClientHost(scenario_object(cfg), dataset.table), dataset


def train_rows(dataset) -> tuple:
    """Every client's training rows: (h [N, d] float64, γ [N] ±1, client of each row [N])."""
    offsets = dataset.offsets()
    rows = np.concatenate([np.arange(lo, hi) for lo, hi, _ in offsets])
    clients = np.repeat(np.arange(len(offsets)), offsets[:, 1] - offsets[:, 0])
    return dataset.features()[rows].astype(np.float64), 2.0 * dataset.labels()[rows] - 1.0, clients


def risk(theta: torch.Tensor, h: np.ndarray, gamma: np.ndarray, row_weights: np.ndarray) -> torch.Tensor:
    """J(θ) = Σ rows weight·log(1 + exp(−γ·w₁ᵀW₂h)) + (ρ/2)‖θ‖², written out (not with the model's code)."""
    d = h.shape[1]
    w1, w2 = theta[:d], theta[d:].reshape(d, d)
    z = torch.from_numpy(h) @ w2.T @ w1
    return torch.nn.functional.softplus(-torch.from_numpy(gamma) * z) @ torch.from_numpy(row_weights) \
        + 0.5 * RHO * theta @ theta


def test_saddle_data_follow_their_law_and_a_client_does_not_depend_on_the_others():
    data = build_dataset(scenario("data.num_clients=30", "data.dim=2", "data.test_fraction=0.2").data, 3)
    assert data.num_clients == 30 and data.num_classes == 2 and data.feature_shape == (2,)
    assert (data.train_sizes() == 200).all() and (data.test_sizes() == 50).all()  # 50 of 250 rows: 20%
    h, gamma, clients = train_rows(data)
    m = np.array([(gamma[clients == k, None] * h[clients == k]).mean() * np.sqrt(2) / 2 for k in range(30)])
    assert (m > 0.5 - 0.3).all() and (m < 1.5 + 0.3).all()  # mean of γh along u = (1, 1)/√2: m_k ± noise
    assert abs(gamma.mean()) < 0.05
    fewer = build_dataset(scenario("data.num_clients=5", "data.dim=2", "data.test_fraction=0.2",
                                   "execution.clients_per_round=5").data, 3)
    assert np.array_equal(fewer.features(), data.features()[:len(fewer.features())])


def test_bilinear_model_cross_entropy_is_the_logistic_loss_and_init_is_seeded():
    cfg = scenario("data.dim=2")
    model = build_model(cfg.model, (2,), 2, seed=4)
    theta = model.initial_vector()
    assert theta.shape == (6,) and 0 < theta.abs().max() < 5e-3
    assert torch.equal(theta, build_model(cfg.model, (2,), 2, seed=4).initial_vector())
    assert torch.equal(build_model(scenario("model.init_scale=0").model, (2,), 2, 4).initial_vector(), torch.zeros(6))
    gen = torch.Generator().manual_seed(0)
    theta, h = torch.randn(6, generator=gen), torch.randn(7, 2, generator=gen)
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0])
    z = h @ theta[2:].reshape(2, 2).T @ theta[:2]
    expected = torch.nn.functional.softplus(-(2.0 * y - 1) * z)
    torch.testing.assert_close(torch.nn.functional.cross_entropy(model.logits(theta, h), y, reduction="none"), expected)


@pytest.mark.parametrize("delta", [1.0, 0.5])
def test_expected_round_update_is_minus_mu_times_the_gradient(delta):
    """§2.3: with E_k = 1, B_k = 1, uniform weights and normalized steps, a round over all K agents
    moves the model by −μ∇J(w) in expectation, stragglers (δ_k < 1, steps scaled by 1/δ_k) or not.
    R seeded rounds of the real client and server code (ClientHost tasks, FedAvg's client_update
    and server_update) from one w are averaged; their mean must lie within 5 standard errors of
    −μ∇J(w) in every coordinate, the standard error computed exactly from the data: per round,
    Var = μ²/K² Σ_k (E[c²]·mean_k(g²) − mean_k(g)²), g = ∇Q + ρw over client k's rows, E[c²] = 1/δ."""
    mu, rounds = 0.05, 200
    cfg = scenario("algorithm.local_steps=1", f"algorithm.lr={mu}", f"system.unreliable.participation.value={delta}",
                   "data.num_clients=20", "execution.clients_per_round=20")
    host, dataset = host_of(cfg)
    K = dataset.num_clients
    w = torch.tensor([0.5, 0.8])
    tasks = [Task("train", tuple(range(K)), (r,) * K, (0,) * K) for r in range(rounds)]
    results = host.run({0: {"params": w}}, tasks)
    algorithm = host.algorithm
    moves = torch.stack([algorithm.server_update(algorithm.init(w), u, np.full(K, 1.0 / K)).params.double() - w.double()
                         for u in results])
    h, gamma, clients = train_rows(dataset)
    theta = w.double().requires_grad_(True)
    row_weights = 1.0 / (K * np.bincount(clients)[clients])
    (gradient,) = torch.autograd.grad(risk(theta, h, gamma, row_weights), theta)
    per_row = torch.stack([torch.autograd.grad(risk(theta, h[i:i + 1], gamma[i:i + 1], np.ones(1)), theta)[0]
                           for i in range(0, len(h), 10)])  # ∇Q + ρw on every 10th row: the client moments
    sub = clients[::10]
    variance = sum((per_row[sub == k] ** 2).mean(0) / delta - per_row[sub == k].mean(0) ** 2 for k in range(K))
    se = mu * torch.sqrt(variance / K ** 2 / rounds)
    z = (moves.mean(0) + mu * gradient) / se
    assert (z.abs() < 5).all(), (moves.mean(0), -mu * gradient, se)
    assert (se < 0.1 * mu * gradient.abs()).all()  # the test can tell a wrong mean apart


@pytest.mark.parametrize("dim", [1, 2])
def test_least_eigenvalue_at_the_saddle_is_rho_minus_half_the_mean_of_gamma_h(dim):
    """At w = 0 the gradient vanishes, J = log 2, and ∇²J = [[ρI, C], [Cᵀ, ρI]] with C's singular
    values ‖mean(γh)‖/2: λ_min = ρ − ‖mean(γh)‖/2."""
    cfg = scenario("data.num_clients=20", f"data.dim={dim}")
    dataset = build_dataset(cfg.data, 0)
    model = build_model(cfg.model, dataset.feature_shape, 2, 0)
    evaluation = CurvatureEvaluator(model, dataset, uniform=True, weight_decay=RHO, threads=1)(torch.zeros(model.size))
    h, gamma, _ = train_rows(dataset)
    c = np.linalg.norm((gamma[:, None] * h).mean(0)) / 2
    assert evaluation["hessian_min_eig"] == pytest.approx(RHO - c, abs=1e-9)
    assert evaluation["hessian_min_eig"] < -0.3
    assert evaluation["grad_norm_sq"] == 0.0 and evaluation["objective"] == pytest.approx(np.log(2), abs=1e-12)


@pytest.mark.parametrize("dim", [1, 2])
def test_curvature_evaluation_matches_autograd_at_a_random_point(dim):
    cfg = scenario("data.num_clients=20", f"data.dim={dim}")
    dataset = build_dataset(cfg.data, 0)
    model = build_model(cfg.model, dataset.feature_shape, 2, 0)
    params = torch.randn(model.size, generator=torch.Generator().manual_seed(dim))
    evaluation = CurvatureEvaluator(model, dataset, uniform=True, weight_decay=RHO, threads=1)(params)
    h, gamma, clients = train_rows(dataset)
    theta = params.double().requires_grad_(True)
    row_weights = 1.0 / (dataset.num_clients * np.bincount(clients)[clients])
    value = risk(theta, h, gamma, row_weights)
    (gradient,) = torch.autograd.grad(value, theta)
    value = value.detach()
    hessian = torch.autograd.functional.hessian(lambda t: risk(t, h, gamma, row_weights), params.double())
    assert evaluation["objective"] == pytest.approx(float(value), rel=1e-12)
    assert evaluation["grad_norm_sq"] == pytest.approx(float(gradient @ gradient), rel=1e-10)
    assert evaluation["hessian_min_eig"] == pytest.approx(float(torch.linalg.eigvalsh(hessian)[0]), rel=1e-9,
                                                          abs=1e-12)
    assert evaluation["parameters"] == params.double().tolist()


@pytest.mark.parametrize("uniform", [True, False])
def test_curvature_weights_clients_by_p_k(tmp_path, uniform):
    """Clients of different sizes: p_k = 1/K (weights: uniform) or the client's share of the rows."""
    cfg = small_scenario(tmp_path, "data.num_clients=4", "execution.clients_per_round=4", "model.kind=logreg")
    dataset = build_dataset(cfg.data, 0)
    model = build_model(cfg.model, dataset.feature_shape, dataset.num_classes, 0)
    params = model.initial_vector()
    evaluation = CurvatureEvaluator(model, dataset, uniform, weight_decay=0.0, threads=1)(params)
    offsets = dataset.offsets()
    losses = [torch.nn.functional.cross_entropy(model.logits(params.double(), torch.from_numpy(
        dataset.features()[lo:hi]).double()), torch.from_numpy(dataset.labels()[lo:hi])) for lo, hi, _ in offsets]
    sizes = offsets[:, 1] - offsets[:, 0]
    p = np.full(4, 0.25) if uniform else sizes / sizes.sum()
    assert len(set(sizes)) > 1
    assert evaluation["objective"] == pytest.approx(float(sum(pk * loss for pk, loss in zip(p, losses))), rel=1e-10)


def _context(host, ids, counter=0) -> ClientContext:
    rngs = [stream(host.cfg.seed, Purpose.CLIENT_TRAIN, int(c), counter) for c in ids]
    return ClientContext(ids, rngs, host.model, host.data(ids), host.device, *host._unreliable(ids, "train"))


def test_per_round_coins_decide_all_local_steps_of_a_client_together():
    ids = np.arange(60)
    scales = {}
    for coin in ("round", "step"):
        host, _ = host_of(scenario(f"system.unreliable.coin={coin}"))
        scales[coin] = _context(host, ids).plan(10, 1).participation.numpy()  # [S, C]
        assert set(np.unique(scales[coin])) == {0.0, 2.0}  # 1/δ or nothing
    per_client = scales["round"]
    assert (per_client == per_client[:1]).all()  # one coin for the 10 steps of each client
    assert 10 < (per_client[0] > 0).sum() < 50  # about half the clients compute
    assert not (scales["step"] == scales["step"][:1]).all()  # one coin per step mixes them


def test_normalize_steps_divides_each_clients_step_by_its_local_steps():
    # The transform: a client with E_k steps moves by lr/E_k times its gradient.
    host, _ = host_of(scenario("system.unreliable.local_steps={kind: uniform_int, low: 1, high: 20}",
                               "system.unreliable.participation.value=1.0"))
    ids = np.arange(8)
    ctx = _context(host, ids)
    plan = ctx.plan(10, 1)
    assert len(set(plan.steps.tolist())) > 1 and (plan.steps == host.local_steps[ids]).all()
    transform = ctx.transform(plan, 0.3)
    grads = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    updates, _ = transform.update(grads, transform.init(grads), torch.zeros(8, 2))
    torch.testing.assert_close(updates, grads * 0.3 / torch.as_tensor(plan.steps, dtype=torch.float32)[:, None])

    # Whole client updates: E_k = 4 steps of lr 0.04 normalized are 4 steps of 0.01.
    payload = {0: {"params": torch.tensor([0.5, -0.7])}}
    task = [Task("train", tuple(range(10)), (3,) * 10, (0,) * 10)]
    updates = [host_of(scenario("system.unreliable.local_steps={kind: constant, value: 4}", f"algorithm.lr={lr}",
                                f"system.unreliable.normalize_steps={normalize}"))[0].run(payload, task)[0].vector
               for lr, normalize in ((0.04, True), (0.01, False), (0.04, False))]
    torch.testing.assert_close(updates[0], updates[1])
    assert not torch.allclose(updates[0], updates[2])


@pytest.mark.parametrize("overrides, line", [
    (["data.kind=digits", "model.kind=bilinear"],
     "error: model.kind = 'bilinear': expected a model for this data (not bilinear, which needs data.kind=saddle)"),
    (["data.kind=saddle", "model.kind=mlp"], "error: model.kind = 'mlp': expected bilinear with data.kind=saddle"),
    (["eval.curvature=true"],
     "error: eval.curvature = True: expected false for a model of 4554 parameters (a full Hessian: at most 2000)"),
    (["data.samples_per_client=50"], "error: data.samples_per_client = 50: expected no setting (it applies only "
                                     "with data.kind in {saddle, synthetic_images} (here data.kind = "
                                     "'gaussian_mixture'))"),
    (["model.init_scale=0.1"], "error: model.init_scale = 0.1: expected no setting (it applies only with "
                               "model.kind = bilinear (here model.kind = 'mlp'))"),
    (["system.unreliable.coin=sometimes"],
     "error: system.unreliable.coin = 'sometimes': expected one of round, step"),
    (["data.kind=saddle", "model.kind=bilinear", "data.dim=0"], "error: data.dim = 0: expected a positive integer"),
], ids=["bilinear_on_digits", "mlp_on_saddle", "curvature_on_big_model", "saddle_key_elsewhere",
        "bilinear_key_elsewhere", "coin", "dim"])
def test_bad_saddle_input_is_one_line_and_exit_2(tmp_path, overrides, line):
    proc = cli("validate", "scenarios/quickstart.yaml", *overrides)
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr) == line


def test_curvature_refuses_a_big_custom_model_when_it_is_built(tmp_path):
    """A custom model's size is unknown to validation: prepare() refuses it once built, before Ray."""
    cfg = small_scenario(tmp_path, "model.kind=examples.fednova:two_layer", "model.options.width=64",
                         "eval.curvature=true")
    with pytest.raises(ScenarioError, match=r"^eval.curvature = True: expected false for a model of 4554 parameters"):
        prepare(cfg)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_short_run_escapes_the_saddle(tmp_path):
    """From 10⁻³·N(0, 1), L = 10, μ = 0.1 (escape takes about ln(10³)/(μ·0.4) ≈ 170 rounds):
    λ_min turns non-negative and J falls below log 2; the trajectory and curvature are logged at
    every evaluation."""
    result = raysim.run(SCENARIO, ["algorithm.lr=0.1", "execution.rounds=400", "eval.every=20",
                                   f"output.dir={tmp_path}/out"])
    rounds = result.rounds.to_pydict()
    evaluated = [i for i, r in enumerate(rounds["round"]) if r % 20 == 0]
    assert all(rounds["objective"][i] is not None for i in evaluated)
    assert sum(v is not None for v in rounds["objective"]) == len(evaluated) == 20
    eig = [rounds["hessian_min_eig"][i] for i in evaluated]
    objective = [rounds["objective"][i] for i in evaluated]
    assert eig[0] < -0.35 and objective[0] == pytest.approx(np.log(2), abs=1e-4)
    assert eig[-1] >= 0.05 and objective[-1] < np.log(2) - 0.1
    assert rounds["grad_norm_sq"][evaluated[-1]] < 1e-2
    w1, w2 = rounds["parameters"][evaluated[-1]]
    assert abs(w1) > 0.5 and abs(w2) > 0.5 and w1 * w2 > 0  # w₁W₂ > 0: it fits γ·h's positive correlation


def test_parameters_column_is_a_list_and_survives_a_resume(tmp_path):
    """A run stopped after its checkpoint at round 30 and resumed writes the same rows."""
    from test_resume import StopAfter, _tables

    overrides = ["execution.rounds=60", "eval.every=3", "output.checkpoint_every=30", "output.flush_seconds=0",
                 "execution.clients_per_round=5"]
    raysim.run(SCENARIO, overrides + [f"output.dir={tmp_path}/whole"])
    with pytest.raises(KeyboardInterrupt):
        raysim.run(SCENARIO, overrides + [f"output.dir={tmp_path}/cut"], progress=StopAfter(2))
    raysim.resume(f"{tmp_path}/cut")
    assert _tables(tmp_path / "cut") == _tables(tmp_path / "whole")
    table = pq.read_table(tmp_path / "whole/rounds.parquet")
    kind = table.schema.field("parameters").type
    assert pa.types.is_list(kind) and kind.value_type == pa.float64()
    assert table.column("parameters").to_pylist()[2] is not None and table.column("parameters").to_pylist()[0] is None
