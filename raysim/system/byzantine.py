"""What Byzantine clients send (``system.byzantine.attack``).

The Byzantine clients themselves are part of the system profile (``profile["byzantine"]``, drawn
once from the seed). They are timed like honest clients and compute their honest update; at the
server step the attack replaces their rows of the step's updates:

* ``sign_flip``: −scale × the client's own honest update;
* ``gaussian``: N(0, σ²) coordinates, from the stream ``(Purpose.BYZANTINE_ATTACK, server step)``;
* ``nan``: NaN everywhere;
* ``alie`` (Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For Distributed
  Learning"): honest mean − z × honest standard deviation, per coordinate;
* ``ipm`` (Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product
  Manipulation"): −ε × the honest mean.

``alie`` and ``ipm`` are omniscient: they see the honest updates of the same step (a synchronous
round, a FedBuff buffer) or, under FedAsync, the last ``window`` honest updates; when there is no
honest update to see, they use the Byzantine clients' own honest updates. ``label_flip`` changes
nothing here: it is a data attack inside local training (:class:`~raysim.algorithms.ClientContext`).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import torch

from raysim.streams import Purpose, stream
from raysim.system.config import OMNISCIENT_ATTACKS


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z for n updates of which f are Byzantine: with s = ⌊n/2 + 1⌋ − f honest
    supporters needed, z = Φ⁻¹((n − s)/n) (0 where that is not a probability in (0, 1))."""
    s = max(1, math.floor(n / 2 + 1) - f)
    p = (n - s) / n
    return NormalDist().inv_cdf(p) if 0 < p < 1 else 0.0


class Attack:
    """The configured attack (``cfg``: the ``system.byzantine`` section) of a run with ``seed``."""

    def __init__(self, cfg, seed: int):
        self.cfg, self.seed = cfg, int(seed)

    @property
    def replaces_updates(self) -> bool:
        """Whether the attack replaces vectors at the server (every attack but label_flip)."""
        return self.cfg.attack != "label_flip"

    @property
    def omniscient(self) -> bool:
        return self.cfg.attack in OMNISCIENT_ATTACKS

    def __call__(self, vectors: torch.Tensor, byzantine: np.ndarray, step: int,
                 seen: torch.Tensor | None = None) -> torch.Tensor:
        """``vectors`` [K, P] with the rows where ``byzantine`` [K] is true replaced by what the
        attack sends at server step ``step``; ``seen`` [R, P]: the honest updates an omniscient
        attack sees (None: the honest rows of ``vectors``)."""
        rows = torch.from_numpy(np.flatnonzero(byzantine))
        if not len(rows) or not self.replaces_updates:
            return vectors
        cfg, out = self.cfg, vectors.clone()
        if cfg.attack == "sign_flip":
            out[rows] = -cfg.scale * vectors[rows]
        elif cfg.attack == "gaussian":
            noise = stream(self.seed, Purpose.BYZANTINE_ATTACK, step).normal(0.0, cfg.sigma, (len(rows), vectors.shape[1]))
            out[rows] = torch.from_numpy(noise).to(vectors)
        elif cfg.attack == "nan":
            out[rows] = math.nan
        else:
            if seen is None:
                seen = vectors[torch.from_numpy(np.flatnonzero(~byzantine))]
            if not len(seen):
                seen = vectors[rows]  # no honest update to see: the Byzantine clients' own honest ones
            seen = seen.double()
            mean = seen.mean(0)
            if cfg.attack == "ipm":
                sent = -cfg.epsilon * mean
            else:
                z = cfg.z if cfg.z is not None else alie_z(len(seen) + len(rows), len(rows))
                sent = mean - z * seen.std(0, correction=1 if len(seen) > 1 else 0)
            out[rows] = sent.to(vectors)
        return out
