"""The keys of the built-in algorithms (the ``algorithm:`` section of a scenario), declared once.

One dataclass per algorithm family, assembled from small groups: the client's local
steps (:class:`StepKeys`, :class:`MinibatchKeys`), the server learning rate and optimizer
(:class:`ServerLrKeys`, :class:`ServerKeys`) and the unit of step sizes on the quadratic
problem (:class:`QuadraticUnitKeys`). Each key carries its documentation, the values it
accepts and when it applies (see :mod:`raysim.schema`); a keys class may add a ``check``
of the whole scenario. Torch-free: scenarios are validated before torch loads.

A custom algorithm declares its own keys the same way, as its class attribute ``Keys``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np
from omegaconf import OmegaConf

from raysim.data.kinds import CLIENTS_FROM_FILES
from raysim.errors import ScenarioError
from raysim.algorithms.aggregator_catalog import RULES, using
from raysim.importing import import_callable
from raysim.robust_f import default_f, largest_f
from raysim.schema import (Check, closed_unit_interval, decay_factor, key, non_negative, non_negative_int, one_of,
                           open_unit_interval, positive, positive_int, unit_interval, when)
from raysim.system.config import byzantine_count

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi", "adagrad")
ADAPTIVE = ("adam", "yogi", "adagrad")
ROW_DATA = when("data.kind", "quadratic", negate=True)  # clients hold rows (minibatches exist)
betas = Check(lambda v: len(v) == 2 and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in v),
              "two numbers in [0, 1)")


@dataclass
class AlgorithmKeys:
    """Every algorithm has a name."""

    name: str = key("fedavg", "the algorithm: a built-in name (raysim list) or package.module:Class")

    @staticmethod
    def check(cfg) -> None:
        """Checks that involve several keys or sections (the scenario ``cfg``, values checked)."""

    @staticmethod
    def check_data(cfg, train_sizes) -> None:
        """Checks against the built data set (``train_sizes``: each client's training rows), before
        Ray starts; row data only."""


@dataclass
class StepKeys(AlgorithmKeys):
    """Local gradient steps on the client."""

    lr: float = key(0.05, "client learning rate", check=positive)
    lr_decay: float = key(1.0, "per-round decay of the local step size: a client that starts from server step t "
                               "(the round, in synchronous mode) steps with lr · lr_decay^t", check=decay_factor)
    local_steps: Optional[int] = key(None, "local steps per task (null: local_epochs passes over the rows)",
                                     check=positive_int)
    weight_decay: float = key(0.0, "L2 weight decay added to every local gradient", check=non_negative)
    max_grad_norm: Optional[float] = key(None, "clip each local gradient to this Euclidean norm (null: never)",
                                         check=positive)

    @staticmethod
    def check(cfg) -> None:
        if cfg.data.kind == "quadratic":
            require_local_steps(cfg, "its clients have no rows to make epochs of")


def batch_size_key():
    """The ``batch_size`` key (declared by the algorithms that take minibatches)."""
    return key(10, "client minibatch size (a client's last batch of an epoch may be shorter)", check=positive_int,
               when=ROW_DATA)


@dataclass
class MinibatchKeys(StepKeys):
    """Local minibatch SGD."""

    batch_size: int = batch_size_key()
    local_epochs: int = key(1, "passes over the client's training rows per task", check=positive_int,
                            when=(when("local_steps", None), ROW_DATA))


@dataclass
class ServerLrKeys:
    """A server learning rate."""

    server_lr: float = key(1.0, "server learning rate: θ ← θ − server_lr · (aggregated update, after the "
                                "server optimizer)", check=positive)


@dataclass
class ServerKeys(ServerLrKeys):
    """A server optimizer applied to the aggregated update (a pseudo-gradient)."""

    server_optimizer: str = key("sgd", "sgd | momentum (FedAvgM) | adam (FedAdam) | yogi (FedYogi) | adagrad "
                                       "(FedAdagrad)", check=one_of(*SERVER_OPTIMIZERS))
    server_momentum: float = key(0.9, "momentum β: m ← β·m + Δ", check=unit_interval,
                                 when=when("server_optimizer", "momentum"))
    server_nesterov: bool = key(False, "Nesterov momentum: step Δ + β·m", when=when("server_optimizer", "momentum"))
    server_betas: List[float] = key(doc="(β₁, β₂): first- and second-moment decay (adagrad uses β₁)",
                                    factory=lambda: [0.9, 0.99], check=betas,
                                    when=when("server_optimizer", *ADAPTIVE))
    server_eps: float = key(1e-3, "τ in step = m / (√v + τ); v starts at τ²", check=positive,
                            when=when("server_optimizer", *ADAPTIVE))
    server_bias_correction: bool = key(False, "divide m by 1 − β₁ᵗ (and v by 1 − β₂ᵗ for adam, yogi)",
                                       when=when("server_optimizer", *ADAPTIVE))


@dataclass
class QuadraticUnitKeys:
    """Step sizes in units of the quadratic problem's smoothness constants."""

    lr_unit: str = key("absolute", "absolute | inverse_smoothness (step sizes times 1/L, 1/L_w, 1/L_f of the "
                                   "quadratic problem)", check=one_of("absolute", "inverse_smoothness"),
                       when=when("data.kind", "quadratic"))


def _aggregator(*names: str, negate: bool = False):
    return when("aggregator", *names, negate=negate)


@dataclass
class AggregatorKeys:
    """How the server reduces a step's updates (a synchronous round, a FedBuff buffer): the plain
    mean or a robust rule, optionally on the means of random buckets of updates."""

    aggregator: str = key("mean", " | ".join(RULES) + " (raysim list), or package.module:function")
    bucket_size: int = key(1, "s: average random buckets of s updates, then aggregate the bucket means "
                              "(1: no bucketing)", check=positive_int, when=_aggregator("mean", negate=True))
    trim: float = key(0.1, "trimmed_mean: beta, the share of values dropped at each end of every coordinate",
                      check=Check(lambda v: 0 <= v < 0.5, "a share in [0, 0.5)"), when=_aggregator(*using("trim")))
    byzantine_f: Optional[int] = key(None, "krum, multi_krum, bulyan: f, the Byzantine inputs the rule guards "
                                           "against per step (null: the Byzantine share of the clients times the "
                                           "step's updates, rounded down; with bucketing each may spoil a bucket)",
                                     check=non_negative_int,
                                     when=_aggregator(*using("byzantine_f")))  # may exceed Krum's n > 2f + 2
    krum_m: Optional[int] = key(None, "multi_krum: m, the best-scored inputs averaged (null: n - f)",
                                check=positive_int, when=_aggregator(*using("krum_m")))
    gm_nu: float = key(1e-6, "geometric_median: nu, the smoothing of Weiszfeld's weights 1/max(nu, distance)",
                       check=positive, when=_aggregator(*using("gm_nu")))
    gm_iterations: int = key(10, "geometric_median: Weiszfeld iterations at most", check=positive_int,
                             when=_aggregator(*using("gm_iterations")))
    clip_radius: float = key(1.0, "centered_clipping: tau, the clipping radius around the previous aggregate",
                             check=positive, when=_aggregator(*using("clip_radius")))
    clip_iterations: int = key(1, "centered_clipping: clipping iterations per step", check=positive_int,
                               when=_aggregator(*using("clip_iterations")))
    client_momentum: float = key(0.0, "beta: each client sends its momentum m <- beta*m + (1 - beta)*update (m "
                                      "kept per client from 0, as Karimireddy et al. pair with centered clipping); "
                                      "0: the update itself", check=unit_interval)
    aggregator_options: Dict[str, Any] = key(doc="a custom aggregator's keyword arguments", factory=dict,
                                             when=_aggregator(*RULES, negate=True))


def check_aggregator(cfg, num_clients: int) -> None:
    """The aggregator exists; the median, trimmed mean and geometric median have two inputs or more
    in a full step (``clients_per_round`` updates, or ``buffer_size`` under FedBuff, divided into
    buckets), and Krum, multi-Krum and Bulyan enough for their f and m, of a population of
    ``num_clients``."""
    a, e, b = cfg.algorithm, cfg.execution, cfg.system.byzantine
    if ":" in a.aggregator:
        import_callable("algorithm.aggregator", a.aggregator, "an aggregator function",  # as the server step calls it
                        "a function (updates, weights, **algorithm.aggregator_options)", None, None,
                        **dict(a.aggregator_options or {}))
        return
    if a.aggregator not in RULES:
        raise ScenarioError("algorithm.aggregator", a.aggregator,
                            "one of " + ", ".join(sorted(RULES)) + ", or package.module:function")
    rule = RULES[a.aggregator]
    least = rule.least_inputs
    if not least:
        return
    if e.mode == "sync":
        updates, where = e.clients_per_round, f"execution.clients_per_round={e.clients_per_round}"
    elif e.aggregation == "fedbuff":
        updates, where = e.buffer_size, f"execution.buffer_size={e.buffer_size}"
    else:
        updates, where = 1, "execution.aggregation=fedasync: one update per step"
    n = -(-updates // a.bucket_size)
    if a.bucket_size > 1:
        where += f" in buckets of algorithm.bucket_size={a.bucket_size}"
    if n < least:
        raise ScenarioError("algorithm.aggregator", a.aggregator, f"a rule other than {a.aggregator} for steps of "
                                                                  f"n={n} inputs ({where}): it needs at least {least}")
    if not rule.takes_f:
        return
    if a.byzantine_f is not None:
        key_f, f, value, derived = "algorithm.byzantine_f", a.byzantine_f, a.byzantine_f, ""
    else:
        share = byzantine_count(b, num_clients) / num_clients
        f = default_f(share, updates)
        key_f = "system.byzantine.clients" if b.clients is not None else "system.byzantine.fraction"
        value = list(b.clients) if b.clients is not None else b.fraction
        derived = f" (f = {f}, the Byzantine updates of a step of {updates}; or set algorithm.byzantine_f)"
    most = largest_f(a.aggregator, n)
    if f > most:
        needs = "it needs n >= 4f + 3" if a.aggregator == "bulyan" else "n - f leaves fewer than three candidates"
        raise ScenarioError(key_f, value, f"at most f = {most} for {a.aggregator} with n={n} inputs ({where}): "
                                          f"{needs}{derived}")
    if a.aggregator == "multi_krum" and a.krum_m is not None and a.krum_m > n - f:
        raise ScenarioError("algorithm.krum_m", a.krum_m, f"at most n - f = {n - f} (n={n} inputs: {where}; f={f})")


@dataclass
class FedAvgKeys(AggregatorKeys, ServerKeys, MinibatchKeys):
    """FedAvg: local minibatch SGD, weighted averaging, then any server optimizer (server_optimizer)."""


def fixed_optimizer(name: str, algorithm: str):
    """The ``server_optimizer`` key of an algorithm that is FedAvg with the optimizer ``name``."""
    return key(name, f"{name} (what makes FedAvg {algorithm}; for another optimizer use algorithm.name=fedavg)",
               check=one_of(name))


@dataclass
class FedAvgMKeys(FedAvgKeys):
    """FedAvgM: FedAvg with server momentum."""

    server_optimizer: str = fixed_optimizer("momentum", "FedAvgM")


@dataclass
class FedAdamKeys(FedAvgKeys):
    """FedAdam: FedAvg with the Adam server optimizer."""

    server_optimizer: str = fixed_optimizer("adam", "FedAdam")
    server_lr: float = key(0.01, "server learning rate η of the adaptive step", check=positive)


@dataclass
class FedYogiKeys(FedAdamKeys):
    """FedYogi: FedAvg with the Yogi server optimizer."""

    server_optimizer: str = fixed_optimizer("yogi", "FedYogi")


@dataclass
class FedAdagradKeys(FedAdamKeys):
    """FedAdagrad: FedAvg with the Adagrad server optimizer."""

    server_optimizer: str = fixed_optimizer("adagrad", "FedAdagrad")


@dataclass
class FedProxKeys(FedAvgKeys):
    """FedProx: FedAvg plus a proximal term toward the model the client received."""

    prox_mu: float = key(0.01, "μ of the proximal term (μ/2)‖v − θ‖² added to the local loss", check=non_negative)


@dataclass
class LocalGDKeys(AggregatorKeys, QuadraticUnitKeys, ServerKeys, StepKeys):
    """Local GD: full-batch gradient steps."""

    @staticmethod
    def check(cfg) -> None:
        require_local_steps(cfg, "Local GD takes full-batch steps, it has no epochs")


@dataclass
class ScaffoldKeys(QuadraticUnitKeys, FedAvgKeys):
    """SCAFFOLD: control variates kept per client."""


@dataclass
class FedDynKeys(ServerLrKeys, MinibatchKeys):
    """FedDyn: a dynamic regulariser kept per client and on the server."""

    dyn_alpha: float = key(0.01, "α: local loss − ⟨g_i, v⟩ + (α/2)‖v − θ‖²; server θ = mean(v) − h/α",
                           check=positive)


@dataclass
class FedACGKeys(AggregatorKeys, ServerLrKeys, MinibatchKeys):
    """FedACG: server momentum, a lookahead broadcast and a proximal pull toward it."""

    acg_lambda: float = key(0.85, "λ: server momentum m ← λ·m + Δ (Δ: the broadcast model minus the client's) "
                                  "and the lookahead Φ = θ − server_lr·λ·m sent to clients", check=unit_interval)
    acg_beta: float = key(0.01, "β of the proximal term (β/2)‖v − Φ‖²", check=non_negative)
    acg_lookahead: bool = key(True, "send Φ (false: send θ; the paper's ablation without the accelerated start)")


@dataclass
class FFGGKeys(AggregatorKeys, QuadraticUnitKeys, ServerKeys, MinibatchKeys):
    """FFGG: fine-tune the personal part, send the partial gradient of the global part."""

    personal_lr: Optional[float] = key(None, "γ_w, the step on the personal part (null: lr)", check=positive)
    finetuner: str = key("sgd", "sgd (local_steps or local_epochs of steps on w) | cg (local_steps conjugate-"
                                "gradient iterations) | exact (closed form); cg, exact: quadratic data",
                         check=one_of("sgd", "cg", "exact"))

    @staticmethod
    def check(cfg) -> None:
        FFGGKeys.check_split(cfg)
        a = cfg.algorithm
        if a.finetuner in ("cg", "exact"):
            refuse_step_transforms(cfg, f"algorithm.finetuner={a.finetuner}: FFGG then takes no local step (w is "
                                        "solved for, θ's gradient is exact)")

    @staticmethod
    def check_split(cfg) -> None:
        """The model's split, the fine-tuner and the local step count fit the data (FFGG and Local FFGG)."""
        a, m = cfg.algorithm, cfg.model
        quadratic = cfg.data.kind == "quadratic"
        personal = m.personal if isinstance(m.personal, str) else list(m.personal)
        if quadratic and personal != ["w"]:
            raise ScenarioError("model.personal", personal, f"[w] for algorithm.name={a.name} on data.kind=quadratic "
                                                            "(w is that problem's personal part)")
        if personal == "none":
            raise ScenarioError("model.personal", personal, f"a split with personal parameters for algorithm.name="
                                                            f"{a.name}: input_layer, output_layer, adapter or name patterns")
        if a.finetuner in ("cg", "exact") and not quadratic:
            raise ScenarioError("algorithm.finetuner", a.finetuner, "sgd unless data.kind=quadratic")
        if quadratic and a.finetuner != "exact":
            require_local_steps(cfg, "its clients have no rows to make epochs of")


@dataclass
class LocalFFGGKeys(FFGGKeys):
    """Local FFGG: alternating local steps on w and θ, after optional FedAvg pre-training."""

    pretrain_rounds: int = key(0, "the first rounds are FedAvg on the whole model", check=non_negative_int)
    pretrain_lr: Optional[float] = key(None, "client lr of the pre-training rounds (null: lr)", check=positive,
                                       when=when("pretrain_rounds", 0, negate=True))

    @staticmethod
    def check(cfg) -> None:
        FFGGKeys.check_split(cfg)  # a solved w is followed by local steps: their transforms apply
        if cfg.data.kind == "quadratic":
            require_local_steps(cfg, "its alternating steps on w and θ need a count")
        rounds, e = cfg.algorithm.pretrain_rounds, cfg.execution
        if rounds:
            if cfg.data.kind == "quadratic":
                raise ScenarioError("algorithm.pretrain_rounds", rounds, "0 with data.kind=quadratic "
                                                                         "(FedAvg pre-training needs rows)")
            if e.mode != "sync":
                raise ScenarioError("algorithm.pretrain_rounds", rounds, "0 in execution.mode=async")
            if rounds >= e.rounds:
                raise ScenarioError("algorithm.pretrain_rounds", rounds,
                                    f"fewer than execution.rounds={e.rounds} (they are part of them)")


@dataclass
class L2GDKeys(QuadraticUnitKeys, StepKeys):
    """L2GD: a model per client pulled toward their mean; each round's numbers of averaging and
    local steps are drawn with p."""

    local_steps: Optional[int] = key(None, "sets p = 1/local_steps when average_prob is null", check=positive_int,
                                     when=when("average_prob", None))
    batch_size: int = batch_size_key()
    penalty: float = key(0.1, "λ of the penalty (λ/2)·Σ‖x_m − x̄‖²", check=positive)
    average_prob: Optional[float] = key(None, "p, the chance that a step averages (null: 1/local_steps)",
                                        check=open_unit_interval)

    @staticmethod
    def check(cfg) -> None:
        a, e, d = cfg.algorithm, cfg.execution, cfg.data
        if a.average_prob is None:
            require_local_steps(cfg, "p defaults to 1/local_steps")
        if e.mode != "sync":
            raise ScenarioError("execution.mode", e.mode, "sync for algorithm.name=l2gd")
        if d.kind not in CLIENTS_FROM_FILES and e.clients_per_round != d.num_clients:
            raise ScenarioError("execution.clients_per_round", e.clients_per_round,
                                f"data.num_clients={d.num_clients} for algorithm.name=l2gd (full participation)")


@dataclass
class DittoKeys(FedAvgKeys):
    """Ditto: FedAvg for the global model, and a personal model per client pulled toward it by λ."""

    ditto_lambda: float = key(0.1, "λ: each personal step descends F_k(v) + (λ/2)‖v − w‖², w the global model the "
                                   "client received (0: personal models trained alone, from w)", check=non_negative)
    personal_lr: Optional[float] = key(None, "η_p, the step size of the personal steps (null: lr); also the default "
                                             "step of personalized evaluation", check=positive)
    personal_steps: Optional[int] = key(None, "personal steps per visit (null: as many as the global update takes: "
                                              "local_steps, or local_epochs passes)", check=positive_int)

    @staticmethod
    def check(cfg) -> None:
        whole_model_personalization(cfg)


@dataclass
class APFLKeys(FedAvgKeys):
    """APFL: FedAvg for the global model w, and per client a local model v mixed with w by a learned weight α."""

    apfl_alpha: float = key(0.25, "α's value at a client's first visit: its personalized model is α·v + (1 − α)·w",
                            check=closed_unit_interval)
    adaptive_alpha: bool = key(True, "learn each client's α by gradient steps on its loss (false: α stays apfl_alpha)")
    alpha_lr: Optional[float] = key(None, "η_α, the step size of α's steps (null: lr)", check=positive,
                                    when=when("adaptive_alpha", True))

    @staticmethod
    def check(cfg) -> None:
        whole_model_personalization(cfg)


@dataclass
class PFedMeKeys(FedAvgKeys):
    """pFedMe: local steps along the Moreau envelope's gradient λ(w − θ̃), θ̃ each client's personal model."""

    server_lr: float = key(1.0, "β: the server moves w ← (1 − β)·w + β·(mean of the clients' local models), i.e. "
                                "w ← w − β·(aggregated update) after the server optimizer", check=positive)
    pfedme_lambda: float = key(15.0, "λ: the personal model θ̃ minimises f(θ; batch) + (λ/2)‖θ − w‖², w the "
                                     "client's local model; the local step is w ← w − lr·λ(w − θ̃)", check=positive)
    inner_steps: int = key(5, "K, gradient steps of the personal problem per local step (on its one minibatch)",
                           check=positive_int)
    personal_lr: float = key(0.1, "the step size of the K inner steps; also the default step of personalized "
                                  "evaluation", check=positive)

    @staticmethod
    def check(cfg) -> None:
        whole_model_personalization(cfg)
        a = cfg.algorithm
        if a.lr * a.pfedme_lambda > 1:
            raise ScenarioError("algorithm.lr", a.lr, f"at most 1/pfedme_lambda = {1 / a.pfedme_lambda:g} for "
                                                      "algorithm.name=pfedme (a local step w ← w − lr·λ(w − θ̃) "
                                                      "past the personal model θ̃)")


def _needs_rows(cfg) -> None:
    """A personalization baseline's personal models are judged by personalized evaluation, which
    the quadratic problem does not have."""
    if cfg.data.kind == "quadratic":
        raise ScenarioError("data.kind", "quadratic", f"a data set of rows for algorithm.name={cfg.algorithm.name} "
                                                      "(its personal models are judged by personalized evaluation, "
                                                      "which the quadratic problem does not have)")


def whole_model_personalization(cfg) -> None:
    """An algorithm whose clients keep whole models of their own (Ditto, APFL, pFedMe, local-only) needs row data, whose
    personalized evaluation tests those models, and no personal split of the model."""
    a, m = cfg.algorithm, cfg.model
    _needs_rows(cfg)
    personal = m.personal if isinstance(m.personal, str) else list(m.personal)
    if personal != "none":
        raise ScenarioError("model.personal", personal, f"none for algorithm.name={a.name} (each client's personal "
                                                        "model is a whole model)")


@dataclass
class FedPerKeys(FedAvgKeys):
    """FedPer: the whole model trained locally; the shared part's update averaged, the personal part (model.personal)
    kept by each client."""

    @staticmethod
    def check(cfg) -> None:
        kept_personal_part(cfg)


@dataclass
class FedRepKeys(FedAvgKeys):
    """FedRep: the personal head (model.personal) trained first with the body fixed, then the body with the head
    fixed; the body's update averaged, the head kept by each client."""

    head_lr: Optional[float] = key(None, "step size of the head steps (null: lr); also the default step of "
                                         "personalized evaluation", check=positive)
    head_steps: Optional[int] = key(None, "τ_h, head steps per visit, before the body's (null: head_epochs passes "
                                          "over the rows)", check=positive_int)
    head_epochs: int = key(1, "passes over the client's training rows that train the head", check=positive_int,
                           when=(when("head_steps", None), ROW_DATA))

    @staticmethod
    def check(cfg) -> None:
        kept_personal_part(cfg)


@dataclass
class FedBNKeys(FedAvgKeys):
    """FedBN: FedAvg whose normalization layers' weights and biases (model.personal: normalization) stay on each
    client and are never averaged."""

    @staticmethod
    def check(cfg) -> None:
        personal = cfg.model.personal
        if not isinstance(personal, str) or personal != "normalization":
            raise ScenarioError("model.personal", personal if isinstance(personal, str) else list(personal),
                                "normalization for algorithm.name=fedbn (its clients keep their normalization "
                                "layers: BatchNorm, GroupNorm, LayerNorm)")
        kept_personal_part(cfg)


@dataclass
class LGFedAvgKeys(FedAvgKeys):
    """LG-FedAvg: FedAvg whose local representation (model.personal: input_layer, or name patterns of the input
    side) stays on each client; the layers above it are averaged."""

    @staticmethod
    def check(cfg) -> None:
        personal = cfg.model.personal
        if isinstance(personal, str) and personal != "input_layer":
            raise ScenarioError("model.personal", personal, "input_layer, or a list of parameter-name patterns of "
                                                            "the input-side layers, for algorithm.name=lg_fedavg "
                                                            "(each client keeps its local representation)")
        kept_personal_part(cfg)


def kept_personal_part(cfg) -> None:
    """An algorithm whose clients keep the model's personal part between visits (FedPer, FedRep, FedBN,
    LG-FedAvg) needs row data (personalized evaluation tests each client's model), a personal split and
    ``model.personal_state: stateful``."""
    a, m = cfg.algorithm, cfg.model
    _needs_rows(cfg)
    personal = m.personal if isinstance(m.personal, str) else list(m.personal)
    if personal == "none":
        raise ScenarioError("model.personal", personal, f"a split with personal parameters for algorithm.name={a.name}"
                                                        ": output_layer (a personal head), input_layer, adapter or "
                                                        "name patterns")
    if m.personal_state != "stateful":
        raise ScenarioError("model.personal_state", m.personal_state, f"stateful for algorithm.name={a.name} (each "
                                                                      "client keeps its personal part between visits)")


@dataclass
class LocalOnlyKeys(MinibatchKeys):
    """Local-only training: each client trains a model of its own and never communicates (the reference point
    without federation)."""

    @staticmethod
    def check(cfg) -> None:
        whole_model_personalization(cfg)
        p, c, b = cfg.privacy, cfg.communication, cfg.system.byzantine
        for name, value, idle in (("privacy.mechanism", p.mechanism, "none"),
                                  ("communication.uplink.kind", c.uplink.kind, "none"),
                                  ("communication.secure_aggregation.protocol", c.secure_aggregation.protocol, "none"),
                                  ("system.byzantine.fraction", b.fraction, 0.0),
                                  ("system.byzantine.clients", None if b.clients is None else list(b.clients), None)):
            if value != idle:
                raise ScenarioError(name, value, f"{json.dumps(idle)} with algorithm.name={cfg.algorithm.name} (its "
                                                 "clients send nothing)")


PERFEDAVG_VARIANTS = ("fo", "hf", "hvp")


@dataclass
class PerFedAvgKeys(AggregatorKeys, StepKeys):
    """Per-FedAvg: local steps on the one-step-adapted loss f(v − α∇f(v)); variants fo, hf, hvp."""

    lr: float = key(0.001, "β, the local (outer) step size", check=positive)
    local_steps: int = key(10, "τ, local meta-steps per task", check=positive_int)
    variant: str = key("hf", "fo (first order: step along ∇f(ŵ)) | hf (Hessian-free: a central difference "
                             "of gradients for the Hessian term) | hvp (exact Hessian-vector product)",
                       check=one_of(*PERFEDAVG_VARIANTS))
    inner_lr: float = key(0.01, "α, the adaptation step ŵ = v − α∇f(v); also the default step of "
                                "personalized evaluation", check=non_negative)
    batch_size: int = key(10, "D, the batch of the adaptation gradient ∇f(v; S)", check=positive_int, when=ROW_DATA)
    outer_batch_size: Optional[int] = key(None, "D′, the batch of the gradient at the adapted point (null: "
                                                "batch_size)", check=positive_int, when=ROW_DATA)
    hessian_batch_size: Optional[int] = key(None, "D″, the batch of the Hessian term (null: outer_batch_size)",
                                            check=positive_int, when=(ROW_DATA, when("variant", "hf", "hvp")))
    hessian_delta: float = key(1e-3, "δ of the central difference [∇f(v + δu) − ∇f(v − δu)] / 2δ",
                               check=positive, when=when("variant", "hf"))

    @staticmethod
    def check_data(cfg, train_sizes) -> None:
        fewest = int(np.argmin(train_sizes))  # the first client with the fewest training rows
        for name, size in perfedavg_batches(cfg.algorithm).items():
            if train_sizes[fewest] < size:
                short = int((train_sizes < size).sum())
                raise ScenarioError(f"algorithm.{name}", size, f"at most {int(train_sizes[fewest])}, the training rows of client "
                                                f"{fewest} ({short} of {len(train_sizes)} clients have fewer than "
                                                f"{size})")


def perfedavg_batches(a) -> dict:
    """Per-FedAvg's batch sizes by key (``a``: its keys): D, D′ (null: D) and, unless the variant
    is fo, D″ (null: D′)."""
    outer = a.outer_batch_size or a.batch_size
    batches = {"batch_size": a.batch_size, "outer_batch_size": outer}
    if a.variant != "fo":
        batches["hessian_batch_size"] = a.hessian_batch_size or outer
    return batches


def refuse_step_transforms(cfg, why: str) -> None:
    """An algorithm that takes no local step here (``why``) refuses what would act on local steps:
    weight decay, clipping and the unreliable-agent model's coins, step counts and noise."""
    a, u = cfg.algorithm, cfg.system.unreliable
    p = u.participation
    for name, value, idle in (("algorithm.weight_decay", a.weight_decay, 0.0),
                              ("algorithm.max_grad_norm", a.max_grad_norm, None),
                              ("system.unreliable.participation.kind", p.kind, "constant"),
                              ("system.unreliable.participation.value", p.value if p.kind == "constant" else 1.0, 1.0),
                              ("system.unreliable.local_steps", u.local_steps, None),
                              ("system.unreliable.gradient_noise", u.gradient_noise, "none"),
                              ("system.unreliable.normalize_steps", u.normalize_steps, False)):
        if value != idle:
            raise ScenarioError(name, OmegaConf.to_container(value) if OmegaConf.is_config(value) else value,
                                f"{json.dumps(idle)} with {why}")


def require_local_steps(cfg, why: str) -> None:
    """``algorithm.local_steps`` must be set (``why`` says why)."""
    if cfg.algorithm.local_steps is None:
        raise ScenarioError("algorithm.local_steps", None,
                            f"a positive integer for algorithm.name={cfg.algorithm.name} "
                            f"on data.kind={cfg.data.kind} ({why})")
