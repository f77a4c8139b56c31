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

Every method works in torch float64 and is batched over clients: ``ids`` lists client ids
(``C`` of them), ``theta`` is ``[C, d_theta]`` or one ``[d_theta]`` shared by all of them and
``w`` is ``[C, d_w]``.
"""

from __future__ import annotations

import json
import warnings
from functools import cached_property

import numpy as np
import pyarrow as pa
import torch

from raysim.data._checks import check_count, check_num_clients
from raysim.data.federated import _single_array
from raysim.streams import Purpose, stream

STATS = ("P", "q", "C", "D", "e", "c")
_META_KEYS = ("n", "d_theta", "d_w", "num_clients")


def generate_quadratic(num_clients: int, n: int, d_theta: int, d_w: int, seed: int,
                       realizable: bool = False) -> QuadraticProblem:
    """Draw the FFGG quadratic problem and reduce it to sufficient statistics.

    Client ``m`` draws from the stream ``(Purpose.QUADRATIC_CLIENT, m)``, in order,
    ``H = rng.random((n, d_theta)) / d_theta``, ``A = rng.random((n, d_theta)) / d_theta`` and
    ``B = rng.random((n, d_w)) / d_w``, then ``b = rng.random(n)`` and ``y = rng.random(n)``.
    With ``realizable=True`` it draws ``w_true = rng.random(d_w)`` instead and sets
    ``b = H theta_true``, ``y = A theta_true + B w_true``, where the shared ``theta_true`` is
    U[0, 1]^d_theta from the stream ``Purpose.QUADRATIC_PLANT``, so every ``f_m`` has minimum 0.
    """
    num_clients = check_num_clients(num_clients)
    n = check_count("data.n", n, 1)
    d_theta = check_count("data.d_theta", d_theta, 1)
    d_w = check_count("data.d_w", d_w, 1)
    theta_true = stream(seed, Purpose.QUADRATIC_PLANT).random(d_theta) if realizable else None
    P = np.empty((num_clients, d_theta, d_theta))
    q = np.empty((num_clients, d_theta))
    C = np.empty((num_clients, d_theta, d_w))
    D = np.empty((num_clients, d_w, d_w))
    e = np.empty((num_clients, d_w))
    c = np.empty(num_clients)
    for m in range(num_clients):
        rng = stream(seed, Purpose.QUADRATIC_CLIENT, m)
        H = rng.random((n, d_theta)) / d_theta
        A = rng.random((n, d_theta)) / d_theta
        B = rng.random((n, d_w)) / d_w
        if realizable:
            b = H @ theta_true
            y = A @ theta_true + B @ rng.random(d_w)
        else:
            b, y = rng.random(n), rng.random(n)
        P[m] = H.T @ H + A.T @ A
        q[m] = H.T @ b + A.T @ y
        C[m] = A.T @ B
        D[m] = B.T @ B
        e[m] = B.T @ y
        c[m] = 0.5 * (b @ b + y @ y)
    return QuadraticProblem(*(torch.from_numpy(a) for a in (P, q, C, D, e, c)), n=n)


class QuadraticProblem:
    """Every client's sufficient statistics (see the module doc) and the maths on them.

    ``P [M, d_theta, d_theta]``, ``q [M, d_theta]``, ``C [M, d_theta, d_w]``, ``D [M, d_w, d_w]``,
    ``e [M, d_w]`` and ``c [M]`` are float64 tensors; ``n`` is the number of samples per client.
    Derived quantities (``theta_star``, ``f_min``, ``smoothness()``) are computed once.
    """

    def __init__(self, P, q, C, D, e, c, n: int):
        self.P, self.q, self.C, self.D, self.e, self.c = (
            torch.as_tensor(t, dtype=torch.float64) for t in (P, q, C, D, e, c))
        self.n = int(n)
        M, d_theta, d_w = self.C.shape
        shapes = {"P": (M, d_theta, d_theta), "q": (M, d_theta), "D": (M, d_w, d_w),
                  "e": (M, d_w), "c": (M,)}
        for name, shape in shapes.items():
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {shape}")
        self.num_clients, self.d_theta, self.d_w = M, d_theta, d_w

    def __reduce__(self):
        # Ship the Arrow table: through Ray's object store the receiver then reads it zero-copy.
        return (QuadraticProblem.from_table, (self.table,))

    @cached_property
    def table(self) -> pa.Table:
        """One row per client: ``client_id`` (int32) and one fixed_size_list<float64> column
        per statistic (row-major flattened); schema metadata ``kind = quadratic`` plus JSON
        ``n``, ``d_theta``, ``d_w`` and ``num_clients``."""
        meta = {b"kind": b"quadratic"}
        meta.update({k.encode(): json.dumps(getattr(self, k)).encode() for k in _META_KEYS})
        columns = [pa.array(np.arange(self.num_clients, dtype=np.int32))]
        fields = [pa.field("client_id", pa.int32())]
        for name in STATS:
            flat = getattr(self, name).reshape(self.num_clients, -1).contiguous().numpy()
            columns.append(pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1]))
            fields.append(pa.field(name, pa.list_(pa.float64(), flat.shape[1])))
        return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=meta))

    @classmethod
    def from_table(cls, table: pa.Table) -> QuadraticProblem:
        """Rebuild from ``table`` (as written by ``.table``), viewing the Arrow buffers without copying.

        The statistics are then read-only; nothing here writes to them.
        """
        meta = table.schema.metadata or {}
        if meta.get(b"kind") != b"quadratic":
            raise ValueError("not a quadratic-problem table (schema metadata kind != quadratic)")
        M, d_theta, d_w, n = (json.loads(meta[k.encode()]) for k in ("num_clients", "d_theta", "d_w", "n"))
        shapes = {"P": (d_theta, d_theta), "q": (d_theta,), "C": (d_theta, d_w),
                  "D": (d_w, d_w), "e": (d_w,), "c": ()}
        stats = []
        for name in STATS:
            arr = _single_array(table.column(name))
            size = arr.type.list_size
            flat = arr.values.to_numpy(zero_copy_only=True)  # ignores arr.offset: slice by hand
            view = flat[arr.offset * size:(arr.offset + M) * size].reshape((M, *shapes[name]))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                stats.append(torch.from_numpy(view))
        problem = cls(*stats, n=n)
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

    def _batch(self, ids, theta, w=None):
        """Index tensor, ``theta`` as ``[C, d_theta]`` and ``w`` as a float64 tensor."""
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        theta = torch.as_tensor(theta, dtype=torch.float64)
        theta = theta.expand(len(ids), self.d_theta) if theta.dim() == 1 else theta
        return ids, theta, None if w is None else torch.as_tensor(w, dtype=torch.float64)

    def value(self, ids, theta, w) -> torch.Tensor:
        """``[C]``: ``f_m(theta_m, w_m)`` for each client ``m`` of ``ids``."""
        ids, theta, w = self._batch(ids, theta, w)
        Pt = (self.P[ids] @ theta.unsqueeze(-1)).squeeze(-1)
        Cw = (self.C[ids] @ w.unsqueeze(-1)).squeeze(-1)
        Dw = (self.D[ids] @ w.unsqueeze(-1)).squeeze(-1)
        return ((0.5 * Pt - self.q[ids] + Cw) * theta).sum(-1) \
            + ((0.5 * Dw - self.e[ids]) * w).sum(-1) + self.c[ids]

    def grad_theta(self, ids, theta, w) -> torch.Tensor:
        """``[C, d_theta]``: ``P theta - q + C w`` per client."""
        ids, theta, w = self._batch(ids, theta, w)
        return (self.P[ids] @ theta.unsqueeze(-1) + self.C[ids] @ w.unsqueeze(-1)).squeeze(-1) - self.q[ids]

    def grad_w(self, ids, theta, w) -> torch.Tensor:
        """``[C, d_w]``: ``C' theta + D w - e`` per client."""
        ids, theta, w = self._batch(ids, theta, w)
        Ct, Dw = self.C[ids].mT @ theta.unsqueeze(-1), self.D[ids] @ w.unsqueeze(-1)
        return (Ct + Dw).squeeze(-1) - self.e[ids]

    def best_w(self, ids, theta) -> torch.Tensor:
        """``[C, d_w]``: the exact ``argmin_w f_m(theta, w)``, the solution of ``D w = e - C' theta``."""
        ids, theta, _ = self._batch(ids, theta)
        rhs = self.e[ids] - (self.C[ids].mT @ theta.unsqueeze(-1)).squeeze(-1)
        return torch.linalg.solve(self.D[ids], rhs)

    def cg_w(self, ids, theta, w0, steps: int) -> torch.Tensor:
        """``[C, d_w]``: exactly ``steps`` conjugate-gradient iterations on ``D w = e - C' theta``
        from ``w0``; a client stops moving once its residual is exactly zero."""
        ids, theta, w = self._batch(ids, theta, w0)
        D = self.D[ids]
        r = self.e[ids] - (self.C[ids].mT @ theta.unsqueeze(-1) + D @ w.unsqueeze(-1)).squeeze(-1)
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

    def gd_w(self, ids, theta, w0, steps: int, lr: float) -> torch.Tensor:
        """``[C, d_w]``: ``steps`` full-gradient steps ``w <- w - lr grad_w f_m(theta, w)`` from ``w0``."""
        ids, theta, w = self._batch(ids, theta, w0)
        for _ in range(steps):
            w = w - lr * self.grad_w(ids, theta, w)
        return w

    @cached_property
    def _schur(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per client ``P - C D^-1 C'`` ``[M, d_theta, d_theta]`` and ``q - C D^-1 e`` ``[M, d_theta]``."""
        sol = torch.linalg.solve(self.D, torch.cat([self.C.mT, self.e.unsqueeze(-1)], dim=-1))
        K = self.P - self.C @ sol[..., :-1]
        return 0.5 * (K + K.mT), self.q - (self.C @ sol[..., -1:]).squeeze(-1)

    def operator(self, theta) -> torch.Tensor:
        """``[d_theta]``: ``F(theta) = mean_m grad_theta f_m(theta, best_w_m(theta)) = S theta - s``."""
        K, k = self._schur
        return K.mean(0) @ torch.as_tensor(theta, dtype=torch.float64) - k.mean(0)

    @cached_property
    def theta_star(self) -> torch.Tensor:
        """``[d_theta]``: the root of ``F``, the solution of ``S theta = s``."""
        K, k = self._schur
        return torch.linalg.solve(K.mean(0), k.mean(0))

    def rel_error(self, theta, theta0) -> float:
        """``|theta - theta*|^2 / |theta0 - theta*|^2``."""
        theta, theta0 = (torch.as_tensor(t, dtype=torch.float64) for t in (theta, theta0))
        return float((theta - self.theta_star).square().sum() / (theta0 - self.theta_star).square().sum())

    def grad_norm_sq(self, theta) -> float:
        """``|F(theta)|^2``."""
        return float(self.operator(theta).square().sum())

    @cached_property
    def _joint(self) -> torch.Tensor:
        """``[M, d_theta + d_w, d_theta + d_w]``: each client's Hessian ``[[P, C], [C', D]]``."""
        return torch.cat([torch.cat([self.P, self.C], -1), torch.cat([self.C.mT, self.D], -1)], -2)

    def smoothness(self) -> dict[str, float]:
        """Constants over clients: ``L = max lambda_max(P - C D^-1 C')`` (cocoercivity of each
        ``F_m``), ``L_w = max lambda_max(D)``, ``mu_w = min lambda_min(D)`` and
        ``L_f = max lambda_max([[P, C], [C', D]])``."""
        return dict(self._smoothness)

    @cached_property
    def _smoothness(self) -> dict[str, float]:
        eig_D = torch.linalg.eigvalsh(self.D)
        return {"L": float(torch.linalg.eigvalsh(self._schur[0])[:, -1].max()),
                "L_w": float(eig_D[:, -1].max()), "mu_w": float(eig_D[:, 0].min()),
                "L_f": float(torch.linalg.eigvalsh(self._joint)[:, -1].max())}

    @cached_property
    def f_min(self) -> torch.Tensor:
        """``[M]``: ``min_{theta, w} f_m`` of each client alone, ``c - g'z / 2`` where ``z``
        solves the joint normal equations ``J z = g = [q; e]`` (least squares if ``J`` is singular)."""
        g = torch.cat([self.q, self.e], -1).unsqueeze(-1)
        z = torch.linalg.lstsq(self._joint, g, driver="gelsd").solution
        return self.c - 0.5 * (g * z).sum((-2, -1))

    def loss_gap(self, theta, w) -> float:
        """``mean_m f_m(theta_m, w_m) - f_min[m]`` over all clients; ``theta`` is ``[d_theta]``
        or ``[M, d_theta]``, ``w`` is ``[M, d_w]``."""
        return float((self.value(np.arange(self.num_clients), theta, w) - self.f_min).mean())
