"""FedPer, FedRep, FedBN and LG-FedAvg: a shared body averaged by the server, a personal part kept by
each client.

FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization
Layers", 2019) trains body and head together on the client; FedRep (Collins, Hassani,
Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized Federated Learning",
ICML 2021) first trains the head with the body fixed, then the body with the head fixed. Both
send the body's update only and keep the head (kept state ``head``). The split is the model's
(``model.personal``: the head is ``output_layer``). FedBN and LG-FedAvg are FedPer's rule on
their own splits: the normalization layers (FedBN), the input-side representation (LG-FedAvg).
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.base import Algorithm
from raysim.algorithms.context import ClientContext
from raysim.algorithms.keys import FedBNKeys, FedPerKeys, FedRepKeys, LGFedAvgKeys
from raysim.algorithms.local import LocalResult, local_train
from raysim.algorithms.updates import ClientTests, ClientUpdates
from raysim.models.split import init_personal


class FedPer(Algorithm):
    """FedPer. Client k: the received body θ with its kept head h_k (on a first visit, a head from
    ``model.personal_init``), ``local_steps`` or ``local_epochs`` of minibatch SGD at ``lr`` on
    both; it sends the body's Δ = θ − θ_k and keeps the new h_k. Server: θ ← θ − server_lr·Σ p_k Δ_k
    over the body's entries, through any aggregator and server optimizer. Personalized evaluation
    tests each client's θ with its own head (a fresh one for a client never sampled), after
    ``eval.personalized_steps`` on the head alone (0: as it is)."""

    Keys = FedPerKeys
    personalised = True
    stateful = True
    personal_models = True

    def head_lr(self) -> float:
        return self.cfg.lr

    def adaptation_lr(self) -> float:
        return self.head_lr()

    def start_personal(self, ctx: ClientContext, start: torch.Tensor) -> torch.Tensor:
        """[C, P]: the payload's body with each client's kept head (a fresh one on a first visit)."""
        model = ctx.model
        fresh = init_personal(model, model.personal, start[0], ctx.rngs, self.env.model_cfg.personal_init).to(start)
        params = start.clone()
        idx = model.personal_index.to(start.device)
        params[:, idx] = ctx.kept("head", fresh[:, idx])
        return params

    def train(self, ctx: ClientContext, params: torch.Tensor) -> LocalResult:
        """Local training from ``params`` [C, P]: body and head together."""
        cfg = self.cfg
        plan = ctx.plan_from(cfg)
        step = ctx.transform(plan, self.local_lr(), weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)
        return local_train(params, ctx.oracle(plan), step)

    def client_update(self, payloads: list, ctx: ClientContext) -> ClientUpdates:
        start = ctx.start(payloads)
        result = self.train(ctx, self.start_personal(ctx, start))
        body = ctx.model.global_index.to(start.device)
        head = ctx.model.personal_index.to(start.device)
        return ctx.updates(result, (start - result.params)[:, body], states={"head": result.params[:, head]})

    def personalize(self, payloads: list, ctx: ClientContext, steps: int, epochs: int, lr: float,
                    adapt_on: str = "train") -> ClientTests:
        """Test each client's body and kept head (a fresh head where it has none), after ``steps``
        or ``epochs`` of SGD on the head alone (none when both are 0)."""
        start = self.start_personal(ctx, ctx.start(payloads))
        return self.finetune_and_test(ctx, start, steps, epochs, lr, only=ctx.model.personal, adapt_on=adapt_on)


class FedRep(FedPer):
    """FedRep. Client k: from the received body θ and its kept head h_k (a fresh head from
    ``model.personal_init`` on a first visit), τ_h = ``head_steps`` steps (or ``head_epochs``
    passes) of SGD on the head alone at ``head_lr`` (null: ``lr``), then ``local_steps`` (or
    ``local_epochs`` passes) on the body alone at ``lr`` with the new head fixed, on fresh
    minibatches; it sends the body's Δ = θ − θ_k and keeps h_k. The unreliable-agent model's
    δ_k coins scale the body's steps only (the update sent); its E_k sets both counts. Server
    and evaluation as FedPer's."""

    Keys = FedRepKeys

    def head_lr(self) -> float:
        return self.cfg.head_lr or self.cfg.lr

    def train(self, ctx: ClientContext, params: torch.Tensor) -> LocalResult:
        """The head's steps with the body fixed, then the body's with the head fixed."""
        cfg = self.cfg
        head = ctx.model.personal
        plan = ctx.plan(cfg.head_steps, cfg.batch_size, cfg.head_epochs, coins=False)
        step = ctx.transform(plan, self.head_lr(), weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                             only=head)
        params = local_train(params, ctx.oracle(plan), step).params
        plan = ctx.plan_from(cfg)
        step = ctx.transform(plan, self.local_lr(), weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                             only=~head)
        return local_train(params, ctx.oracle(plan), step)

    def work(self, sizes: np.ndarray, client_steps: np.ndarray, payload: dict) -> np.ndarray:
        """The body's steps' samples plus the head's."""
        steps = self.cfg.head_steps
        per_step = np.minimum(self.cfg.batch_size, sizes)
        head = np.where(client_steps > 0, client_steps * per_step,
                        self.cfg.head_epochs * sizes if steps is None else steps * per_step)
        return self.local_samples(sizes, client_steps) + head.astype(np.float64)


class FedBN(FedPer):
    """FedBN (Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local
    Batch Normalization", ICLR 2021): FedPer's rule with ``model.personal: normalization``. Client k
    trains the whole model from the received θ with its kept normalization weights and biases (on a
    first visit, the initial model's: the server never moves them), sends the update of every other
    entry and keeps its own normalization layers; the server averages the rest as FedAvg does."""

    Keys = FedBNKeys


class LGFedAvg(FedPer):
    """LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, "Think Locally,
    Act Globally: Federated Learning with Local and Global Representations", 2020): FedPer's rule
    with the personal part on the input side (``model.personal: input_layer`` or name patterns):
    each client keeps its local representation, and the layers above it are averaged."""

    Keys = LGFedAvgKeys
