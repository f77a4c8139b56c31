"""The one local-training loop: every algorithm's clients train through :func:`local_train`.

The clients of a task train in lockstep on ``[C, P]`` parameters: at each local step the
oracle gives every client's gradient (one vmapped forward and one backward pass for row data;
hand-written, bit-identical passes for plain MLPs, :mod:`raysim.models.dense`),
a chain of client transforms turns it into an update, and each client still active moves by
its update; a client whose steps are done is masked out. A step may have several phases, each
with a fresh gradient on the same data at the parameters the previous phase left (Local FFGG
alternates a step on the personal part w and one on the global part θ).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raysim.algorithms.transforms import ClientTransform


@dataclass
class LocalResult:
    """The clients' parameters after local training, their mean loss over the steps they took
    (of each step's first phase) and those step counts."""

    params: torch.Tensor  # [C, P]
    loss: np.ndarray  # [C] float64
    steps: np.ndarray  # [C] int


def local_train(params: torch.Tensor, oracle, *phases: ClientTransform) -> LocalResult:
    """Run ``oracle.plan``'s local steps from ``params`` [C, P]; each step applies ``phases`` in turn."""
    plan = oracle.plan
    active = plan.active.to(device=params.device, dtype=params.dtype)
    # steps where every client moves skip the mask: x * 1 == x exactly, so the bits are the same
    everyone = plan.active.bool().all(1).tolist()
    states = [phase.init(params) for phase in phases]
    params = params.detach().clone()  # moved in place (the same bits as ``params - updates``): no step allocates it
    loss_sum = torch.zeros(params.shape[0], dtype=torch.float64, device=params.device)
    for s in range(plan.num_steps):
        for i, phase in enumerate(phases):
            grads, loss = oracle.gradient(params, s)
            if i == 0:
                loss_sum += loss.double() if everyone[s] else loss.double() * active[s]
            with torch.no_grad():
                updates, states[i] = phase.update(grads, states[i], params)
                params.sub_(updates if everyone[s] else updates * active[s][:, None])  # own copy: in place
    steps = torch.as_tensor(plan.steps, dtype=torch.float64, device=params.device)
    return LocalResult(params, (loss_sum / steps.clamp_min(1)).cpu().numpy(), plan.steps)
