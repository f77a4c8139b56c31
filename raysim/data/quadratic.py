"""The partially personalised quadratic problem of FFGG (Mishchenko et al., "Partially
Personalized Federated Learning", Example 1 and the experiments of §3).

Client ``m`` owns a global part ``theta`` (shared, ``d_theta``) and a personal part ``w``
(``d_w``) of the model and minimises

    f_m(theta, w) = 1/2 |H_m theta - b_m|^2 + 1/2 |A_m theta + B_m w - y_m|^2

with ``H_m, A_m`` of shape ``[n, d_theta]``, ``B_m`` of shape ``[n, d_w]`` and ``b_m, y_m`` of
length ``n``. ``f_m`` depends on the raw data only through the float64 sufficient statistics

    P = H'H + A'A  [d_theta, d_theta]    q = H'b + A'y  [d_theta]    C = A'B  [d_theta, d_w]
    D = B'B        [d_w, d_w]            e = B'y        [d_w]        c = (b'b + y'y) / 2

    f_m(theta, w) = theta'P theta / 2 - q'theta + theta'C w + w'D w / 2 - e'w + c,

so only those are kept: the raw matrices are drawn and reduced one client at a time.
Eliminating ``w`` gives the operator FFGG drives to zero,
``F(theta) = mean_m grad_theta f_m(theta, argmin_w f_m(theta, w)) = S theta - s`` with
``S = mean_m (P_m - C_m D_m^-1 C_m')`` and ``s = mean_m (q_m - C_m D_m^-1 e_m)``.

Client ``m``'s statistics are a pure function of (seed, m) (:class:`QuadraticLaw`), so they are
either kept for every client (:class:`QuadraticProblem`) or built where and when a client trains,
the latest kept in a bounded cache (:class:`OnDemandQuadratic`, ``data.on_demand``). The exact
metrics need of the whole population only means and extremes (:class:`Population`), taken in one
pass over the clients in chunks of :data:`CLIENTS_AT_ONCE` summed in a fixed order, so both give
the same bits.

Every per-client method works in torch float64 and is batched over clients: ``ids`` lists client
ids (``C`` of them; None: every client), ``theta`` is ``[C, d_theta]`` or one ``[d_theta]``
shared by all of them and ``w`` is ``[C, d_w]`` or one shared ``[d_w]``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property

import numpy as np
import pyarrow as pa
import torch

from raysim.data._checks import QUADRATIC_THREADS, check_count, check_num_clients, quadratic_shapes
from raysim.data.cache import ClientCache
from raysim.data.federated import _single_array
from raysim.streams import Purpose, stream
from raysim.threads import one_blas_thread, torch_threads

STATS = tuple(quadratic_shapes(1, 1))  # P, q, C, D, e, c
CLIENTS_AT_ONCE = 64  # clients per chunk of the population pass: fixes the order of its sums
_META_KEYS = ("n", "d_theta", "d_w", "num_clients")


class QuadraticLaw:
    """Draws client ``m``'s raw matrices from the stream ``(Purpose.QUADRATIC_CLIENT, m)`` and
    reduces them to its statistics; see :func:`generate_quadratic` for the recipe."""

    def __init__(self, seed: int, n: int, d_theta: int, d_w: int, realizable: bool = False):
        self.seed, self.realizable = int(seed), bool(realizable)
        self.n = check_count("data.n", n, 1)
        self.d_theta = check_count("data.d_theta", d_theta, 1)
        self.d_w = check_count("data.d_w", d_w, 1)
        self.theta_true = stream(seed, Purpose.QUADRATIC_PLANT).random(d_theta) if realizable else None

    @property
    def params(self) -> dict:
        """The law's keyword arguments besides the seed."""
        return {"n": self.n, "d_theta": self.d_theta, "d_w": self.d_w, "realizable": self.realizable}

    def client(self, m: int) -> tuple:
        """Client ``m``'s float64 ``(P, q, C, D, e, c)`` (numpy; ``c`` 0-dimensional)."""
        n, d_theta, d_w = self.n, self.d_theta, self.d_w
        rng = stream(self.seed, Purpose.QUADRATIC_CLIENT, m)
        H = rng.random((n, d_theta)) / d_theta
        A = rng.random((n, d_theta)) / d_theta
        B = rng.random((n, d_w)) / d_w
        w_true = rng.random(d_w) if self.realizable else None
        b, y = (None, None) if self.realizable else (rng.random(n), rng.random(n))
        with one_blas_thread():  # BLAS threads split A'B's and A'y's sums: their bits would follow the core count
            if self.realizable:
                b, y = H @ self.theta_true, A @ self.theta_true + B @ w_true
            return (H.T @ H + A.T @ A, H.T @ b + A.T @ y, A.T @ B, B.T @ B, B.T @ y,
                    np.asarray(0.5 * (b @ b + y @ y)))

    def build(self, clients: list):
        """``(m, statistics)`` for each of ``clients`` (the builder of a :class:`ClientCache`)."""
        return ((m, self.client(m)) for m in clients)

    def statistics(self, clients) -> tuple:
        """The six statistics of ``clients`` stacked into float64 tensors ``[len(clients), ...]``."""
        return _stacked([self.client(int(m)) for m in clients])


def _stacked(per_client: list) -> tuple:
    """Per-client ``(P, q, C, D, e, c)`` tuples stacked statistic by statistic into tensors."""
    return tuple(torch.from_numpy(np.stack(parts)) for parts in zip(*per_client))


def generate_quadratic(num_clients: int, n: int, d_theta: int, d_w: int, seed: int,
                       realizable: bool = False) -> QuadraticProblem:
    """Draw the FFGG quadratic problem and reduce it to sufficient statistics (with its
    :class:`Population`, taken in the same pass).

    Client ``m`` draws from the stream ``(Purpose.QUADRATIC_CLIENT, m)``, in order,
    ``H = rng.random((n, d_theta)) / d_theta``, ``A = rng.random((n, d_theta)) / d_theta`` and
    ``B = rng.random((n, d_w)) / d_w``, then ``b = rng.random(n)`` and ``y = rng.random(n)``.
    With ``realizable=True`` it draws ``w_true = rng.random(d_w)`` instead and sets
    ``b = H theta_true``, ``y = A theta_true + B w_true``, where the shared ``theta_true`` is
    U[0, 1]^d_theta from the stream ``Purpose.QUADRATIC_PLANT``, so every ``f_m`` has minimum 0.
    """
    num_clients = check_num_clients(num_clients)
    law = QuadraticLaw(seed, n, d_theta, d_w, realizable)
    d_theta, d_w = law.d_theta, law.d_w
    stats = tuple(torch.empty(num_clients, *shape, dtype=torch.float64) for shape in
                  quadratic_shapes(d_theta, d_w).values())

    def chunk(lo: int, hi: int) -> tuple:
        built = law.statistics(range(lo, hi))
        for whole, part in zip(stats, built):
            whole[lo:hi] = part
        return built

    population = Population.survey(num_clients, chunk)
    return QuadraticProblem(*stats, n=law.n, population=population)


@dataclasses.dataclass(frozen=True, eq=False)
class Population:
    """What the exact metrics and step sizes need of every client: the means of the statistics
    (``P, q, C, D, e, c``) and of the Schur complements (``S, s``: see the module doc), the mean
    best-response constant ``best_c = mean(c - e'D^-1 e / 2)`` (so ``mean_m f_m(theta, w_m*(theta))
    = theta'S theta / 2 - s'theta + best_c``), the mean of each client's minimum ``f_min``, and
    the smoothness constants ``L = max lambda_max(P - C D^-1 C')``, ``L_w = max lambda_max(D)``,
    ``mu_w = min lambda_min(D)`` and ``L_f = max lambda_max([[P, C], [C', D]])``."""

    S: torch.Tensor
    s: torch.Tensor
    P: torch.Tensor
    q: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor
    e: torch.Tensor
    c: float
    best_c: float
    f_min: float
    L: float
    L_w: float
    mu_w: float
    L_f: float

    @classmethod
    def survey(cls, num_clients: int, chunk) -> Population:
        """The population of clients ``0 … num_clients-1``; ``chunk(lo, hi)`` gives the stacked
        statistics of clients ``lo … hi-1``. Chunks of :data:`CLIENTS_AT_ONCE` run in threads and
        are summed in order, so the result does not depend on the threads."""
        # one BLAS and one torch thread for every chunk, set here for all of them (a limit that
        # each thread set and restored on its own could be lifted while another still computes)
        with one_blas_thread(), torch_threads(1), \
                ThreadPoolExecutor(min(QUADRATIC_THREADS, os.cpu_count() or 1)) as pool:
            totals = None
            for part in pool.map(lambda bound: _chunk_totals(*chunk(*bound)), _chunks(num_clients)):
                totals = part if totals is None else _combine(totals, part)
        means = {k: totals[k] / num_clients for k in ("S", "s", "P", "q", "C", "D", "e")}
        scalars = {k: float(totals[k]) / num_clients for k in ("c", "best_c", "f_min")}
        return cls(**means, **scalars, **{k: float(totals[k]) for k in ("L", "L_w", "mu_w", "L_f")})

    def to_json(self) -> str:
        """Every field as JSON (floats written exactly, tensors as nested lists)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return json.dumps({k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in fields.items()})

    @classmethod
    def from_json(cls, text: str) -> Population:
        """The population :meth:`to_json` wrote, bit for bit."""
        fields = json.loads(text)
        return cls(**{k: torch.tensor(v, dtype=torch.float64) if isinstance(v, list) else v
                      for k, v in fields.items()})


def _chunks(num_clients: int) -> list:
    """``(lo, hi)`` of the population's chunks of :data:`CLIENTS_AT_ONCE` clients, in order."""
    return [(lo, min(lo + CLIENTS_AT_ONCE, num_clients)) for lo in range(0, num_clients, CLIENTS_AT_ONCE)]


_EXTREMES = {"L": torch.maximum, "L_w": torch.maximum, "mu_w": torch.minimum, "L_f": torch.maximum}


def _chunk_totals(P, q, C, D, e, c) -> dict:
    """Sums over a chunk of clients of what :class:`Population` averages, and its extremes."""
    K, k, best_c = _schur(P, q, C, D, e, c)
    eig_D = torch.linalg.eigvalsh(D)
    return {"S": K.sum(0), "s": k.sum(0), "P": P.sum(0), "q": q.sum(0), "C": C.sum(0), "D": D.sum(0),
            "e": e.sum(0), "c": c.sum(), "best_c": best_c.sum(), "f_min": _minima(P, q, C, D, e, c).sum(),
            "L": torch.linalg.eigvalsh(K)[:, -1].max(), "L_w": eig_D[:, -1].max(), "mu_w": eig_D[:, 0].min(),
            "L_f": torch.linalg.eigvalsh(_joint(P, C, D))[:, -1].max()}


def _combine(totals: dict, part: dict) -> dict:
    return {k: _EXTREMES[k](v, part[k]) if k in _EXTREMES else v + part[k] for k, v in totals.items()}


def _schur(P, q, C, D, e, c) -> tuple:
    """Per client ``P - C D^-1 C'`` (symmetrised), ``q - C D^-1 e`` and ``c - e'D^-1 e / 2``."""
    sol = torch.linalg.solve(D, torch.cat([C.mT, e.unsqueeze(-1)], dim=-1))
    K = P - C @ sol[..., :-1]
    return 0.5 * (K + K.mT), q - (C @ sol[..., -1:]).squeeze(-1), c - 0.5 * (e * sol[..., -1]).sum(-1)


def _joint(P, C, D) -> torch.Tensor:
    """Per client the Hessian ``[[P, C], [C', D]]`` of ``f_m`` in ``(theta, w)``."""
    return torch.cat([torch.cat([P, C], -1), torch.cat([C.mT, D], -1)], -2)


def _minima(P, q, C, D, e, c) -> torch.Tensor:
    """Per client ``min_{theta, w} f_m = c - g'z / 2``, ``z`` solving the joint normal equations
    ``J z = g = [q; e]`` (least squares if ``J`` is singular)."""
    g = torch.cat([q, e], -1).unsqueeze(-1)
    z = torch.linalg.lstsq(_joint(P, C, D), g, driver="gelsd").solution
    return c - 0.5 * (g * z).sum((-2, -1))


class QuadraticProblem:
    """Every client's sufficient statistics (see the module doc) and the maths on them.

    ``P [M, d_theta, d_theta]``, ``q [M, d_theta]``, ``C [M, d_theta, d_w]``, ``D [M, d_w, d_w]``,
    ``e [M, d_w]`` and ``c [M]`` are float64 tensors; ``n`` is the number of samples per client;
    ``population`` is computed from them when not given (and then once).
    """

    on_demand = False  # client statistics built per client where they are needed

    def __init__(self, P, q, C, D, e, c, n: int, population: Population | None = None):
        self.P, self.q, self.C, self.D, self.e, self.c = (
            torch.as_tensor(t, dtype=torch.float64) for t in (P, q, C, D, e, c))
        self.n = int(n)
        M, d_theta, d_w = self.C.shape
        for name, shape in quadratic_shapes(d_theta, d_w).items():
            if tuple(getattr(self, name).shape) != (M, *shape):
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {(M, *shape)}")
        self.num_clients, self.d_theta, self.d_w = M, d_theta, d_w
        if population is not None:
            self.population = population  # fills the cached property

    def __reduce__(self):
        # Ship the Arrow table: through Ray's object store the receiver then reads it zero-copy.
        return (QuadraticProblem.from_table, (self.table,))

    @cached_property
    def population(self) -> Population:
        """The means and constants over every client (see :class:`Population`)."""
        return Population.survey(self.num_clients, self._chunk)

    def _chunk(self, lo: int, hi: int) -> tuple:
        """The statistics of clients ``lo … hi-1``."""
        return tuple(t[lo:hi] for t in (self.P, self.q, self.C, self.D, self.e, self.c))

    def _take(self, ids) -> tuple:
        """The statistics of clients ``ids`` (None: every client)."""
        stats = (self.P, self.q, self.C, self.D, self.e, self.c)
        if ids is None:
            return stats
        index = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        return tuple(t[index] for t in stats)

    def subset(self, ids) -> QuadraticProblem:
        """The clients ``ids`` alone, numbered ``0 … len(ids)-1`` (what a task's oracle works on)."""
        return QuadraticProblem(*self._take(ids), n=self.n)

    def _metadata(self) -> dict:
        """The schema metadata of :attr:`table`: kind, sizes, and the population (JSON)."""
        meta = {b"kind": b"quadratic", b"population": self.population.to_json().encode()}
        meta.update({k.encode(): json.dumps(getattr(self, k)).encode() for k in _META_KEYS})
        return meta

    @cached_property
    def table(self) -> pa.Table:
        """One row per client: ``client_id`` (int32) and one fixed_size_list<float64> column
        per statistic (row-major flattened); schema metadata ``kind = quadratic``, JSON ``n``,
        ``d_theta``, ``d_w`` and ``num_clients``, and the :class:`Population` as JSON."""
        columns = [pa.array(np.arange(self.num_clients, dtype=np.int32))]
        fields = [pa.field("client_id", pa.int32())]
        for name in STATS:
            flat = getattr(self, name).reshape(self.num_clients, -1).contiguous().numpy()
            columns.append(pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1]))
            fields.append(pa.field(name, pa.list_(pa.float64(), flat.shape[1])))
        return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=self._metadata()))

    @classmethod
    def from_table(cls, table: pa.Table) -> QuadraticProblem:
        """Rebuild from ``table`` (as written by ``.table``), viewing the Arrow buffers without copying
        (an :class:`OnDemandQuadratic` if the table says so).

        The statistics are then read-only; nothing here writes to them.
        """
        meta = table.schema.metadata or {}
        if meta.get(b"kind") != b"quadratic":
            raise ValueError("not a quadratic-problem table (schema metadata kind != quadratic)")
        population = Population.from_json(meta[b"population"]) if b"population" in meta else None
        if b"law" in meta:
            return OnDemandQuadratic(QuadraticLaw(**json.loads(meta[b"law"])), json.loads(meta[b"num_clients"]),
                                     json.loads(meta[b"cache_bytes"]), population)
        M, d_theta, d_w, n = (json.loads(meta[k.encode()]) for k in ("num_clients", "d_theta", "d_w", "n"))
        shapes = quadratic_shapes(d_theta, d_w)
        stats = []
        for name in STATS:
            arr = _single_array(table.column(name))
            size = arr.type.list_size
            flat = arr.values.to_numpy(zero_copy_only=True)  # ignores arr.offset: slice by hand
            view = flat[arr.offset * size:(arr.offset + M) * size].reshape((M, *shapes[name]))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                stats.append(torch.from_numpy(view))
        problem = cls(*stats, n=n, population=population)
        problem.table = table  # fills the cached property: the round trip keeps the same table
        return problem

    @property
    def feature_shape(self) -> tuple[int, int]:
        """``(d_theta, d_w)``."""
        return (self.d_theta, self.d_w)

    @property
    def num_classes(self) -> int:
        """0: the problem is a regression with no labels."""
        return 0

    def train_sizes(self) -> np.ndarray:
        """int64 ``[M]``: ``n`` samples per client."""
        return np.full(self.num_clients, self.n, dtype=np.int64)

    def test_sizes(self) -> np.ndarray:
        """int64 ``[M]`` of zeros: no client holds test data."""
        return np.zeros(self.num_clients, dtype=np.int64)

    def offsets(self) -> np.ndarray:
        """int64 ``[M, 3]``: ``(m n, (m+1) n, (m+1) n)``, as if the ``n`` samples were rows."""
        starts = np.arange(self.num_clients, dtype=np.int64) * self.n
        return np.stack([starts, starts + self.n, starts + self.n], axis=1)

    def _batch(self, ids, theta, w=None) -> tuple:
        """The statistics of ``ids``, and ``theta`` and ``w`` as float64 tensors of one row per client."""
        stats = self._take(ids)
        count = len(stats[-1])
        theta = torch.as_tensor(theta, dtype=torch.float64)
        theta = theta.expand(count, self.d_theta) if theta.dim() == 1 else theta
        if w is not None:
            w = torch.as_tensor(w, dtype=torch.float64)
            w = w.expand(count, self.d_w) if w.dim() == 1 else w
        return stats, theta, w

    def value(self, ids, theta, w) -> torch.Tensor:
        """``[C]``: ``f_m(theta_m, w_m)`` for each client ``m`` of ``ids``."""
        (P, q, C, D, e, c), theta, w = self._batch(ids, theta, w)
        Pt = (P @ theta.unsqueeze(-1)).squeeze(-1)
        Cw = (C @ w.unsqueeze(-1)).squeeze(-1)
        Dw = (D @ w.unsqueeze(-1)).squeeze(-1)
        return ((0.5 * Pt - q + Cw) * theta).sum(-1) + ((0.5 * Dw - e) * w).sum(-1) + c

    def grad_theta(self, ids, theta, w) -> torch.Tensor:
        """``[C, d_theta]``: ``P theta - q + C w`` per client."""
        (P, q, C, _, _, _), theta, w = self._batch(ids, theta, w)
        return (P @ theta.unsqueeze(-1) + C @ w.unsqueeze(-1)).squeeze(-1) - q

    def grad_w(self, ids, theta, w) -> torch.Tensor:
        """``[C, d_w]``: ``C' theta + D w - e`` per client."""
        (_, _, C, D, e, _), theta, w = self._batch(ids, theta, w)
        return (C.mT @ theta.unsqueeze(-1) + D @ w.unsqueeze(-1)).squeeze(-1) - e

    def hvp(self, ids, v_theta, v_w) -> torch.Tensor:
        """``[C, d_theta + d_w]``: each client's Hessian ``[[P, C], [C', D]]`` times its ``(v_theta, v_w)``."""
        (P, _, C, D, _, _), v_theta, v_w = self._batch(ids, v_theta, v_w)
        top = (P @ v_theta.unsqueeze(-1) + C @ v_w.unsqueeze(-1)).squeeze(-1)
        bottom = (C.mT @ v_theta.unsqueeze(-1) + D @ v_w.unsqueeze(-1)).squeeze(-1)
        return torch.cat([top, bottom], 1)

    def best_w(self, ids, theta) -> torch.Tensor:
        """``[C, d_w]``: the exact ``argmin_w f_m(theta, w)``, the solution of ``D w = e - C' theta``."""
        (_, _, C, D, e, _), theta, _ = self._batch(ids, theta)
        return torch.linalg.solve(D, e - (C.mT @ theta.unsqueeze(-1)).squeeze(-1))

    def cg_w(self, ids, theta, w0, steps: int) -> torch.Tensor:
        """``[C, d_w]``: exactly ``steps`` conjugate-gradient iterations on ``D w = e - C' theta``
        from ``w0``; a client stops moving once its residual is exactly zero."""
        (_, _, C, D, e, _), theta, w = self._batch(ids, theta, w0)
        r = e - (C.mT @ theta.unsqueeze(-1) + D @ w.unsqueeze(-1)).squeeze(-1)
        p, rr = r, (r * r).sum(-1)
        for _ in range(steps):
            live = rr > 0
            Dp = (D @ p.unsqueeze(-1)).squeeze(-1)
            alpha = torch.where(live, rr / torch.where(live, (p * Dp).sum(-1), 1.0), 0.0)
            w = w + alpha.unsqueeze(-1) * p
            r = r - alpha.unsqueeze(-1) * Dp
            rr_next = (r * r).sum(-1)
            beta = torch.where(live, rr_next / torch.where(live, rr, 1.0), 0.0)
            p, rr = r + beta.unsqueeze(-1) * p, rr_next
        return w

    def minima(self, ids) -> torch.Tensor:
        """``[C]``: ``min_{theta, w} f_m`` of each client alone (least squares if its Hessian is singular)."""
        return _minima(*self._take(ids))

    def operator(self, theta) -> torch.Tensor:
        """``[d_theta]``: ``F(theta) = mean_m grad_theta f_m(theta, best_w_m(theta)) = S theta - s``."""
        return self.population.S @ torch.as_tensor(theta, dtype=torch.float64) - self.population.s

    @cached_property
    def theta_star(self) -> torch.Tensor:
        """``[d_theta]``: the root of ``F``, the solution of ``S theta = s``."""
        return torch.linalg.solve(self.population.S, self.population.s)

    def rel_error(self, theta, theta0) -> float:
        """``|theta - theta*|^2 / |theta0 - theta*|^2``."""
        theta, theta0 = (torch.as_tensor(t, dtype=torch.float64) for t in (theta, theta0))
        return float((theta - self.theta_star).square().sum() / (theta0 - self.theta_star).square().sum())

    def grad_norm_sq(self, theta) -> float:
        """``|F(theta)|^2``."""
        return float(self.operator(theta).square().sum())

    def smoothness(self) -> dict[str, float]:
        """Constants over clients: ``L = max lambda_max(P - C D^-1 C')`` (cocoercivity of each
        ``F_m``), ``L_w = max lambda_max(D)``, ``mu_w = min lambda_min(D)`` and
        ``L_f = max lambda_max([[P, C], [C', D]])``."""
        pop = self.population
        return {"L": pop.L, "L_w": pop.L_w, "mu_w": pop.mu_w, "L_f": pop.L_f}

    def loss_gap(self, theta, w=None) -> float:
        """``mean_m f_m(theta_m, w_m) - mean_m min f_m`` over every client. ``theta``: ``[d_theta]``
        shared or ``[M, d_theta]`` per client; ``w``: ``[d_w]`` shared, ``[M, d_w]`` per client,
        or None for each client's best response ``w_m*(theta_m)``. A shared model's mean comes from
        the population's means; per-client models are evaluated a chunk of clients at a time (on
        demand, built as the population pass builds them: none of them is cached)."""
        pop = self.population
        theta = torch.as_tensor(theta, dtype=torch.float64)
        w = None if w is None else torch.as_tensor(w, dtype=torch.float64)
        if theta.dim() == 1 and (w is None or w.dim() == 1):
            if w is None:
                mean = float(theta @ (0.5 * pop.S @ theta - pop.s)) + pop.best_c
            else:
                mean = float(theta @ (0.5 * pop.P @ theta - pop.q + pop.C @ w) + w @ (0.5 * pop.D @ w - pop.e)) + pop.c
            return mean - pop.f_min
        total = 0.0
        for lo, hi in _chunks(self.num_clients):
            part = QuadraticProblem(*self._chunk(lo, hi), n=self.n)
            rows = theta if theta.dim() == 1 else theta[lo:hi]
            personal = part.best_w(None, rows) if w is None else w if w.dim() == 1 else w[lo:hi]
            total += float(part.value(None, rows, personal).sum())
        return total / self.num_clients - pop.f_min


class OnDemandQuadratic(QuadraticProblem):
    """The quadratic problem of a :class:`QuadraticLaw` whose clients' statistics are built where
    and when they are needed, the latest kept in a :class:`~raysim.data.cache.ClientCache` of
    ``cache_bytes``. Its :class:`Population`, when not given, is taken now (a pass over every
    client that keeps nothing) and then travels in its table."""

    on_demand = True

    def __init__(self, law: QuadraticLaw, num_clients: int, cache_bytes: int, population: Population | None = None):
        self.law, self.n, self.d_theta, self.d_w = law, law.n, law.d_theta, law.d_w
        self.num_clients, self.cache_bytes = check_num_clients(num_clients), int(cache_bytes)
        self._cache = ClientCache(self.cache_bytes)
        self.population = population or Population.survey(self.num_clients, self._chunk)

    def clients(self, client_ids, keep: bool = True) -> list:
        """Each client's ``(P, q, C, D, e, c)`` (numpy), from the cache or built now (and, with
        ``keep``, cached)."""
        return self._cache.fetch(client_ids, self.law.build, keep)

    def _chunk(self, lo: int, hi: int) -> tuple:
        return self.law.statistics(range(lo, hi))

    def _take(self, ids) -> tuple:
        ids = np.arange(self.num_clients) if ids is None else np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) and not 0 <= ids.min() <= ids.max() < self.num_clients:
            raise IndexError(f"client ids must lie in [0, {self.num_clients}), got {ids.min()} … {ids.max()}")
        return _stacked(self.clients(ids))

    @cached_property
    def table(self) -> pa.Table:
        """No rows: schema metadata ``kind = quadratic``, the sizes, the law (JSON), ``cache_bytes``
        and the :class:`Population` (JSON)."""
        meta = self._metadata()
        meta.update({b"law": json.dumps({"seed": self.law.seed, **self.law.params}).encode(),
                     b"cache_bytes": str(self.cache_bytes).encode()})
        return pa.schema([], metadata=meta).empty_table()
