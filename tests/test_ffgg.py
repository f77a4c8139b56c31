"""The FFGG family and its quadratic baselines: partial gradients, CG exactness, the split,
asynchronous convergence, SCAFFOLD's fixed point, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import small_scenario

from raysim.engine.host import ClientHost, Task
from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.errors import RunError, ScenarioError

QUADRATIC = ["data.kind=quadratic", "data.num_clients=8", "data.n=60", "data.d_theta=6", "data.d_w=3",
             "model.kind=quadratic", "model.personal=[w]", "algorithm.name=ffgg",
             "algorithm.lr_unit=inverse_smoothness", "execution.clients_per_round=8", "eval.every=0"]


def _run(cfg):
    runtime = LocalRuntime()
    try:
        return run_scenario(prepare(cfg), runtime)
    finally:
        runtime.close()


def _host(cfg):
    prepared = prepare(cfg, create_output=False)
    return ClientHost(prepared.scenario, prepared.dataset.table), prepared


def _ffgg_delta(host, params, client=0):
    (out,) = host.run({0: {"params": params}}, [Task("train", (client,), (0,), (0,))])
    return out.vector[0]


def test_ffgg_update_is_the_gradient_of_the_personalised_objective(tmp_path):
    """With exact fine-tuning, Δ_m = ∇_θ min_w f_m(θ, w) (Danskin): central differences agree."""
    cfg = small_scenario(tmp_path, *QUADRATIC, "algorithm.finetuner=exact")
    host, prepared = _host(cfg)
    problem = prepared.dataset
    theta = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64)
    delta = _ffgg_delta(host, torch.cat([theta, torch.zeros(3, dtype=torch.float64)]), client=2)
    assert delta.shape == (6,)  # θ entries only: w never leaves the client

    def envelope(t):
        return float(problem.value([2], t[None], problem.best_w([2], t[None]))[0])

    eps = 1e-5
    numeric = torch.tensor([(envelope(theta + eps * e) - envelope(theta - eps * e)) / (2 * eps)
                            for e in torch.eye(6, dtype=torch.float64)], dtype=torch.float64)
    torch.testing.assert_close(delta, numeric, rtol=1e-6, atol=1e-6)
    assert delta.abs().max() > 1e-3


def test_cg_with_tau_equal_to_d_w_is_exact_and_fewer_steps_are_not(tmp_path):
    params = torch.cat([torch.full((6,), 0.3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)])
    exact = _ffgg_delta(_host(small_scenario(tmp_path, *QUADRATIC, "algorithm.finetuner=exact"))[0], params)
    cg3 = _ffgg_delta(_host(small_scenario(tmp_path, *QUADRATIC, "algorithm.finetuner=cg",
                                           "algorithm.local_steps=3"))[0], params)
    cg1 = _ffgg_delta(_host(small_scenario(tmp_path, *QUADRATIC, "algorithm.finetuner=cg",
                                           "algorithm.local_steps=1"))[0], params)
    torch.testing.assert_close(cg3, exact, rtol=1e-10, atol=1e-12)
    assert (cg1 - exact).abs().max() > 1e-6


def test_sync_ffgg_reaches_theta_star_and_logs_quadratic_metrics(tmp_path):
    cfg = small_scenario(tmp_path, *QUADRATIC, "algorithm.finetuner=cg", "algorithm.local_steps=3",
                         "execution.rounds=400")
    _run(cfg)
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "out/rounds.parquet").to_pydict()
    assert rows["rel_error"][-1] <= 1e-8 < rows["rel_error"][0]
    assert rows["grad_norm_sq"][-1] < 1e-6 * rows["grad_norm_sq"][0]
    assert rows["test_accuracy"][-1] is None  # no test rows in a quadratic problem


def _async(tmp_path, name, *extra):
    sync_only = "execution.clients_per_round"
    base = [o for o in QUADRATIC if not o.startswith(sync_only)] + [
                        "data.realizable=true", "algorithm.local_steps=3",
                        "algorithm.server_lr=0.5", "execution.mode=async", "execution.concurrency=4",
                        "execution.max_updates=1500", "system.compute.kind=lognormal",
                        "system.compute.sigma=1.5", "system.compute.seconds_per_sample=1"]
    cfg = small_scenario(tmp_path / name, *base, *extra)
    _run(cfg)
    import pyarrow.parquet as pq

    return pq.read_table(tmp_path / name / "out/rounds.parquet").to_pydict(), \
        pq.read_table(tmp_path / name / "out/events.parquet").to_pydict()


def test_async_ffgg_converges_where_nonpersonalised_async_sgd_stalls(tmp_path):
    ffgg, events = _async(tmp_path, "ffgg", "algorithm.finetuner=cg")
    sgd, _ = _async(tmp_path, "sgd", "algorithm.name=localgd", "model.personal=none", "algorithm.lr=1")
    assert len(ffgg["round"]) == 1500  # each arriving update is one server step
    assert max(events["staleness"]) >= 4  # heavy-tailed delays made updates stale
    assert ffgg["rel_error"][-1] <= 1e-6
    assert sgd["rel_error"][-1] >= 100 * ffgg["rel_error"][-1]


def test_scaffold_removes_client_drift_that_local_gd_keeps(tmp_path):
    """Full participation, same local steps: SCAFFOLD's fixed point is the minimiser of Σ f_m,
    Local GD's is not."""
    common = ["model.personal=none", "algorithm.local_steps=10", "execution.rounds=300",
              "algorithm.lr_unit=absolute", "algorithm.lr=0.05"]  # 10 steps of about 1/(2 L_f)
    runs = {}
    for name, extra in {"scaffold": ["algorithm.name=scaffold", "algorithm.server_lr=1"],
                        "localgd": ["algorithm.name=localgd"]}.items():
        cfg = small_scenario(tmp_path / name, *QUADRATIC, *common, *extra)
        summary = _run(cfg)
        state = torch.load(tmp_path / name / "out/model.pt")
        params = torch.cat([state["theta"], state["w"]])[None].expand(8, -1)
        problem = prepare(cfg, create_output=False).dataset
        ids = np.arange(8)
        grad = torch.cat([problem.grad_theta(ids, params[:, :6], params[:, 6:]),
                          problem.grad_w(ids, params[:, :6], params[:, 6:])], 1).mean(0)
        runs[name] = float(grad.norm())
        assert summary["client_updates"] == 300 * 8
    assert runs["scaffold"] < 1e-6 < runs["localgd"]


@pytest.mark.parametrize("normalize", [False, True])
def test_scaffold_control_variate_divides_by_the_steps_taken(tmp_path, normalize):
    """Option II on a first visit (c = c_i = 0): c_i⁺ = (x − y)/(K·η), η the step the client took:
    lr, or lr/K when ``normalize_steps`` divides it by the client's K local steps."""
    lr, steps = 0.05, 4
    cfg = small_scenario(tmp_path, *QUADRATIC, "model.personal=none", "algorithm.name=scaffold",
                         "algorithm.lr_unit=absolute", f"algorithm.lr={lr}", f"algorithm.local_steps={steps}",
                         f"system.unreliable.normalize_steps={str(normalize).lower()}")
    host, prepared = _host(cfg)
    x = prepared.model.initial_vector()
    (out,) = host.run({0: {"params": x, "control": torch.zeros_like(x)}}, [Task("train", (0,), (0,), (0,))])
    taken = lr / steps if normalize else lr
    torch.testing.assert_close(out.extras["dcontrol"], out.vector / (steps * taken), rtol=1e-6, atol=0)


def test_personal_entries_never_leave_the_client_and_stay_put_on_the_server(tmp_path):
    cfg = small_scenario(tmp_path, "data.kind=digits", "data.num_clients=10", "execution.clients_per_round=5",
                         "model.personal=output_layer", "algorithm.name=local_ffgg", "execution.rounds=3",
                         "eval.personalized_epochs=1", "algorithm.server_optimizer=adam", "algorithm.server_lr=0.01")
    host, prepared = _host(cfg)
    model = prepared.model
    start = model.initial_vector()
    (out,) = host.run({0: {"params": start, "pretrain": torch.tensor(False)}}, [Task("train", (0, 1), (0, 0), (0, 0))])
    assert out.vector.shape == (2, len(model.global_index)) < (2, model.size)
    summary = _run(cfg)
    final = torch.load(tmp_path / "out/model.pt")
    final = torch.cat([final[n].reshape(-1) for n in model.names])
    assert torch.equal(final[model.personal_index], start[model.personal_index])
    assert not torch.equal(final[model.global_index], start[model.global_index])
    assert summary["final_personalized_accuracy"] is not None


def test_l2gd_keeps_one_model_per_client(tmp_path):
    cfg = small_scenario(tmp_path, *QUADRATIC, "model.personal=none", "algorithm.name=l2gd",
                         "algorithm.local_steps=5", "execution.rounds=40")
    _run(cfg)
    import pyarrow.parquet as pq

    gap = pq.read_table(tmp_path / "out/rounds.parquet").column("loss_gap").to_pylist()
    assert gap[-1] < 0.5 * gap[0]


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.name=ffgg", "model.personal=none"], "model.personal = 'none': expected a split with personal"),
    (["algorithm.name=ffgg", "model.personal=[\"*\"]"], "model.personal = ['*']: expected a split that leaves both"),
    (["algorithm.name=ffgg", "model.personal=adapter", "model.adapter_rank=99"], "model.adapter_rank = 99: expected an integer in [1, 16]"),
    (["algorithm.name=ffgg", "model.personal=adapter", "model.personal_init=zero"], "model.personal_init = 'zero'"),
    (["algorithm.finetuner=cg", "model.personal=input_layer", "algorithm.name=ffgg"], "algorithm.finetuner = 'cg': expected sgd unless data.kind=quadratic"),
])
def test_bad_splits_are_input_errors(tmp_path, overrides, message):
    with pytest.raises(ScenarioError) as excinfo:
        cfg = small_scenario(tmp_path, *overrides)
        prepare(cfg, create_output=False)
    assert message in str(excinfo.value)


def test_diverging_finetuner_names_client_and_round(tmp_path):
    cfg = small_scenario(tmp_path, *QUADRATIC, "algorithm.finetuner=sgd", "algorithm.local_steps=200",
                         "algorithm.personal_lr=50", "execution.rounds=3")
    with pytest.raises(RunError, match=r"round 1: client \d+ diverged"):
        _run(cfg)
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "out/events.parquet").num_rows > 0  # what was written stays readable


def test_a_task_builds_its_clients_statistics_once(tmp_path, monkeypatch):
    """FFGG asks its oracle for the fine-tuning and for the partial gradient: on demand with no room
    in the cache, each client's statistics are still built once per task, not once per ask."""
    from raysim.data.quadratic import QuadraticLaw

    cfg = small_scenario(tmp_path, *QUADRATIC, "algorithm.finetuner=cg", "algorithm.local_steps=2",
                         "data.on_demand=true", "data.cache_mb=1e-6")
    host, _ = _host(cfg)
    built = []
    client = QuadraticLaw.client
    monkeypatch.setattr(QuadraticLaw, "client", lambda law, m: built.append(m) or client(law, m))
    params = torch.zeros(9, dtype=torch.float64)
    host.run({0: {"params": params}}, [Task("train", (1, 2, 5), (0, 0, 0), (0, 0, 0))])
    assert sorted(built) == [1, 2, 5]


@pytest.mark.parametrize("override, shown, idle", [
    ("algorithm.weight_decay=0.1", "0.1", "0.0"), ("algorithm.max_grad_norm=1", "1.0", "null"),
    ("system.unreliable.gradient_noise=gaussian", "'gaussian'", '"none"'),
    ("system.unreliable.participation.value=0.5", "0.5", "1.0"),
    ("system.unreliable.normalize_steps=true", "True", "false")])
def test_ffgg_with_a_solved_w_refuses_what_acts_on_local_steps(tmp_path, override, shown, idle):
    key = override.split("=")[0]
    for finetuner in ("cg", "exact"):
        with pytest.raises(ScenarioError) as refused:
            small_scenario(tmp_path, *QUADRATIC, f"algorithm.finetuner={finetuner}", "algorithm.local_steps=3", override)
        assert str(refused.value) == (f"{key} = {shown}: expected {idle} with algorithm.finetuner={finetuner}: FFGG "
                                      "then takes no local step (w is solved for, θ's gradient is exact)")
    # Local FFGG's alternating steps after the solve, and FFGG's sgd fine-tuning, take them
    small_scenario(tmp_path, *QUADRATIC, "algorithm.name=local_ffgg", "algorithm.finetuner=cg",
                   "algorithm.local_steps=3", override)
    small_scenario(tmp_path, *QUADRATIC, "algorithm.local_steps=3", override)


def test_the_deployed_loss_gap_is_the_loss_at_the_w_the_fine_tuner_leaves(tmp_path):
    """Exp B's FFGG deploys θ with the w of its τ gradient steps, not the exact best response
    w*(θ) that loss_gap takes: deployed_loss_gap, at the evaluation steps, against numpy (w from 0,
    τ = 4 steps of γ_w = 1/L_w on exact gradients, then f_m(θ, w_m), minus the mean of the minima)."""
    import pyarrow.parquet as pq

    cfg = small_scenario(tmp_path, *QUADRATIC[:-1], "eval.every=5", "algorithm.local_steps=4", "algorithm.lr=1.0",
                         "model.personal_init=zero", "execution.rounds=12")
    prepared = prepare(cfg)
    run_scenario(prepared, LocalRuntime())
    rows = pq.read_table(tmp_path / "out/rounds.parquet").to_pydict()
    assert [r for r, gap in zip(rows["round"], rows["deployed_loss_gap"]) if gap is not None] == [5, 10, 12]
    problem = prepared.dataset
    theta = prepared.final_params.double().numpy()[:6]
    stats = [np.asarray(s, dtype=np.float64) for s in problem._take(np.arange(8))]
    P, q, C, D, e, c = stats
    gamma = 1 / max(np.linalg.eigvalsh(d).max() for d in D)  # 1/L_w
    values, minima = [], []
    for m in range(8):
        w = np.zeros(3)
        for _ in range(4):
            w = w - gamma * (C[m].T @ theta + D[m] @ w - e[m])
        values.append(theta @ (0.5 * P[m] @ theta - q[m] + C[m] @ w) + w @ (0.5 * D[m] @ w - e[m]) + c[m])
        hessian = np.block([[P[m], C[m]], [C[m].T, D[m]]])
        z = np.linalg.lstsq(hessian, np.concatenate([q[m], e[m]]), rcond=None)[0]
        minima.append(c[m] - 0.5 * z @ np.concatenate([q[m], e[m]]))
    expected = np.mean(values) - np.mean(minima)
    assert rows["deployed_loss_gap"][-1] == pytest.approx(expected, rel=1e-9)
    assert rows["deployed_loss_gap"][-1] > rows["loss_gap"][-1] * (1 + 1e-6)  # four steps leave w short of w*
