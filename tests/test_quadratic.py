"""Tests of raysim.data.quadratic: statistics against the raw matrices, the maths, the Arrow table."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from raysim.data.quadratic import (CLIENTS_AT_ONCE, STATS, OnDemandQuadratic, QuadraticLaw, QuadraticProblem,
                                   generate_quadratic)
from raysim.errors import ScenarioError
from raysim.streams import Purpose, stream

M, N, DT, DW, SEED = 4, 200, 6, 3, 5


def raw_client(m, seed=SEED, n=N, d_theta=DT, d_w=DW, realizable=False):
    """Client m's raw (H, A, B, b, y, w_true), drawn by the recipe the generator documents."""
    rng = stream(seed, Purpose.QUADRATIC_CLIENT, m)
    H = rng.random((n, d_theta)) / d_theta
    A = rng.random((n, d_theta)) / d_theta
    B = rng.random((n, d_w)) / d_w
    if not realizable:
        return H, A, B, rng.random(n), rng.random(n), None
    theta_true = stream(seed, Purpose.QUADRATIC_PLANT).random(d_theta)
    w_true = rng.random(d_w)
    return H, A, B, H @ theta_true, A @ theta_true + B @ w_true, w_true


def raw_value(m, theta, w, **kw):
    H, A, B, b, y, _ = raw_client(m, **kw)
    return 0.5 * np.sum((H @ theta - b) ** 2) + 0.5 * np.sum((A @ theta + B @ w - y) ** 2)


@pytest.fixture(scope="module")
def problem():
    return generate_quadratic(M, N, DT, DW, SEED)


def rand(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).normal(size=shape))


@pytest.mark.parametrize("realizable", [False, True])
def test_statistics_match_raw_matrices(realizable):
    p = generate_quadratic(M, N, DT, DW, SEED, realizable=realizable)
    for m in range(M):
        H, A, B, b, y, _ = raw_client(m, realizable=realizable)
        expected = {"P": H.T @ H + A.T @ A, "q": H.T @ b + A.T @ y, "C": A.T @ B, "D": B.T @ B,
                    "e": B.T @ y, "c": 0.5 * (b @ b + y @ y)}
        for name, value in expected.items():
            stat = getattr(p, name)
            assert stat.dtype == torch.float64
            np.testing.assert_allclose(stat[m].numpy(), value, rtol=1e-12, atol=1e-12, err_msg=name)


def test_value_matches_raw_objective(problem):
    theta, w = rand(M, DT, seed=1), rand(M, DW, seed=2)
    got = problem.value([0, 1, 2, 3], theta, w)
    want = [raw_value(m, theta[m].numpy(), w[m].numpy()) for m in range(M)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-11)
    # a [d_theta] theta is shared by every listed client, in the order of ids
    got = problem.value(np.array([3, 1]), theta[0], w[:2])
    np.testing.assert_allclose(got.numpy(), [raw_value(3, theta[0].numpy(), w[0].numpy()),
                                             raw_value(1, theta[0].numpy(), w[1].numpy())], rtol=1e-11)


def test_gradients_match_autograd(problem):
    ids = np.array([2, 0, 3])
    theta = rand(3, DT, seed=3).requires_grad_()
    w = rand(3, DW, seed=4).requires_grad_()
    problem.value(ids, theta, w).sum().backward()
    torch.testing.assert_close(problem.grad_theta(ids, theta.detach(), w.detach()), theta.grad,
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(problem.grad_w(ids, theta.detach(), w.detach()), w.grad,
                               rtol=1e-10, atol=1e-10)


def test_best_w_and_cg(problem):
    ids, theta = np.arange(M), rand(DT, seed=5)
    w0 = rand(M, DW, seed=6)
    best = problem.best_w(ids, theta)
    assert problem.grad_w(ids, theta, best).abs().max() < 1e-10
    torch.testing.assert_close(problem.cg_w(ids, theta, w0, DW), best, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(problem.cg_w(ids, theta, w0, 3 * DW), best, rtol=1e-10, atol=1e-12)
    assert torch.equal(problem.cg_w(ids, theta, w0, 0), w0)
    # CG minimises the D-norm of the error over a growing Krylov space: it never gets worse
    errors = []
    for steps in range(DW + 1):
        err = problem.cg_w(ids, theta, w0, steps) - best
        errors.append(torch.einsum("ci,cij,cj->c", err, problem.D, err))
    assert all((later <= earlier * (1 + 1e-9)).all() for earlier, later in zip(errors, errors[1:]))
    assert (errors[1] < errors[0]).all() and (errors[-1] < 1e-20 * errors[0]).all()


def test_cg_stops_on_an_exactly_zero_residual():
    eye = torch.eye(2, dtype=torch.float64).expand(2, 2, 2)
    p = QuadraticProblem(eye, torch.zeros(2, 2), torch.zeros(2, 2, 2), eye, torch.zeros(2, 2),
                         torch.zeros(2), n=1)
    w0 = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    w = p.cg_w([0, 1], torch.zeros(2), w0, 5)  # client 0 starts at its solution: 0/0 without the guard
    assert torch.equal(w, torch.zeros(2, 2, dtype=torch.float64))


def test_operator_and_theta_star(problem):
    ids = np.arange(M)
    theta = rand(DT, seed=7)
    via_best_w = problem.grad_theta(ids, theta, problem.best_w(ids, theta)).mean(0)
    torch.testing.assert_close(problem.operator(theta), via_best_w, rtol=1e-10, atol=1e-10)
    star = problem.theta_star
    assert problem.operator(star).abs().max() < 1e-9
    assert problem.grad_norm_sq(star) < 1e-18
    assert problem.grad_norm_sq(theta) == pytest.approx(float(via_best_w.square().sum()), rel=1e-10)
    assert problem.rel_error(star, theta) == 0.0
    assert problem.rel_error(theta, theta) == pytest.approx(1.0)
    assert problem.rel_error(star + (theta - star) / 10, theta) == pytest.approx(0.01)


def test_smoothness_constants(problem):
    got = problem.smoothness()
    P, C, D = (getattr(problem, k).numpy() for k in "PCD")
    schur = [np.linalg.eigvalsh(P[m] - C[m] @ np.linalg.inv(D[m]) @ C[m].T)[-1] for m in range(M)]
    joint = [np.linalg.eigvalsh(np.block([[P[m], C[m]], [C[m].T, D[m]]]))[-1] for m in range(M)]
    assert got["L"] == pytest.approx(max(schur), rel=1e-10)
    assert got["L_w"] == pytest.approx(max(np.linalg.eigvalsh(D[m])[-1] for m in range(M)), rel=1e-10)
    assert got["mu_w"] == pytest.approx(min(np.linalg.eigvalsh(D[m])[0] for m in range(M)), rel=1e-10)
    assert got["L_f"] == pytest.approx(max(joint), rel=1e-10)
    # each F_m is 1/L-cocoercive: <F_m(x) - F_m(y), x - y> >= |F_m(x) - F_m(y)|^2 / L
    x, y = rand(DT, seed=8), rand(DT, seed=9)
    ids = np.arange(M)
    diff = (problem.grad_theta(ids, x, problem.best_w(ids, x))
            - problem.grad_theta(ids, y, problem.best_w(ids, y)))
    assert ((diff @ (x - y)) >= diff.square().sum(-1) / got["L"] * (1 - 1e-12)).all()


def test_minima_and_loss_gap(problem):
    minima = problem.minima(None)
    for m in range(M):
        H, A, B, b, y, _ = raw_client(m)
        X = np.block([[H, np.zeros((N, DW))], [A, B]])
        z = np.linalg.lstsq(X, np.concatenate([b, y]), rcond=None)[0]
        assert minima[m].item() == pytest.approx(raw_value(m, z[:DT], z[DT:]), rel=1e-10)
    assert problem.population.f_min == pytest.approx(float(minima.mean()), rel=1e-14)
    ids, theta, w = np.arange(M), rand(DT, seed=10), rand(M, DW, seed=11)

    def want(w_rows):
        return float((problem.value(ids, theta, w_rows) - minima).mean())

    gap = problem.loss_gap(theta, w)  # per-client w: evaluated client by client
    assert gap == pytest.approx(want(w), rel=1e-12) and gap > 0
    assert problem.loss_gap(theta.expand(M, DT), w) == pytest.approx(gap, rel=1e-12)
    # a shared model, and a shared theta with each client's best response: from the population's means
    assert problem.loss_gap(theta, w[0]) == pytest.approx(want(w[0].expand(M, DW)), rel=1e-10)
    assert problem.loss_gap(theta) == pytest.approx(want(problem.best_w(ids, theta)), rel=1e-10)
    assert problem.loss_gap(theta.expand(M, DT)) == pytest.approx(problem.loss_gap(theta), rel=1e-10)


def test_minima_of_a_singular_client():
    # 2 samples against 9 unknowns: the joint Hessian is singular and every client fits exactly
    p = generate_quadratic(2, 2, DT, DW, SEED)
    assert torch.isfinite(p.minima(None)).all()
    assert (p.minima(None).abs() < 1e-12 * p.c).all()


def test_realizable_problem_has_zero_minimum():
    p = generate_quadratic(M, N, DT, DW, SEED, realizable=True)
    assert (p.minima(None).abs() < 1e-12 * p.c).all()
    theta_true = torch.from_numpy(stream(SEED, Purpose.QUADRATIC_PLANT).random(DT))
    w_true = torch.from_numpy(np.stack([raw_client(m, realizable=True)[5] for m in range(M)]))
    assert abs(p.loss_gap(theta_true, w_true)) < 1e-12 * p.c.mean()
    assert abs(p.loss_gap(theta_true)) < 1e-12 * p.c.mean()
    torch.testing.assert_close(p.theta_star, theta_true, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(p.best_w(np.arange(M), theta_true), w_true, rtol=1e-8, atol=1e-8)


def test_table_layout_and_zero_copy_round_trip(problem):
    t = problem.table
    sizes = {"P": DT * DT, "q": DT, "C": DT * DW, "D": DW * DW, "e": DW, "c": 1}
    assert t.column_names == ["client_id", *sizes]
    assert t.schema.field("client_id").type == pa.int32()
    for name, size in sizes.items():
        assert t.schema.field(name).type == pa.list_(pa.float64(), size)
    assert t.column("client_id").to_pylist() == list(range(M))
    meta = t.schema.metadata
    assert meta[b"kind"] == b"quadratic"
    assert {k: int(meta[k.encode()]) for k in ("n", "d_theta", "d_w", "num_clients")} == \
        {"n": N, "d_theta": DT, "d_w": DW, "num_clients": M}

    back = QuadraticProblem.from_table(t)
    assert back.table is t
    assert (back.num_clients, back.n, back.d_theta, back.d_w) == (M, N, DT, DW)
    for name in sizes:
        assert torch.equal(getattr(back, name), getattr(problem, name)), name
    buffer = t.column("D").chunk(0).values.to_numpy(zero_copy_only=True)
    assert np.shares_memory(back.D.numpy(), buffer)
    torch.testing.assert_close(back.theta_star, problem.theta_star, rtol=0, atol=0)

    sliced = QuadraticProblem.from_table(pa.Table.from_batches(t.slice(1, 2).to_batches(),
                                                               t.schema).replace_schema_metadata(
        {**meta, b"num_clients": b"2"}))
    assert torch.equal(sliced.P, problem.P[1:3]) and torch.equal(sliced.c, problem.c[1:3])

    unpickled = pickle.loads(pickle.dumps(problem))
    assert torch.equal(unpickled.C, problem.C) and unpickled.n == N

    with pytest.raises(ValueError, match="quadratic"):
        QuadraticProblem.from_table(t.replace_schema_metadata({b"kind": b"other"}))


def test_sizes_and_shapes(problem):
    assert problem.feature_shape == (DT, DW) and problem.num_classes == 0
    assert problem.train_sizes().tolist() == [N] * M and problem.test_sizes().tolist() == [0] * M
    offsets = problem.offsets()
    assert offsets.dtype == np.int64
    assert offsets.tolist() == [[m * N, (m + 1) * N, (m + 1) * N] for m in range(M)]


def test_determinism_and_seed_dependence():
    def stat_bytes(p):
        return [getattr(p, k).numpy().tobytes() for k in ("P", "q", "C", "D", "e", "c")]

    a = generate_quadratic(3, 50, 4, 2, seed=1)
    assert stat_bytes(a) == stat_bytes(generate_quadratic(3, 50, 4, 2, seed=1))
    assert a.table.equals(generate_quadratic(3, 50, 4, 2, seed=1).table)
    other = stat_bytes(generate_quadratic(3, 50, 4, 2, seed=2))
    assert all(x != y for x, y in zip(stat_bytes(a), other))
    # client m's statistics depend on (seed, m) only, not on how many clients there are
    assert torch.equal(generate_quadratic(5, 50, 4, 2, seed=1).P[:3], a.P)


def test_invalid_sizes_raise():
    with pytest.raises(ScenarioError):
        generate_quadratic(0, N, DT, DW, SEED)
    with pytest.raises(ScenarioError):
        generate_quadratic(M, 0, DT, DW, SEED)


def test_population_has_the_same_bits_however_the_clients_are_held():
    """More clients than a chunk: the population taken while generating, again from the kept
    statistics, and from statistics built on demand are equal bit for bit, and are the means and
    extremes they stand for."""
    M2 = CLIENTS_AT_ONCE + 6
    kept = generate_quadratic(M2, 20, 4, 2, seed=3)
    again = QuadraticProblem(kept.P, kept.q, kept.C, kept.D, kept.e, kept.c, n=20)
    lazy = OnDemandQuadratic(QuadraticLaw(3, 20, 4, 2), M2, cache_bytes=0)
    assert again.population.to_json() == kept.population.to_json() == lazy.population.to_json()
    pop = kept.population
    for name in ("P", "q", "C", "D", "e"):
        torch.testing.assert_close(getattr(pop, name), getattr(kept, name).mean(0), rtol=1e-13, atol=0)
    assert pop.c == pytest.approx(float(kept.c.mean()), rel=1e-14)
    P, C, D = (getattr(kept, k).numpy() for k in "PCD")
    schur = [P[m] - C[m] @ np.linalg.inv(D[m]) @ C[m].T for m in range(M2)]
    np.testing.assert_allclose(pop.S.numpy(), np.mean(schur, 0), rtol=1e-10)
    assert pop.L == pytest.approx(max(np.linalg.eigvalsh(k)[-1] for k in schur), rel=1e-10)
    assert pop.mu_w == pytest.approx(min(np.linalg.eigvalsh(d)[0] for d in D), rel=1e-10)


def test_statistics_built_on_demand_equal_the_kept_ones():
    M2 = CLIENTS_AT_ONCE + 6
    kept = generate_quadratic(M2, 20, 4, 2, seed=3, realizable=True)
    law = QuadraticLaw(3, 20, 4, 2, realizable=True)
    one_client = sum(part.nbytes for part in law.client(0))
    lazy = OnDemandQuadratic(law, M2, cache_bytes=3 * one_client, population=kept.population)
    ids = [M2 - 1, 0, 5, 0]
    for name, got, want in zip(STATS, lazy.subset(ids)._take(None), kept.subset(ids)._take(None)):
        assert torch.equal(got, want), name
    ids, theta, w = np.arange(M2), rand(M2, 4, seed=1), rand(M2, 2, seed=2)
    assert torch.equal(lazy.value(ids, theta, w), kept.value(ids, theta, w))
    assert torch.equal(lazy.best_w(ids, theta), kept.best_w(ids, theta))
    for args in ((theta, w), (theta[0], w[0]), (theta[0],), (theta,)):
        assert lazy.loss_gap(*args) == kept.loss_gap(*args)
    cached = set(lazy._cache)
    lazy.loss_gap(theta, w)  # per-client models: every client built, none of them cached
    assert set(lazy._cache) == cached
    with pytest.raises(IndexError, match=r"client ids must lie in \[0, 70\), got 0 … 70"):
        lazy.subset([0, M2])
    assert torch.equal(lazy.theta_star, kept.theta_star) and lazy.smoothness() == kept.smoothness()
    # the cache keeps the clients used last, within its budget
    lazy.clients([1, 2, 3, 4])
    assert list(lazy._cache) == [2, 3, 4] and lazy._cache.nbytes == 3 * one_client


def test_an_on_demand_problem_travels_as_a_table_without_rows():
    lazy = OnDemandQuadratic(QuadraticLaw(3, 20, 4, 2), 9, cache_bytes=2 ** 20)
    table = lazy.table
    assert table.num_rows == 0 and table.schema.metadata[b"kind"] == b"quadratic"
    back = pickle.loads(pickle.dumps(lazy))
    assert isinstance(back, OnDemandQuadratic) and back.on_demand and not generate_quadratic(2, 5, 2, 1, 0).on_demand
    assert back.population.to_json() == lazy.population.to_json()
    assert (back.num_clients, back.n, back.d_theta, back.d_w, back.cache_bytes) == (9, 20, 4, 2, 2 ** 20)
    assert torch.equal(back.subset([8]).P, lazy.subset([8]).P)


def test_statistics_do_not_depend_on_the_machines_blas_threads():
    """numpy's BLAS splits the sums of A'B and A'y over its threads (their last bits follow the
    thread count), so a client's statistics are reduced on one: an actor with one thread and a
    driver with several build the same bytes."""
    code = ("import pickle, sys; from raysim.data.quadratic import QuadraticLaw; "
            "sys.stdout.buffer.write(pickle.dumps(QuadraticLaw(0, 10000, 100, 50).client(1)))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    alone = pickle.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                        check=True).stdout)
    with threadpool_limits(4, user_api="blas"):
        if max(info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas") < 2:
            pytest.skip("numpy's BLAS runs on one thread on this machine: nothing to compare")
        here = QuadraticLaw(0, 10000, 100, 50).client(1)
    for name, a, b in zip(STATS, alone, here):
        assert np.array_equal(a, b), name
