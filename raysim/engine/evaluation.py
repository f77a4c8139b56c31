"""Evaluation: the server model over the evaluated clients' test rows (on the driver or the client
hosts), the exact metrics of a quadratic problem, or the exact objective and curvature of a small model."""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms import ClientTests, RowData
from raysim.algorithms.context import ClientContext
from raysim.data.federated import row_index
from raysim.data.quadratic import CLIENTS_AT_ONCE
from raysim.streams import Purpose, streams
from raysim.threads import torch_threads

CURVATURE_CHUNK = 2 ** 20  # rows × parameters per pass of the curvature evaluation (bounds its memory)


def client_tests(model, params: torch.Tensor, data, client_ids: np.ndarray, chunk: int = 8192) -> ClientTests:
    """Each client's test rows (``data``: a :class:`RowData`) through the one model ``params`` [P]:
    per client, its summed cross-entropy (float64), the rows it gets right and its test rows.

    The rows are gathered client after client, ``chunk`` at a time, into fresh tensors, so a
    client's figures depend only on the clients it is tested with (its evaluation task) and the
    kind of device: the driver and any ClientActor give the same bits. A model that normalizes
    with batch statistics (BatchNorm) is tested on batches of one client's rows (``chunk`` at a
    time), so a client's figures depend on its own rows only."""
    rows_at, packed = row_index(data.offsets, "test")
    counts, total = packed[:, 2] - packed[:, 0], len(rows_at)
    index = torch.from_numpy(rows_at).to(data.features.device)
    losses, hits = [torch.zeros(0, dtype=torch.float64)], [torch.zeros(0, dtype=torch.bool)]
    if model.batch_statistics:
        ends = np.cumsum(counts).tolist()
        batches = [(i, min(i + chunk, end)) for start, end in zip([0, *ends], ends) for i in range(start, end, chunk)]
    else:
        batches = [(i, min(i + chunk, total)) for i in range(0, total, chunk)]
    with torch.no_grad():
        for i, stop in batches:
            rows = index[i:stop]
            logits = model.logits(params, data.features.index_select(0, rows))
            y = data.labels.index_select(0, rows)
            losses.append(F.cross_entropy(logits, y, reduction="none").double().cpu())
            hits.append((logits.argmax(1) == y).cpu())
    owner = np.repeat(np.arange(len(counts)), counts)  # bincount sums each client's rows in order
    return ClientTests(np.asarray(client_ids), np.bincount(owner, torch.cat(losses).numpy(), len(counts)),
                       np.bincount(owner, torch.cat(hits).numpy(), len(counts)).astype(np.int64), counts)


class PooledTests:
    """Test loss and accuracy pooled over every row of ``clients`` (their ids, sorted), from their
    ClientTests added in any order: each client's float64 loss sum is kept (8 bytes a client) and
    the sums are added in client-id order; right answers and rows are counted as integers."""

    def __init__(self, clients: np.ndarray):
        self.clients = clients
        self.loss_sums = np.zeros(len(clients))
        self.correct = self.rows = 0

    def add(self, tests: ClientTests) -> None:
        """Count the clients of ``tests``."""
        self.loss_sums[np.searchsorted(self.clients, tests.client_ids)] = tests.test_loss_sum
        self.correct += int(tests.test_correct.sum())
        self.rows += int(tests.test_rows.sum())

    def result(self) -> tuple[float, float]:
        """(test loss, test accuracy); NaN when no client has test rows."""
        if self.rows == 0:
            return float("nan"), float("nan")
        return float(self.loss_sums.sum()) / self.rows, self.correct / self.rows


class GlobalEvaluator:
    """The global model over the evaluated clients' test rows on the driver: the tasks (of ``op``
    'evaluate') that the ClientActors would run with ``eval.where: actors``, one after another,
    with the same bits. Tasks come in chunks (:func:`raysim.engine.dispatch.task_chunks`): a
    chunk's test rows are built (or copied from the table), tested and dropped before the next
    chunk's, so one chunk is held whatever the population."""

    def __init__(self, model, dataset, threads: int):
        self.model, self.dataset, self.threads = model, dataset, threads

    def rows(self, tasks: list) -> list:
        """The test rows of the clients of ``tasks``, one RowData per task, in a copy of their own
        (rows built on demand are not cached: the cache keeps the clients that train)."""
        ids = np.concatenate([np.asarray(t.client_ids, dtype=np.int64) for t in tasks])
        rows = self.dataset.rows_of(ids, "test", keep=False)
        features = torch.from_numpy(rows.features).reshape(-1, *self.dataset.feature_shape)
        labels = torch.from_numpy(rows.labels)
        ends = np.cumsum([len(t.client_ids) for t in tasks])[:-1]
        return [RowData(features, labels, offsets) for offsets in np.split(rows.offsets, ends)]

    def tests(self, params: torch.Tensor, chunks: Iterable[list]) -> Iterator[list]:
        """The ClientTests of each task of each chunk of ``chunks`` at the global model ``params``,
        a list per chunk."""
        for tasks in chunks:
            data = self.rows(tasks)
            with torch_threads(self.threads):
                tested = [client_tests(self.model, params, rows, task.client_ids) for task, rows in zip(tasks, data)]
            del data  # before the next chunk's rows are built
            yield tested


class QuadraticEvaluator:
    """Exact metrics of a quadratic problem (FFGG paper, §3): relative error to the closed-form
    θ*, ‖F(θ)‖², and the mean personalised loss gap over clients."""

    def __init__(self, problem, personalised: bool, initial: torch.Tensor):
        self.problem, self.d_theta, self.personalised = problem, problem.d_theta, personalised
        self.theta0 = initial[:self.d_theta].double()

    def __call__(self, params: torch.Tensor, client_models: torch.Tensor | None) -> dict:
        """``params``: the global model [θ, w]; ``client_models``: [M, P] per-client models (L2GD)
        or None. A partially personalised algorithm (FFGG) is judged with each client's best
        response w_m*(θ); a shared model with its own w."""
        model = (params if client_models is None else client_models).double()
        theta, w = model[..., :self.d_theta], model[..., self.d_theta:]
        center = theta if theta.dim() == 1 else theta.mean(0)
        return {"rel_error": self.problem.rel_error(center, self.theta0),
                "grad_norm_sq": self.problem.grad_norm_sq(center),
                "loss_gap": self.problem.loss_gap(theta, None if self.personalised else w)}


class DeployedLoss:
    """``deployed_loss_gap``: mean_m f_m(the model client m deploys) − mean_m min f_m over every client
    of a quadratic problem, for an algorithm whose clients deploy a model of their own
    (:meth:`~raysim.algorithms.base.Algorithm.deployed`: FFGG's θ with its fine-tuned w, where
    ``loss_gap`` takes the exact best response w*(θ)). A client's personal start is drawn for the
    evaluation at that server step; a chunk of clients at a time."""

    def __init__(self, problem, model, algorithm, seed: int, threads: int):
        self.problem, self.model, self.algorithm, self.seed, self.threads = problem, model, algorithm, seed, threads

    def __call__(self, params: torch.Tensor, step: int) -> float:
        problem, total, d_theta = self.problem, 0.0, self.problem.d_theta
        with torch_threads(self.threads):
            for lo in range(0, problem.num_clients, CLIENTS_AT_ONCE):
                ids = np.arange(lo, min(lo + CLIENTS_AT_ONCE, problem.num_clients), dtype=np.int64)
                rngs = streams(self.seed, Purpose.DEPLOYED_START, np.stack([ids, np.full(len(ids), step)], 1))
                ctx = ClientContext(ids, rngs, self.model, problem, torch.device("cpu"))
                models = self.algorithm.deployed(ctx, params.expand(len(ids), -1)).double()
                total += float(problem.value(ids, models[:, :d_theta], models[:, d_theta:]).sum())
        return total / problem.num_clients - problem.population.f_min


class CurvatureEvaluator:
    """``eval.curvature``: the exact objective J(w) = Σ_k p_k·(mean training loss of client k) +
    (weight_decay/2)·‖w‖² over every client's training rows (p_k = 1/K for ``system.unreliable.weights:
    uniform``, K the clients with training rows; else each client's share of the rows), the squared
    norm of its gradient and the least eigenvalue of its Hessian, in float64 with torch.func (a full
    Hessian: small models, see :func:`raysim.footprint.check_curvature`)."""

    def __init__(self, model, dataset, uniform: bool, weight_decay: float, threads: int):
        sizes = dataset.train_sizes()
        rows = dataset.rows_of(np.arange(dataset.num_clients), "train", keep=False)
        if uniform:  # p_k / n_k per row of client k
            share = 1.0 / (np.count_nonzero(sizes) * np.maximum(sizes, 1))
        else:
            share = np.full(len(sizes), 1.0 / sizes.sum())
        features, labels = torch.from_numpy(rows.features), torch.from_numpy(rows.labels)
        chunk = max(1, CURVATURE_CHUNK // model.size)
        self.chunks = [(x.double().reshape(-1, *dataset.feature_shape), y, w)
                       for x, y, w in zip(features.split(chunk), labels.split(chunk),
                                          torch.from_numpy(np.repeat(share, sizes)).split(chunk))]
        self.model, self.weight_decay, self.threads = model, weight_decay, threads

    def _loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Σ p_k/n_k·loss over the rows ``x``, ``y`` (their ``weights``) at parameters ``theta``."""
        return F.cross_entropy(self.model.logits(theta, x), y, reduction="none") @ weights

    def _gradient(self, theta: torch.Tensor, *rows) -> tuple:
        """(gradient, (gradient, value)) of :meth:`_loss`: differentiated once more, the Hessian too."""
        grad, value = torch.func.grad_and_value(self._loss)(theta, *rows)
        return grad, (grad, value)

    def __call__(self, params: torch.Tensor) -> dict:
        """``objective`` J, ``grad_norm_sq`` ‖∇J‖², ``hessian_min_eig`` λ_min(∇²J) and the flat
        ``parameters`` at the global model ``params``."""
        theta = params.detach().double()
        value = 0.5 * self.weight_decay * theta @ theta
        grad = self.weight_decay * theta
        hessian = self.weight_decay * torch.eye(len(theta), dtype=torch.float64)
        with torch_threads(self.threads):
            for rows in self.chunks:
                h, (g, v) = torch.func.jacrev(self._gradient, has_aux=True)(theta, *rows)
                value, grad, hessian = value + v, grad + g, hessian + h
            least = torch.linalg.eigvalsh(hessian)[0]
        return {"objective": float(value), "grad_norm_sq": float(grad @ grad), "hessian_min_eig": float(least),
                "parameters": theta.tolist()}
