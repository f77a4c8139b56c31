"""A model seen as a pure function of one flat parameter vector (torch.func)."""

from __future__ import annotations

import copy
import hashlib

import torch
from torch import nn
from torch.func import functional_call

from raysim.models.dense import DenseStack


class FlatModel:
    """Wraps an ``nn.Module`` so that parameters travel as one flat vector (float32; float64 for
    the quadratic model). ``personal`` marks the personal entries w (the rest are global θ).

    All algorithms handle parameters as flat vectors (``[P]``, or ``[C, P]`` for a
    batch of clients); :meth:`logits` evaluates the module at any such vector,
    also under ``torch.func.vmap``.
    """

    def __init__(self, module: nn.Module, personal: torch.Tensor | None = None):
        self.module = module
        params = dict(module.named_parameters())
        self.names = list(params)
        self.shapes = [tuple(p.shape) for p in params.values()]
        self.numels = [p.numel() for p in params.values()]
        self.size = sum(self.numels)
        self.personal = torch.zeros(self.size, dtype=torch.bool) if personal is None else personal  # [P]: w entries
        self.global_index = torch.nonzero(~self.personal).flatten()  # positions of θ in the flat vector
        self.personal_index = torch.nonzero(self.personal).flatten()
        # BatchNorm without running statistics normalizes by its batch: evaluation batches hold one client's rows
        self.batch_statistics = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
        # plain MLPs (logreg, mlp) also have hand-written passes with the same bits (models/dense.py)
        self.dense = DenseStack.of(module, self.names, self.numels)

    def initial_vector(self) -> torch.Tensor:
        """The module's current parameters as one flat vector."""
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).clone()

    def unflatten(self, flat: torch.Tensor) -> dict:
        """Views of ``flat`` ([..., P]) as a name → tensor dict."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, self.numels, dim=-1)
        return {n: p.reshape(*lead, *s) for n, p, s in zip(self.names, parts, self.shapes)}

    def logits(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Model output at parameters ``flat`` ([P]) for inputs ``x``."""
        return functional_call(self.module, self.unflatten(flat), (x,))

    def to(self, device) -> "FlatModel":
        """Move the wrapped module (its structure; parameters come from vectors)."""
        self.module.to(device)
        return self

    def module_at(self, flat: torch.Tensor) -> nn.Module:
        """A copy of the wrapped module holding the parameters ``flat``, in eval mode."""
        module = copy.deepcopy(self.module).cpu()
        module.load_state_dict(self.state_dict(flat))
        return module.eval()

    def state_dict(self, flat: torch.Tensor) -> dict:
        """A regular ``state_dict`` for ``flat``, loadable into the module."""
        return {n: t.detach().clone().cpu() for n, t in self.unflatten(flat).items()}


def sha256(flat: torch.Tensor) -> str:
    """SHA-256 of a parameter vector's bytes in its own dtype (the determinism fingerprint)."""
    return hashlib.sha256(flat.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
