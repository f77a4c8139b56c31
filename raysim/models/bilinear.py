"""The bilinear model of the saddle problem (``data.kind: saddle``; Vlaski, Rizk and Sayed,
"Second-Order Guarantees in Federated Learning"): z = w₁ᵀW₂h with w₁ ∈ R^d and W₂ ∈ R^{d×d}.

Its logits are [0, z], so the softmax cross-entropy of class (γ + 1)/2 is Q = log(1 + exp(−γz)).
At the origin every gradient of Q vanishes and, with ridge regularisation ρ, the Hessian of the
risk has eigenvalues ρ ± ‖mean(γh)‖/2: a strict saddle when ‖mean(γh)‖/2 > ρ.
"""

from __future__ import annotations

import torch
from torch import nn

from raysim.streams import Purpose, stream


class Bilinear(nn.Module):
    """Parameters ``w1`` [d] and ``W2`` [d, d] (flat order: w₁, then W₂ row by row), each entry
    ``init_scale``·N(0, 1) from the stream ``Purpose.BILINEAR_INIT`` (0: exactly the origin)."""

    def __init__(self, dim: int, init_scale: float, seed: int):
        super().__init__()
        draws = stream(seed, Purpose.BILINEAR_INIT).standard_normal(dim + dim * dim) * init_scale
        start = torch.tensor(draws, dtype=torch.float32)
        self.w1 = nn.Parameter(start[:dim].clone())
        self.W2 = nn.Parameter(start[dim:].reshape(dim, dim).clone())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [B, 2] = [0, w₁ᵀW₂h] of features ``h`` [B, d]."""
        z = (h @ self.W2.T) @ self.w1
        return torch.stack([torch.zeros_like(z), z], dim=-1)
