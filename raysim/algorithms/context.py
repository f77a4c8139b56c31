"""What a task of clients sees on the host that runs it, and the builders of its local training."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from raysim.algorithms import transforms
from raysim.algorithms.local import LocalResult
from raysim.algorithms.oracles import (Participation, QuadraticOracle, RowOracle, StepPlan, counted_plan,
                                       minibatch_plan)
from raysim.algorithms.updates import ClientUpdates, RowData


@dataclass
class ClientContext:
    """What a task of C clients sees on the host that runs it, and the builders of its local
    training: :meth:`plan`, :meth:`oracle`, :meth:`transform`."""

    client_ids: np.ndarray  # [C]
    rngs: list  # one numpy Generator per client, from (seed, purpose, client, task counter)
    model: object  # FlatModel
    data: object  # RowData, or the QuadraticProblem
    device: torch.device
    participation: Participation | None = None  # δ_k of unreliable clients and their coin (None: always compute)
    local_steps: np.ndarray | None = None  # [C] heterogeneous E_k (> 0 overrides the algorithm's)
    noise: tuple | None = None  # (kind, scale): perturbation of local gradients
    normalize_steps: bool = False  # each client's step size is lr / (its number of local steps)
    states: list | None = None  # [C] each client's kept state (a dict of tensors, or None on a first visit)
    label_flip: tuple | None = None  # (flipped [C] bool tensor, classes): Byzantine clients train on flipped labels
    step_scale: np.ndarray | None = None  # [C] lr_decay^t, t the server step each client starts from (None: 1)

    @property
    def quadratic(self) -> bool:
        return not isinstance(self.data, RowData)

    @property
    def train_sizes(self) -> np.ndarray:
        if self.quadratic:
            return np.full(len(self.client_ids), self.data.n, dtype=np.int64)
        offsets = self.data.offsets
        return offsets[:, 1] - offsets[:, 0]

    def plan(self, steps: int | None, batch_size: int = 1, epochs: int = 1, full_batch: bool = False,
             coins: bool = True, rows: str = "train") -> StepPlan:
        """The task's local steps: minibatches of ``batch_size`` from the clients' ``rows`` (train
        or test; ``steps`` of them, or ``epochs`` passes when ``steps`` is None), or ``steps``
        full-batch steps (always, on quadratic data). The unreliable-agent model's E_k applies,
        and its δ_k coins unless ``coins`` is false (a second batch stream of the same steps)."""
        participation = self.participation if coins else None
        if self.quadratic or full_batch:
            return counted_plan(self.rngs, steps, self.local_steps, participation)
        offsets = self.data.offsets
        first, last = (0, 1) if rows == "train" else (1, 2)
        return minibatch_plan(offsets[:, first], offsets[:, last] - offsets[:, first], self.rngs, batch_size, epochs,
                              steps, self.local_steps, participation)

    def plan_from(self, cfg, full_batch: bool = False) -> StepPlan:
        """:meth:`plan` with an algorithm's keys (``local_steps``, ``batch_size``, ``local_epochs``)."""
        return self.plan(cfg.local_steps, getattr(cfg, "batch_size", 1), getattr(cfg, "local_epochs", 1), full_batch)

    @functools.cached_property
    def _problem(self):
        """The quadratic problem of these clients alone, taken once for the task's oracles."""
        return self.data.subset(self.client_ids)

    def oracle(self, plan: StepPlan | None = None):
        """The gradient oracle of these clients' data under ``plan`` (None: full gradients only)."""
        if self.quadratic:
            return QuadraticOracle(self._problem, plan)
        return RowOracle(self.model, self.data.features, self.data.labels, self.data.offsets,
                         plan, self.device, self.label_flip)

    def transform(self, plan: StepPlan, lr, *terms: transforms.ClientTransform, weight_decay: float = 0.0,
                  max_grad_norm: float | None = None, only: torch.Tensor | None = None,
                  noise: bool = True) -> transforms.ClientTransform:
        """The chain of a local step: the algorithm's ``terms`` (proximal, correction), gradient
        clipping, weight decay, the unreliable-agent model's noise (unless ``noise`` is false: a step
        along no gradient of the data, such as APFL's α or pFedMe's outer step) and participation
        scaling, a mask of the entries that move (``only``), and the step size ``lr`` (divided by
        each client's number of local steps E_k with ``normalize_steps``)."""
        parts = list(terms)
        if max_grad_norm is not None:
            parts.append(transforms.clip_by_norm(max_grad_norm))
        if weight_decay:
            parts.append(transforms.add_weight_decay(weight_decay))
        if noise and self.noise is not None:
            parts.append(transforms.add_noise(*self.noise, self.rngs))
        if plan.participation is not None:
            parts.append(transforms.scale_by_participation(plan.participation.to(self.device)))
        if only is not None:
            parts.append(transforms.mask(only.to(self.device)))
        parts.append(transforms.scale(self.step_size(plan, lr)))
        return transforms.chain(*parts)

    def step_size(self, plan: StepPlan, lr):
        """Each client's local step size: ``lr``, times its :attr:`step_scale` (``algorithm.lr_decay``)
        and divided by its number of local steps E_k with ``normalize_steps``; a float64 [C]
        tensor unless it is ``lr`` alone."""
        if not self.normalize_steps and self.step_scale is None:
            return lr
        size = torch.as_tensor(lr, dtype=torch.float64, device=self.device)
        if self.step_scale is not None:
            size = size * torch.as_tensor(self.step_scale, dtype=torch.float64, device=self.device)
        if self.normalize_steps:
            size = size / torch.as_tensor(plan.steps, dtype=torch.float64, device=self.device).clamp_min(1)
        return size

    def start(self, payloads: list, key: str = "params") -> torch.Tensor:
        """[C, P] rows of the payloads' ``key`` on this host's device (shared when all are one)."""
        first = payloads[0][key]
        if all(p[key] is first for p in payloads):
            return first.to(self.device).expand(len(payloads), -1)
        return torch.stack([p[key] for p in payloads]).to(self.device)

    def kept(self, name: str, default: torch.Tensor) -> torch.Tensor:
        """[C, ...]: each client's kept state ``name``, or its row of ``default`` on a first visit."""
        states = self.states or [None] * len(self.client_ids)
        rows = [d if s is None or name not in s else s[name].to(d) for s, d in zip(states, default)]
        return torch.stack(rows)

    def updates(self, result: LocalResult | torch.Tensor, vector: torch.Tensor, extras: dict | None = None,
                states: dict | None = None, diagnostics: dict | None = None) -> ClientUpdates:
        """ClientUpdates of these clients (``result``: their local training, or their losses [C])."""
        loss = result.loss if isinstance(result, LocalResult) else result.double().cpu().numpy()
        cpu = lambda d: {k: v.detach().cpu() for k, v in (d or {}).items()}
        return ClientUpdates(self.client_ids, self.train_sizes, np.asarray(loss, dtype=np.float64),
                             vector.detach().cpu(), cpu(extras), cpu(states), cpu(diagnostics))
