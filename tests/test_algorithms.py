"""The algorithm core: equivalences between methods, server rules computed by hand, client
transforms, the work and bytes a task declares, the unreliable-agent model applied to every algorithm, and
keys that do not apply to the chosen algorithm, data kind or mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import small_scenario
from raysim.algorithms import ClientUpdates, make_algorithm
from raysim.algorithms import transforms as tf
from raysim.scenario import scenario_object
from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.errors import ScenarioError
from raysim.models import build_model


def _run(cfg) -> dict:
    runtime = LocalRuntime()
    try:
        return run_scenario(prepare(cfg), runtime)
    finally:
        runtime.close()


def _sha(tmp_path, name, *overrides) -> str:
    return _run(small_scenario(tmp_path / name, *overrides))["model_sha256"]


@pytest.mark.parametrize("mode", [["execution.rounds=3"],
                                  ["execution.mode=async", "execution.aggregation=fedbuff", "execution.buffer_size=4",
                                   "execution.concurrency=6", "execution.max_updates=16"]])
def test_methods_that_reduce_to_fedavg_give_its_model_bytes(tmp_path, mode):
    fedavg = _sha(tmp_path, "fedavg", *mode)
    assert _sha(tmp_path, "prox0", *mode, "algorithm.name=fedprox", "algorithm.prox_mu=0") == fedavg
    assert _sha(tmp_path, "avgm0", *mode, "algorithm.name=fedavgm", "algorithm.server_momentum=0") == fedavg
    assert _sha(tmp_path, "acg0", *mode, "algorithm.name=fedacg", "algorithm.acg_lambda=0",
                "algorithm.acg_beta=0") == fedavg
    # and each knob, once turned, changes the result
    assert _sha(tmp_path, "prox", *mode, "algorithm.name=fedprox", "algorithm.prox_mu=0.5") != fedavg
    assert _sha(tmp_path, "acg", *mode, "algorithm.name=fedacg") != fedavg


def _algorithm(tmp_path, *overrides):
    cfg = small_scenario(tmp_path, *overrides)
    scenario = scenario_object(cfg)
    model = build_model(scenario.model, (4,), 3, seed=0)
    return make_algorithm(scenario, model, None, num_clients=10), model


def _updates(vectors, ids=None) -> ClientUpdates:
    v = torch.tensor(vectors, dtype=torch.float32)
    n = len(v)
    ids = np.arange(n) if ids is None else np.asarray(ids)
    return ClientUpdates(ids, np.full(n, 5), np.zeros(n), v)


def test_fedacg_server_momentum_and_lookahead_by_hand(tmp_path):
    algo, model = _algorithm(tmp_path, "algorithm.name=fedacg", "algorithm.acg_lambda=0.8", "model.kind=logreg")
    theta = torch.zeros(model.size)
    state = algo.init(theta)
    assert torch.equal(algo.payload(state)["params"], theta)  # m = 0: the lookahead is θ
    rng = np.random.default_rng(0)
    m, th = np.zeros(model.size), np.zeros(model.size)
    for _ in range(3):
        deltas = rng.normal(size=(2, model.size))  # Δ_k = Φ − v_k, sent by two clients
        state = algo.server_update(state, _updates(deltas), np.array([0.5, 0.5]))
        g = deltas.astype(np.float32).astype(np.float64).mean(0)
        m = 0.8 * m + g  # the paper's m ← λm + Δ with its Δ = −g
        th = th - m
        np.testing.assert_allclose(state.params.numpy(), th, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(algo.payload(state)["params"].numpy(), th - 0.8 * m, rtol=1e-5, atol=1e-6)


def test_feddyn_server_rule_by_hand(tmp_path):
    algo, model = _algorithm(tmp_path, "algorithm.name=feddyn", "algorithm.dyn_alpha=0.1", "model.kind=logreg")
    state = algo.init(torch.zeros(model.size))
    h, th = np.zeros(model.size), np.zeros(model.size)
    rng = np.random.default_rng(1)
    for _ in range(2):
        deltas = rng.normal(size=(3, model.size)).astype(np.float32).astype(np.float64)  # θ − v_i
        state = algo.server_update(state, _updates(deltas), np.full(3, 1 / 3))
        h = h + 0.1 / 10 * deltas.sum(0)  # h ← h − α(1/N)Σ(v_i − θ), N = 10 registered clients
        th = (th - deltas).mean(0) - h / 0.1  # θ = mean(v_i) − h/α
        np.testing.assert_allclose(state.params.numpy(), th, rtol=1e-5, atol=1e-5)


def test_client_transforms_by_hand():
    params = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    grads = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    anchor = torch.tensor([[0.5, 0.5], [0.0, 0.0]])
    correction = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    step = tf.chain(tf.add_proximal(0.1, anchor), tf.add_correction(correction), tf.clip_by_norm(1.0),
                    tf.add_weight_decay(0.01), tf.scale(0.5))
    out, _ = step.update(grads, step.init(params), params)
    g = grads + 0.1 * (params - anchor) + correction
    norms = g.norm(dim=1, keepdim=True)
    g = g * torch.clamp(1.0 / norms, max=1.0) + 0.01 * params
    torch.testing.assert_close(out, 0.5 * g)
    coins = tf.scale_by_participation(torch.tensor([[2.0, 0.0], [0.0, 1.0]]))
    state = coins.init(params)
    first, state = coins.update(grads, state, params)
    second, state = coins.update(grads, state, params)
    torch.testing.assert_close(first, grads * torch.tensor([[2.0], [0.0]]))
    torch.testing.assert_close(second, grads * torch.tensor([[0.0], [1.0]]))


def test_tasks_declare_their_work_and_bytes(tmp_path):
    fedavg, model = _algorithm(tmp_path, "algorithm.local_steps=4", "algorithm.batch_size=8")
    sizes, none = np.array([5, 50]), np.zeros(2)
    payload = fedavg.payload(fedavg.init(model.initial_vector()))
    assert fedavg.work(sizes, none, payload).tolist() == [4 * 5, 4 * 8]  # a batch is at most the client's rows
    assert fedavg.work(sizes, np.array([2, 0]), payload).tolist() == [2 * 5, 4 * 8]  # E_k overrides
    assert fedavg.upload_size(payload) == model.size
    scaffold, _ = _algorithm(tmp_path, "algorithm.name=scaffold", "algorithm.local_steps=4")
    assert scaffold.upload_size(scaffold.payload(scaffold.init(model.initial_vector()))) == 2 * model.size
    epochs, _ = _algorithm(tmp_path, "algorithm.local_epochs=3")
    assert epochs.work(sizes, none, payload).tolist() == [15, 150]


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "feddyn", "fedacg", "fedyogi", "localgd",
                                  "perfedavg"])
def test_noise_and_unreliable_steps_reach_every_algorithm(tmp_path, name):
    base = ["execution.rounds=2", f"algorithm.name={name}", "algorithm.local_steps=3"]
    plain = _sha(tmp_path, "plain", *base)
    assert _sha(tmp_path, "noise", *base, "system.unreliable.gradient_noise=gaussian",
                "system.unreliable.noise_scale=0.1") != plain
    assert _sha(tmp_path, "delta", *base, "system.unreliable.participation.value=0.5") != plain
    assert _sha(tmp_path, "steps", *base, "system.unreliable.local_steps.kind=uniform_int",
                "system.unreliable.local_steps.low=1", "system.unreliable.local_steps.high=2") != plain


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.server_optimizer=adam"], None),  # applies: no error
    (["algorithm.server_betas=[0.9,0.9]"],
     "algorithm.server_betas = [0.9, 0.9]: expected no setting (it applies only with algorithm.server_optimizer "
     "in {adam, yogi, adagrad} (here algorithm.server_optimizer = 'sgd'))"),
    (["algorithm.prox_mu=0.1"], "algorithm.prox_mu = 0.1: expected a key of algorithm.name=fedavg (prox_mu is a "
                                "key of fedprox); allowed here: "),
    (["algorithm.name=fedacg", "algorithm.server_optimizer=adam"],
     "algorithm.server_optimizer = 'adam': expected a key of algorithm.name=fedacg"),
    (["algorithm.name=fedavgm", "algorithm.server_optimizer=adam"],
     "algorithm.server_optimizer = 'adam': expected one of momentum"),
    (["algorithm.name=fedyogi", "algorithm.server_betas=[0.9,1.5]"],
     "algorithm.server_betas = [0.9, 1.5]: expected two numbers in [0, 1)"),
    (["data.partition.kind=dirichlet"],
     "data.partition.kind = 'dirichlet': expected no setting (it applies only with data.kind in {digits, blobs, "
     "mnist, fashion_mnist, cifar10, cifar100} (here data.kind = 'gaussian_mixture'))"),
    (["execution.mode=async", "execution.max_updates=10", "execution.deadline=5"],
     "execution.deadline = 5.0: expected no setting (it applies only with execution.mode = sync "
     "(here execution.mode = 'async'))"),
    (["algorithm.name=fedprox", "algorithm.prox_mu=-1"], "algorithm.prox_mu = -1.0: expected a number >= 0"),
    (["algorithm.name=nope"], "algorithm.name = 'nope': expected one of apfl, ditto, fedacg, fedadagrad, fedadam, "
                              "fedavg, "),
    (["algorithm.name=no_such_module:Algo"], "algorithm.name = 'no_such_module:Algo': expected an importable module "
                                             "(ModuleNotFoundError: No module named 'no_such_module')"),
    (["algorithm.name=raysim.algorithms.fedavg:Nope"],
     "algorithm.name = 'raysim.algorithms.fedavg:Nope': expected a name that module raysim.algorithms.fedavg "
     "defines (an algorithm class)"),
    (["algorithm.name=raysim.algorithms.fedavg:add_proximal"],
     "algorithm.name = 'raysim.algorithms.fedavg:add_proximal': expected a subclass of "
     "raysim.algorithms.Algorithm (got function)"),
])
def test_keys_that_do_not_apply_are_errors(tmp_path, overrides, message):
    if message is None:
        small_scenario(tmp_path, *overrides)
        return
    with pytest.raises(ScenarioError) as err:
        small_scenario(tmp_path, *overrides)
    assert str(err.value).startswith(message)


def test_a_custom_algorithm_class_is_built_with_its_own_keys(tmp_path):
    cfg = small_scenario(tmp_path, "algorithm.name=raysim.algorithms.fedavg:FedProx", "algorithm.prox_mu=0.2")
    assert cfg.algorithm.prox_mu == 0.2 and cfg.algorithm.batch_size == 10


def test_oracles_give_hessian_vector_products():
    """The row oracle's double-backward product matches a finite difference of its gradients, and
    the quadratic oracle's closed form matches autograd's Hessian of the problem's value."""
    from raysim.algorithms.oracles import QuadraticOracle, RowOracle, minibatch_plan
    from raysim.scenario import ModelConfig
    from raysim.data.quadratic import generate_quadratic

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (30,), generator=gen)
    model = build_model(ModelConfig(kind="mlp", hidden=[5], activation="tanh"), (4,), 3, seed=0)
    offsets = np.array([[0, 12, 15], [15, 27, 30]])
    plan = minibatch_plan(offsets[:, 0], offsets[:, 1] - offsets[:, 0], [np.random.default_rng(i) for i in range(2)],
                          4, 1, 2)
    oracle = RowOracle(model, x, y, offsets, plan, torch.device("cpu"))
    params = model.initial_vector().double().expand(2, -1).clone()
    model.module.double()
    v = torch.randn(params.shape, generator=gen, dtype=torch.float64)
    eps = 1e-6
    plus, _ = oracle.gradient(params + eps * v, 0)
    minus, _ = oracle.gradient(params - eps * v, 0)
    torch.testing.assert_close(oracle.hvp(params, v, 0), (plus - minus) / (2 * eps), rtol=1e-5, atol=1e-7)

    problem = generate_quadratic(3, 20, 4, 2, seed=0)
    quad = QuadraticOracle(problem.subset(np.arange(3)), None)
    p = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    for c in range(3):
        def value(row, c=c):
            return problem.value(np.array([c]), row[None, :4], row[None, 4:])[0]
        hessian = torch.autograd.functional.hessian(value, p[c])
        torch.testing.assert_close(quad.hvp(p, w, None)[c], hessian @ w[c])
        grad = torch.autograd.functional.jacobian(value, p[c])
        torch.testing.assert_close(quad.gradient(p, None)[0][c], grad)


def _updates_at(tmp_path, version: int, *overrides) -> torch.Tensor:
    """The updates of clients 1-3 that start from server step ``version`` (FedAvg, SGD on an MLP)."""
    from raysim.data import build_dataset
    from raysim.engine.dispatch import make_tasks
    from raysim.engine.host import ClientHost

    cfg = small_scenario(tmp_path, "algorithm.local_steps=3", *overrides)
    dataset = build_dataset(cfg.data, cfg.seed)
    host = ClientHost(scenario_object(cfg), dataset.table)
    payload = host.algorithm.payload(host.algorithm.init(host.model.initial_vector()))
    tasks = make_tasks("train", np.array([1, 2, 3]), dataset.train_sizes(), 1, 5, version)
    return host.run({version: payload}, tasks)[0].vector


def test_lr_decay_scales_the_local_step_by_the_decay_to_the_server_step(tmp_path):
    """algorithm.lr_decay = d: a client starting from server step t steps with lr · d^t (at t = 0, the
    same bits as without decay; at t = 3, what lr · d^3 without decay gives, up to rounding)."""
    plain = _updates_at(tmp_path, 0, "algorithm.lr=0.2")
    assert torch.equal(_updates_at(tmp_path, 0, "algorithm.lr=0.2", "algorithm.lr_decay=0.5"), plain)
    decayed = _updates_at(tmp_path, 3, "algorithm.lr=0.2", "algorithm.lr_decay=0.5")
    assert torch.allclose(decayed, _updates_at(tmp_path, 3, "algorithm.lr=0.025"), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(decayed, _updates_at(tmp_path, 3, "algorithm.lr=0.2"), rtol=1e-2)


@pytest.mark.parametrize("value", [0, 1.5, -0.1])
def test_lr_decay_outside_0_1_is_refused(tmp_path, value):
    with pytest.raises(ScenarioError, match=rf"^algorithm\.lr_decay = .*: expected a number in \(0, 1\]$"):
        small_scenario(tmp_path, f"algorithm.lr_decay={value}")
