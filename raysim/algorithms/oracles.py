"""Gradient oracles: what a local step knows of a client's objective.

A :class:`StepPlan` fixes, before training starts, each client's number of local steps, its
minibatches (drawn from the client's own generator) and the unreliable-agent model's participation coins
(:class:`Participation`).
An oracle answers, for the ``[C, P]`` parameters of a task's clients:

* ``gradient(params, s)``: the gradient at local step ``s`` — on minibatch ``s`` of the plan
  (:class:`RowOracle` with a minibatch plan), on every training row (a full-batch plan), or
  exactly (:class:`QuadraticOracle`: the quadratic problem's clients are sufficient statistics);
* ``hvp(params, vectors, s)``: Hessian-vector products on the same data (double backward);
* ``full_gradient(params)``: the gradient over each client's whole training set.

Algorithms never branch on the kind of data: they ask the task's context for a plan and an
oracle (:meth:`raysim.algorithms.context.ClientContext.oracle`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap


@dataclass
class StepPlan:
    """Every local step of every client of a task. ``rows[s, c, b]`` (``mask`` 0 on padding)
    are client c's minibatch at step s, or None for full-batch and exact gradients; ``active[s, c]``
    is 1 while client c still has steps (clients of one task may take different numbers);
    ``participation[s, c]`` is 1/δ_c when an unreliable client computed at step s and 0 when it
    did not, or None when every client always computes."""

    steps: np.ndarray  # [C] int
    active: torch.Tensor  # [S, C] float32
    participation: torch.Tensor | None = None  # [S, C] float32
    rows: torch.Tensor | None = None  # [S, C, B] int64
    mask: torch.Tensor | None = None  # [S, C, B] float32

    @property
    def num_steps(self) -> int:
        return int(self.active.shape[0])

    def repeated(self, s: int, times: int) -> "StepPlan":
        """Step ``s`` taken ``times`` times on its minibatch, by the clients active at it and
        without coins (pFedMe's inner solve on one minibatch)."""
        active = self.active[s].expand(times, -1)
        rows = None if self.rows is None else self.rows[s].expand(times, -1, -1)
        mask = None if self.mask is None else self.mask[s].expand(times, -1, -1)
        return StepPlan(times * self.active[s].numpy().astype(np.int64), active, None, rows, mask)


@dataclass(frozen=True)
class Participation:
    """The unreliable-agent model's coins for a task's clients: client c computes with probability
    ``delta[c]``, drawing one coin per local step, or with ``per_round`` one coin for all of its
    local steps of the task. A computed step is scaled by 1/δ_c either way (unbiased)."""

    delta: np.ndarray  # [C] δ_c in (0, 1]
    per_round: bool = False

    @property
    def unreliable(self) -> bool:
        return bool((self.delta < 1).any())


def _coins(rng: np.random.Generator, steps: int, participation: Participation | None, c: int) -> np.ndarray | None:
    """Client c's scale per local step: 1/δ_c for the steps it computes, 0 for the others (None
    when it always computes)."""
    if participation is None or participation.delta[c] >= 1.0:
        return None
    delta = float(participation.delta[c])
    draws = np.full(steps, rng.random()) if participation.per_round else rng.random(steps)
    return np.where(draws < delta, 1.0 / delta, 0.0)


def _finish(per_client_steps: list, coins: list | None) -> tuple:
    """(steps [C], active [S, C], participation [S, C] or None) from the clients' step counts and
    :func:`_coins` (None: no client of the task is unreliable)."""
    steps = np.array(per_client_steps, dtype=np.int64)
    active = (np.arange(int(steps.max(initial=0)))[:, None] < steps).astype(np.float32)
    if coins is None or all(coin is None for coin in coins):
        return steps, torch.from_numpy(active), None
    scales = active.copy()
    for c, coin in enumerate(coins):
        if coin is not None:
            scales[:len(coin), c] = coin
    return steps, torch.from_numpy(active), torch.from_numpy(scales)


def minibatch_plan(starts: np.ndarray, sizes: np.ndarray, rngs: list, batch_size: int, epochs: int,
                   steps: int | None, client_steps: np.ndarray | None = None,
                   participation: Participation | None = None) -> StepPlan:
    """Minibatches of clients whose training rows are ``starts[c] : starts[c] + sizes[c]``.

    With ``steps`` unset, each of ``epochs`` passes shuffles the client's rows and cuts them
    into batches (the last one may be short); with ``steps`` set, the client takes that many
    batches from a stream of shuffled passes. ``client_steps`` (> 0) overrides the number of
    steps per client (heterogeneous E_k). A client's generator draws its permutations, then
    (with ``participation`` δ_c < 1) its coins: one per step, or one per task.
    """
    blocks, coins = [], []  # per client: its batches as a [steps, width] block of rows, -1 on padding
    unreliable = participation is not None and participation.unreliable
    for c, (start, size, rng) in enumerate(zip(starts.tolist(), sizes.tolist(), rngs)):
        own_steps = int(client_steps[c]) if client_steps is not None and client_steps[c] > 0 else steps
        if own_steps is None:  # each pass shuffles the rows and cuts them into batches (the last may be short)
            per_pass = -(-size // batch_size)
            width = min(batch_size, size)
            block = np.full((epochs, per_pass * width), -1, dtype=np.int64)
            for e in range(epochs):
                block[e, :size] = rng.permutation(size) + start
            block = block.reshape(epochs * per_pass, width)
        else:  # ``own_steps`` full batches from a stream of shuffled passes
            passes = -(-own_steps * batch_size // size)
            order = (rng.permutation(size) if passes == 1
                     else np.concatenate([rng.permutation(size) for _ in range(passes)]))
            block = order[:own_steps * batch_size].reshape(own_steps, batch_size) + start
        blocks.append(block)
        if unreliable:
            coins.append(_coins(rng, len(block), participation, c))
    num_steps, active, scales = _finish([len(b) for b in blocks], coins if unreliable else None)
    if blocks and len(blocks[0]) and len({b.shape for b in blocks}) == 1:  # one shape for all: no padding
        rows = np.stack(blocks, axis=1)
    else:
        width = max((b.shape[1] for b in blocks if len(b)), default=0)
        rows = np.full((*active.shape, width), -1, dtype=np.int64)
        for c, block in enumerate(blocks):
            rows[:len(block), c, :block.shape[1]] = block
    row_mask = (rows >= 0).astype(np.float32)
    np.maximum(rows, 0, out=rows)
    return StepPlan(num_steps, active, scales, torch.from_numpy(rows), torch.from_numpy(row_mask))


def counted_plan(rngs: list, steps: int, client_steps: np.ndarray | None = None,
                 participation: Participation | None = None) -> StepPlan:
    """``steps`` full-batch (or exact) steps per client (``client_steps`` > 0 overrides them);
    with ``participation`` δ_c < 1, each client's generator draws its coins (one per step, or one
    per task)."""
    own = [int(client_steps[c]) if client_steps is not None and client_steps[c] > 0 else steps
           for c in range(len(rngs))]
    coins = [_coins(rng, n, participation, c) for c, (rng, n) in enumerate(zip(rngs, own))]
    num_steps, active, scales = _finish(own, coins)
    return StepPlan(num_steps, active, scales)


def client_forward(model, num_clients: int):
    """``forward(params [C, P], x [C, B, ...]) -> logits [C, B, K]``: vmapped over clients (a lone
    client skips vmap's overhead)."""
    return vmap(model.logits) if num_clients > 1 else (lambda p, x: model.logits(p[0], x[0])[None])


def per_client_loss(forward, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each client's unmasked rows: params [C, P], x [C, B, ...] -> [C]."""
    logits = forward(params, x)
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
    return (losses * mask).sum(1) / mask.sum(1).clamp_min(1.0)


_aten = torch.ops.aten


def per_client_loss_backward(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                             denominator: torch.Tensor | None = None, row_grad: torch.Tensor | None = None) -> tuple:
    """(gradient of the summed :func:`per_client_loss` with respect to ``logits`` [C·B, K], the
    losses [C]) without the autograd engine: the kernels autograd runs, on the same operands,
    so the bits are the same (``cross_entropy`` is ``log_softmax`` then ``nll_loss``; the mean's
    backward is 1/denominator times the mask). ``denominator`` (``mask.sum(1).clamp_min(1)``) and
    ``row_grad`` (:func:`loss_row_grads`) depend only on the mask and may come precomputed."""
    logp = torch.log_softmax(logits, 1)
    target = y.reshape(-1)
    losses, total_weight = _aten.nll_loss_forward(logp, target, None, 0, -100)
    if denominator is None:
        denominator = mask.sum(1).clamp_min(1.0)
    loss = (losses.view_as(mask) * mask).sum(1) / denominator
    if row_grad is None:
        row_grad = loss_row_grads(mask, denominator, loss.dtype)
    grad = _aten.nll_loss_backward(row_grad.reshape(-1), logp, target, None, 0, -100, total_weight)
    return torch._log_softmax_backward_data(grad, logp, 1, logp.dtype), loss


def loss_row_grads(mask: torch.Tensor, denominator: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """d(Σ_c per-client mean loss)/d(row loss) = mask / denominator, as autograd computes it
    (``1 / denominator`` expanded, times the mask); any leading dims (steps) broadcast."""
    ones = torch.ones((), dtype=dtype, device=mask.device).expand(denominator.shape)
    return torch.div(ones, denominator).unsqueeze(-1).expand(mask.shape) * mask


class _StepBatches:
    """What a minibatch plan's local steps share, computed once per task: every step's labels
    (as the clients see them), and the loss backward's constants (they depend on the mask only).
    The features are gathered step by step: a fresh tensor, whose alignment the BLAS kernels'
    results may depend on (an offset view of one big gather gives other bits)."""

    def __init__(self, oracle: "RowOracle", dtype: torch.dtype):
        rows, mask = oracle._rows
        self.rows, self.mask = rows, mask
        self.y = oracle._flip(oracle.labels.index_select(0, rows.reshape(-1)).view(rows.shape))
        self.denominator = mask.sum(2).clamp_min(1.0)  # [S, C] (integer counts: exact in any order)
        self.row_grad = loss_row_grads(mask, self.denominator, torch.promote_types(dtype, mask.dtype))


class RowOracle:
    """Cross-entropy gradients of clients whose data are rows of ``features``/``labels``
    (``offsets[c]`` = train start, test start, test end of client c; with ``label_flip``, the
    Byzantine label-flipping clients train on flipped labels). One backward pass of the
    summed per-client losses gives every client's own gradient, since client c's loss depends
    only on its own row of parameters."""

    def __init__(self, model, features: torch.Tensor, labels: torch.Tensor, offsets: np.ndarray,
                 plan: StepPlan | None, device: torch.device, label_flip: tuple | None = None):
        self.model, self.features, self.labels, self.plan, self.device = model, features, labels, plan, device
        self.label_flip = label_flip  # (flipped [C] bool, classes): those clients see labels y -> classes - 1 - y
        self.offsets = offsets
        self.forward = client_forward(model, len(offsets))
        # hand-written passes of a plain MLP (same bits), for rows it takes: vectors, or flattened first
        dense = getattr(model, "dense", None)
        self.dense = dense if dense is not None and (dense.flatten or features.dim() == 2) else None
        self._rows = None if plan is None or plan.rows is None else (plan.rows.to(device), plan.mask.to(device))
        self._full = None
        self._steps = None  # _StepBatches, on the first minibatch gradient of the fast path

    def _batch(self, s: int | None):
        """(x, y, mask) of step s, or of every training row (``s`` None or a full-batch plan)."""
        if s is None or self._rows is None:
            if self._full is None:
                sizes = torch.as_tensor(self.offsets[:, 1] - self.offsets[:, 0], device=self.device)
                cols = torch.arange(int(sizes.max()), device=self.device)
                mask = (cols[None, :] < sizes[:, None]).float()
                rows = torch.as_tensor(self.offsets[:, 0], device=self.device)[:, None] + cols[None, :] * mask.long()
                self._full = (rows, mask)
            rows, mask = self._full
        else:
            rows, mask = self._rows[0][s], self._rows[1][s]
        flat = rows.reshape(-1)
        labels = self._flip(self.labels.index_select(0, flat).view(rows.shape))
        return self.features.index_select(0, flat).view(*rows.shape, *self.features.shape[1:]), labels, mask

    def _flip(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels [..., C, B] as the clients see them (flipped for label-flipping Byzantine clients)."""
        if self.label_flip is None:
            return labels
        flipped, classes = self.label_flip
        return torch.where(flipped.to(self.device)[:, None], classes - 1 - labels, labels)

    def _loss(self, leaf: torch.Tensor, s: int | None) -> torch.Tensor:
        x, y, mask = self._batch(s)
        return per_client_loss(self.forward, leaf, x, y, mask)

    def gradient(self, params: torch.Tensor, s: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(gradients [C, P], losses [C]) at local step ``s`` (None: every training row)."""
        if self.dense is not None and params.dtype == self.features.dtype and params.stride(-1) == 1:
            return self._dense_gradient(params.detach(), s)
        leaf = params.detach().requires_grad_(True)
        loss = self._loss(leaf, s)
        (grads,) = torch.autograd.grad(loss.sum(), leaf)
        return grads, loss.detach()

    def _dense_gradient(self, params: torch.Tensor, s: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`gradient` through the model's hand-written passes (:mod:`raysim.models.dense`),
        bit for bit the autograd path's result."""
        batched = len(self.offsets) > 1  # as :func:`client_forward`: one client is not vmapped
        if s is None or self._rows is None:
            x, y, mask = self._batch(s)
            return self.dense.loss_backward(params, x, lambda logits: per_client_loss_backward(logits, y, mask),
                                            batched)
        if self._steps is None:
            self._steps = _StepBatches(self, params.dtype)
        steps = self._steps
        rows = steps.rows[s]
        x = self.features.index_select(0, rows.reshape(-1)).view(*rows.shape, *self.features.shape[1:])
        y, mask, denominator, row_grad = steps.y[s], steps.mask[s], steps.denominator[s], steps.row_grad[s]
        return self.dense.loss_backward(params, x, lambda logits: per_client_loss_backward(
            logits, y, mask, denominator, row_grad), batched)

    def full_gradient(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gradients, losses) over each client's whole training set."""
        return self.gradient(params, None)

    def hvp(self, params: torch.Tensor, vectors: torch.Tensor, s: int | None) -> torch.Tensor:
        """[C, P]: each client's Hessian at ``params`` (data of step ``s``) times its row of ``vectors``."""
        leaf = params.detach().requires_grad_(True)
        (grads,) = torch.autograd.grad(self._loss(leaf, s).sum(), leaf, create_graph=True)
        (product,) = torch.autograd.grad((grads * vectors).sum(), leaf)
        return product


class QuadraticOracle:
    """Exact gradients of the quadratic problem's clients (:mod:`raysim.data.quadratic`): every
    step sees the client's whole objective."""

    def __init__(self, problem, plan: StepPlan | None):
        """``problem``: the task's clients alone (:meth:`~raysim.data.quadratic.QuadraticProblem.subset`)."""
        self.problem, self.plan, self.d = problem, plan, problem.d_theta

    def gradient(self, params: torch.Tensor, s: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        theta, w = params[:, :self.d], params[:, self.d:]
        grads = torch.cat([self.problem.grad_theta(None, theta, w), self.problem.grad_w(None, theta, w)], 1)
        return grads, self.problem.value(None, theta, w)

    def full_gradient(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gradient(params, None)

    def hvp(self, params: torch.Tensor, vectors: torch.Tensor, s: int | None) -> torch.Tensor:
        """The Hessian [[P, C], [Cᵀ, D]] of each client times its row of ``vectors``."""
        return self.problem.hvp(None, vectors[:, :self.d], vectors[:, self.d:])

    def solve_personal(self, params: torch.Tensor, how: str, steps: int) -> torch.Tensor:
        """``params`` with w replaced by the exact best response (``exact``) or ``steps``
        conjugate-gradient iterations from the current w (``cg``)."""
        theta = params[:, :self.d]
        w = (self.problem.best_w(None, theta) if how == "exact"
             else self.problem.cg_w(None, theta, params[:, self.d:], steps))
        return torch.cat([theta, w], 1)
