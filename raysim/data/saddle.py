"""The strict-saddle problem of Vlaski, Rizk and Sayed, "Second-Order Guarantees in Federated
Learning": binary labels γ ∈ {−1, +1} and features h ∈ R^d, fitted by the bilinear model
(``model.kind: bilinear``) with the loss Q = log(1 + exp(−γ·w₁ᵀW₂h)), whose origin is a strict
saddle of the ridge-regularised risk.

Client k has its own mean m_k ~ U[0.5, 1.5] and rows h = γ·m_k·u + N(0, I_d), γ uniform on
{−1, +1}, with u = (1, …, 1)/√d (the same unit vector for every client). A label γ is stored as
the class (γ + 1)/2, so that the softmax cross-entropy of the logits [0, w₁ᵀW₂h] is Q.
"""

from __future__ import annotations

import numpy as np

from raysim.data._checks import check_count, check_num_clients, check_test_fraction, test_rows_beside
from raysim.streams import Purpose, streams

MEAN_LOW, MEAN_HIGH = 0.5, 1.5  # m_k ~ U[MEAN_LOW, MEAN_HIGH]


class SaddleLaw:
    """Saddle data (see the module doc): ``samples_per_client`` training rows per client, then
    :func:`~raysim.data._checks.test_rows_beside` test rows from the same law.

    Client ``k`` draws from the stream ``(Purpose.SADDLE_CLIENT, k)``, in order: ``m_k``, the
    signs γ of its rows (train then test), then the ``[rows, dim]`` Gaussian noise. A client's
    rows do not depend on how many clients there are.
    """

    name, num_classes = "saddle", 2

    def __init__(self, seed: int, samples_per_client: int, dim: int, test_fraction: float):
        self.seed = int(seed)
        self.params = {"samples_per_client": check_count("data.samples_per_client", samples_per_client, 1),
                       "dim": check_count("data.dim", dim, 1), "test_fraction": check_test_fraction(test_fraction)}
        self.feature_shape = (self.params["dim"],)
        self.direction = np.full(dim, 1.0 / np.sqrt(dim))

    @classmethod
    def from_config(cls, data_cfg, seed: int) -> SaddleLaw:
        """The law of the scenario's ``data`` keys."""
        return cls(seed, data_cfg.samples_per_client, data_cfg.dim, data_cfg.test_fraction)

    def sizes(self, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """(train, test) rows of every client."""
        n_train = self.params["samples_per_client"]
        n_test = test_rows_beside(n_train, self.params["test_fraction"])
        num_clients = check_num_clients(num_clients)
        return np.full(num_clients, n_train, dtype=np.int64), np.full(num_clients, n_test, dtype=np.int64)

    def client_streams(self, clients) -> list:
        """The stream of each client: ``(Purpose.SADDLE_CLIENT, k)``."""
        return streams(self.seed, Purpose.SADDLE_CLIENT, np.asarray(clients, dtype=np.int64).reshape(-1, 1))

    def rows(self, k: int, n_train: int, n_test: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Client ``k``'s rows, train then test, drawn from its stream ``rng``."""
        n = n_train + n_test
        mean = rng.uniform(MEAN_LOW, MEAN_HIGH)
        gamma = rng.choice([-1.0, 1.0], size=n)
        x = (gamma * mean)[:, None] * self.direction + rng.standard_normal((n, len(self.direction)))
        return x.astype(np.float32), (gamma > 0).astype(np.int64)


