"""The scenario's schema: every key of a scenario, its type, default, documentation, the values it
accepts and when it applies (dataclasses of :func:`raysim.schema.key`), section by section.

A scenario is a YAML file whose top-level keys are exactly ``name``, ``seed``, ``data``, ``model``,
``algorithm``, ``execution``, ``system``, ``privacy``, ``communication``, ``runtime``, ``eval`` and
``output``; the ``algorithm``
section's schema is the keys dataclass of the algorithm it names (:mod:`raysim.algorithms.keys`).
Importing this module loads no data loader, no torch and no pyarrow.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from raysim.data.kinds import CLIENTS_FROM_FILES, DATA_FILES, GENERATED, PARTITIONED_FILES
from raysim.schema import Check, Rule, key, non_negative, non_negative_int, one_of, positive, positive_int, when
from raysim.communication.config import CommunicationConfig
from raysim.privacy.config import PrivacyConfig
from raysim.system.config import SystemConfig

DIGITS, QUADRATIC, LEAF, PARQUET, BLOBS, SADDLE = (when("data.kind", k) for k in
                                                   ("digits", "quadratic", "leaf_synthetic", "parquet", "blobs",
                                                    "saddle"))
SPLIT_KINDS = ("digits", "blobs", *PARTITIONED_FILES)  # centralized data sets that data.partition splits
SPLIT = when("data.kind", *SPLIT_KINDS)
ON_DEMAND = when("data.kind", *GENERATED, "quadratic")  # generated kinds: a client's data can be built where it trains
SYNC, ASYNC = when("execution.mode", "sync"), when("execution.mode", "async")
EMBEDDED = when("runtime.address", None)  # a cluster joined at runtime.address declares its own resources
ON_RAY = when("runtime.backend", "ray")  # keys of Ray's actors and cluster, which the local backend does without
MAX_TORCH_THREADS = 1024  # far more threads than cores stalls torch's first parallel operation


def _partition(*kinds: str):
    return when("data.partition.kind", *kinds)


@dataclass
class PartitionConfig:
    """How a centralized data set (digits, blobs, and the image files: SPLIT_KINDS) is split across clients."""

    kind: str = key("iid", "iid | dirichlet | balanced_dirichlet | shards | pathological (raysim list: partitioners)")
    alpha: float = key(0.5, "dirichlet, balanced_dirichlet: concentration of the Dirichlet(alpha) class proportions "
                            "(smaller: more label skew)", check=positive,
                       when=_partition("dirichlet", "balanced_dirichlet"))
    min_size: Optional[int] = key(None, "dirichlet: every client first takes this many samples drawn at random, "
                                        "the rest are split by Dirichlet(alpha) (null: the proportions are "
                                        "redrawn until every client has a sample)", check=positive_int,
                                  when=_partition("dirichlet"))
    shards_per_client: int = key(2, "shards: label-sorted shards per client", check=positive_int,
                                 when=_partition("shards"))
    per_class: int = key(10, "pathological: train images per class, a", check=positive_int,
                         when=_partition("pathological"))
    test_per_class: int = key(4, "pathological: test images per class", check=non_negative_int,
                              when=_partition("pathological"))
    diff_hetero: bool = key(False, "pathological: the second half of the clients keep only their class from 5-9",
                            when=_partition("pathological"))


@dataclass
class DataConfig:
    """The federated data set."""

    kind: str = key("gaussian_mixture", "the data set: a built-in kind (raysim list: datasets) or "
                                        "package.module:function")
    num_clients: int = key(100, "clients to generate or split into (parquet, leaf: the files decide)",
                           when=when("data.kind", *CLIENTS_FROM_FILES, negate=True))
    n: int = key(10000, "quadratic: rows of each client's matrices", check=positive_int, when=QUADRATIC)
    d_theta: int = key(100, "quadratic: size of the global part θ", check=positive_int, when=QUADRATIC)
    d_w: int = key(50, "quadratic: size of the personal part w", check=positive_int, when=QUADRATIC)
    realizable: bool = key(False, "quadratic: targets from a planted (θ, w_m)", when=QUADRATIC)
    feature_shift: bool = key(False, "digits: per-client pixel gain, offset and translation", when=DIGITS)
    concept_shift: bool = key(False, "digits: per-client permutation of the labels", when=DIGITS)
    alpha: float = key(1.0, "leaf_synthetic: model heterogeneity (standard deviation of u_k)", when=LEAF)
    beta: float = key(1.0, "leaf_synthetic: data heterogeneity (standard deviation of B_k)", when=LEAF)
    iid: bool = key(False, "leaf_synthetic: the IID variant (one W, b for every client; x centred on B_k)",
                    when=LEAF)
    test_fraction: float = key(0.2, "share of each client's rows held out for testing (gaussian_mixture always "
                                    "holds out 10 rows, quadratic none; leaf and parquet only without their own "
                                    "split)", when=when("data.kind", "gaussian_mixture", "quadratic", negate=True))
    partition: PartitionConfig = key(doc="digits, blobs, mnist, fashion_mnist, cifar10, cifar100: the split across "
                                         "clients", factory=PartitionConfig, when=SPLIT)
    num_samples: int = key(20000, "blobs: samples in the centralized set", when=BLOBS)
    num_features: int = key(64, "blobs: features per sample", when=BLOBS)
    num_classes: int = key(10, "blobs, synthetic_images: classes", when=when("data.kind", "blobs", "synthetic_images"))
    path: Optional[str] = key(None, "parquet: file or directory; leaf: a JSON file, a directory of them, or one "
                                    "with train/ and test/ of them; mnist, fashion_mnist, cifar10, cifar100: the "
                                    "directory of their files", when=when("data.kind", *DATA_FILES))
    label_column: str = key("label", "parquet: the label column", when=PARQUET)
    client_column: str = key("client_id", "parquet: the client column", when=PARQUET)
    feature_columns: Optional[List[str]] = key(None, "parquet: feature columns (null: all others)", when=PARQUET)
    image_shape: Optional[List[int]] = key(None, "parquet: the shape of one image (cnn); synthetic_images: [channels, "
                                                 "height, width] (null: 3x32x32)",
                                           when=when("data.kind", "parquet", "synthetic_images"))
    samples_per_client: int = key(200, "saddle, synthetic_images: training rows per client", check=positive_int,
                                  when=when("data.kind", "saddle", "synthetic_images"))
    dim: int = key(1, "saddle: dimension d of the features h (the bilinear model then has d + d² parameters)",
                   check=positive_int, when=SADDLE)
    on_demand: Any = key("auto", "generated data (gaussian_mixture, leaf_synthetic, saddle, synthetic_images, "
                                 "quadratic): build a client's data where and when it trains (true), every client's "
                                 "up front in one shared table (false), or on demand when that table would exceed "
                                 "1 GiB (auto); results are the same either way",
                         check=Check(lambda v: v is True or v is False or v == "auto", "true, false or auto"),
                         when=ON_DEMAND)
    cache_mb: float = key(128.0, "on-demand data: megabytes of built client data each process keeps for the "
                                 "clients it saw last", check=non_negative, when=ON_DEMAND)
    options: Dict[str, Any] = key(doc="a custom data.kind's keyword arguments", factory=dict)


@dataclass
class ModelConfig:
    """The model trained by every client (deterministic init from ``seed``)."""

    kind: str = key("mlp", "logreg | mlp | cnn | quadratic | bilinear | char_lstm | femnist_cnn | resnet18_gn | bn_cnn, or "
                           "package.module:function")
    hidden: List[int] = key(doc="mlp hidden sizes", factory=lambda: [64], when=when("kind", "mlp"))
    activation: str = key("relu", "mlp: relu | elu | tanh | sigmoid", when=when("kind", "mlp"))
    channels: List[int] = key(doc="cnn conv channels", factory=lambda: [16, 32], when=when("kind", "cnn"))
    init_scale: float = key(1e-3, "bilinear: every initial parameter is init_scale·N(0, 1) (0: exactly at the "
                                  "saddle, the origin)", check=non_negative, when=when("kind", "bilinear"))
    personal: Any = key("none", "the personal part w (the rest is the global θ): none | input_layer | output_layer | "
                                "adapter | normalization | a list of parameter-name patterns")
    adapter_rank: int = key(4, "adapter: rank of each LoRA pair", check=positive_int, when=when("personal", "adapter"))
    adapter_layers: Optional[List[str]] = key(None, "adapter: Linear module names (null: all but the output layer)",
                                              when=when("personal", "adapter"))
    personal_init: str = key("random", "w at each client visit: random (the layer's initialization) | zero | global "
                                       "(the server copy's values)")
    personal_state: str = key("stateless", "stateless | stateful (each client keeps its w between visits)")
    options: Dict[str, Any] = key(doc="a custom model.kind's keyword arguments", factory=dict)


@dataclass
class StalenessConfig:
    """Asynchronous staleness weighting s(τ) of an update computed τ server steps ago."""

    kind: str = key("constant", "s(τ): constant 1 | polynomial (1+τ)^-a | hinge 1 if τ <= b else 1/(a(τ-b)+1)")
    a: float = key(0.5, "polynomial, hinge: the decay a of s(τ)", when=when("kind", "polynomial", "hinge"))
    b: float = key(4.0, "hinge: the staleness b up to which s(τ) = 1", when=when("kind", "hinge"))


SELECTORS = {
    "uniform": "a uniform subset of the clients available",
    "power_of_choice": "rpow-d (Cho, Wang, Joshi, 2020): d clients drawn as uniform does, the k with the highest "
                       "loss they last reported kept (never seen: first)",
    "oort": "Oort (Lai, Zhu, Madhyastha, Chowdhury, 2021): statistical utility × system utility with exploration, "
            "a staleness bonus and the pacer, from reported losses and observed durations",
    "importance": "each client independently with probability π = min(1, clients_per_round · its data share), "
                  "aggregated with weights p/π (unbiased)",
}
OORT = when("execution.selection.kind", "oort")
_share = Check(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1, "a number in [0, 1]")
_fraction = Check(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
                  "a number in (0, 1]")


@dataclass
class SelectionConfig:
    """Which clients a synchronous round samples (execution.selection); Oort's defaults are FedScale's."""

    kind: str = key("uniform", "uniform | power_of_choice | oort | importance (raysim list: selectors)",
                    check=one_of(*SELECTORS))
    candidates: Optional[int] = key(None, "power_of_choice: d, the clients drawn before the round's k are kept "
                                          "(null: 2k)", check=positive_int,
                                    when=when("execution.selection.kind", "power_of_choice"))
    exploration: float = key(0.9, "oort: ε, the share of a round first given to clients never selected", check=_share,
                             when=OORT)
    exploration_decay: float = key(0.98, "oort: ε ← max(ε · decay, exploration_min) each round", check=_fraction,
                                   when=OORT)
    exploration_min: float = key(0.3, "oort: the smallest ε", check=_share, when=OORT)
    round_penalty: float = key(2.0, "oort: α, a client slower than the preferred duration T has its utility times "
                                    "(T / duration)^α", check=non_negative, when=OORT)
    round_threshold: float = key(30.0, "oort: T starts as this percentile of the observed durations; the pacer "
                                       "raises it", check=Check(lambda v: isinstance(v, (int, float)) and 0 < v <= 100,
                                                                "a percentile in (0, 100]"), when=OORT)
    pacer_step: int = key(20, "oort: W, the rounds of each window the pacer compares", check=positive_int, when=OORT)
    pacer_delta: float = key(5.0, "oort: the percentile points the pacer moves T's percentile by", check=positive,
                             when=OORT)
    cut_off: float = key(0.05, "oort: clients scoring at least this share of the k-th best score are drawn from (at "
                               "least 10k of them)",
                         check=_fraction, when=OORT)
    clip_bound: float = key(0.9, "oort: statistical utilities are clipped at this quantile", check=_fraction,
                            when=OORT)


@dataclass
class ExecutionConfig:
    """How the server drives training (synchronous rounds or asynchronous updates)."""

    mode: str = key("sync", "sync (rounds) | async (updates applied as they arrive, in virtual-time order)")
    rounds: int = key(20, "sync: rounds", check=positive_int, when=SYNC)
    clients_per_round: int = key(10, "sync: updates kept per round", check=positive_int, when=SYNC)
    deadline: Optional[float] = key(None, "sync: virtual seconds; later updates are late (discarded)", when=SYNC)
    over_selection: float = key(1.0, "sync: sample ceil(f * clients_per_round), keep the earliest", when=SYNC)
    sampling: str = key("uniform", "sync: who a round samples: uniform (clients_per_round clients, a uniform subset "
                                   "of those available) | poisson (each client independently with probability "
                                   "clients_per_round / N, so clients_per_round is the mean round size)",
                        check=one_of("uniform", "poisson"), when=SYNC)
    selection: SelectionConfig = key(doc="sync: which clients a round samples", factory=SelectionConfig, when=SYNC)
    concurrency: int = key(10, "async: tasks in flight", check=positive_int, when=ASYNC)
    aggregation: str = key("fedasync", "async: fedasync | fedbuff", when=ASYNC)
    buffer_size: int = key(10, "async fedbuff: updates per server step", check=positive_int,
                           when=(ASYNC, when("execution.aggregation", "fedbuff")))
    staleness: StalenessConfig = key(doc="async: staleness weights", factory=StalenessConfig, when=ASYNC)
    max_staleness: Optional[int] = key(None, "async: older updates are dropped (status stale)", check=non_negative_int,
                                       when=ASYNC)
    max_updates: Optional[int] = key(None, "async stop: applied updates", check=positive_int, when=ASYNC)
    max_virtual_time: Optional[float] = key(None, "async stop: virtual seconds", when=ASYNC)
    target_accuracy: Optional[float] = key(None, "async stop: global test accuracy reached at an evaluation",
                                           when=ASYNC)


@dataclass
class RuntimeConfig:
    """Where client work runs."""

    backend: str = key("ray", "ray (ClientActors) | local (everything in this process, no Ray)")
    num_actors: Any = key("auto", "ClientActors: a positive integer, or auto (fill the cluster: per node CPUs / "
                                  "cpus_per_actor, and GPUs / gpus_per_actor)", when=ON_RAY)
    cpus_per_actor: float = key(1.0, "CPUs Ray reserves per ClientActor", when=ON_RAY)
    gpus_per_actor: float = key(0.0, "GPUs per ClientActor: a share in [0, 1] (0.25: four actors per GPU) or a "
                                     "whole number", when=ON_RAY)
    address: Optional[str] = key(None, "a Ray cluster to join (auto, HOST:6379, ray://...); null: start an embedded "
                                       "local Ray (inside a Ray job: join the job's cluster)", when=ON_RAY)
    num_cpus: Optional[int] = key(None, "embedded Ray: CPUs to declare (null: all)", check=positive_int,
                                  when=(ON_RAY, EMBEDDED))
    num_gpus: Optional[float] = key(None, "embedded Ray: GPUs to declare (null: the CUDA devices found)",
                                    when=(ON_RAY, EMBEDDED))
    clients_per_task: Any = key("auto", "clients trained together (vectorized) in one task: a positive integer, or "
                                        "auto (sync: a quarter of clients_per_round, at most 25; async: an eighth of "
                                        "concurrency, at most 100)")
    scheduler: str = key("auto", "where the Scheduler runs: actor | driver | auto (driver with an embedded Ray, actor "
                                 "with runtime.address); results are identical", when=ON_RAY)
    placement: str = key("spread", "ClientActors over the cluster's nodes: spread (across nodes) | pack (fill a node "
                                   "first)", when=ON_RAY)
    torch_threads: int = key(1, "torch threads inside client work, the server's steps and evaluation",
                             check=Check(lambda v: 1 <= v <= MAX_TORCH_THREADS,
                                         f"an integer in [1, {MAX_TORCH_THREADS}]"))


def actors_that_fit(cpus: float, gpus: float | None, runtime_cfg) -> int:
    """ClientActors whose runtime.cpus_per_actor and gpus_per_actor shares fit on a node of ``cpus``
    and ``gpus`` (None: not counted), a whole share each."""
    fit = math.floor(cpus / runtime_cfg.cpus_per_actor + 1e-9)  # 1.0 / 0.1 is 9.999…: ten actors
    if runtime_cfg.gpus_per_actor > 0 and gpus is not None:
        fit = min(fit, math.floor(gpus / runtime_cfg.gpus_per_actor + 1e-9))
    return fit


# the most clients an 'auto' task holds: a synchronous round keeps four tasks or more for the actors; the
# asynchronous rule keeps eight tasks or more in flight, and its calls are many, each a fixed cost
MAX_AUTO_CLIENTS_PER_TASK = {"sync": 25, "async": 100}


def clients_per_task(cfg) -> int:
    """Task size: ``runtime.clients_per_task``, or for 'auto' a quarter of a synchronous round
    (at most 25), or an eighth of the asynchronous concurrency (at most 100): work spreads over
    several actors while each task stays large enough to vectorize."""
    value = cfg.runtime.clients_per_task
    if value != "auto":
        return value
    ex = cfg.execution
    share = -(-ex.clients_per_round // 4) if ex.mode == "sync" else -(-ex.concurrency // 8)
    return max(1, min(MAX_AUTO_CLIENTS_PER_TASK[ex.mode], share))


RESUMABLE_KEYS = ("runtime.", "data.on_demand", "data.cache_mb", "output.flush_seconds", "output.checkpoint_every",
                  "output.checkpoint_seconds")
"""The keys a resume may override: where a run executes, where client rows are built and how often it
writes, none of which changes its results."""


def result_keys(scenario) -> dict:
    """{dotted key: value as JSON text} of every key of ``scenario`` (the plain dataclasses a run
    reads) that decides its results: all but :data:`RESUMABLE_KEYS` and ``output.dir`` (a run
    directory may move). A checkpoint holds them, so that a resume refuses an edited scenario."""
    def flat(value, prefix: str):
        if dataclasses.is_dataclass(value):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            for k, v in value.items():
                yield from flat(v, f"{prefix}{k}.")
        else:
            yield prefix[:-1], json.dumps(value, sort_keys=True, default=repr)

    return {k: v for k, v in flat(scenario, "") if not k.startswith(RESUMABLE_KEYS) and k != "output.dir"}


ADAPTS = Rule(lambda cfg: cfg.eval.personalized_steps > 0 or cfg.eval.personalized_epochs > 0,
              "eval.personalized_steps > 0 or eval.personalized_epochs > 0", lambda cfg: "both are 0")


@dataclass
class EvalConfig:
    """Global (and optionally personalized) evaluation."""

    every: int = key(1, "server steps (rounds; async: model versions) between evaluations; 0: only at the end, "
                        "which is always evaluated", check=non_negative_int)
    personalized_steps: int = key(0, "> 0: also adapt the global model on each client with this many local steps, "
                                     "then test it (personalized_accuracy*); an algorithm whose clients keep models "
                                     "of their own (ditto, apfl, pfedme, …) tests those, after these steps (0: as "
                                     "they are)",
                                  check=non_negative_int)
    personalized_lr: Optional[float] = key(None, "step size of the personalization steps (null: the algorithm's "
                                                 "adaptation step: Per-FedAvg's inner_lr, FFGG's personal_lr, "
                                                 "else algorithm.lr)", check=positive, when=ADAPTS)
    personalized_epochs: int = key(0, "> 0: adapt for this many local epochs instead of steps",
                                   check=non_negative_int)
    adapt_on: str = key("train", "the rows the personalization steps take their batches from: train | test "
                                 "(test: as in the Per-FedAvg paper's FedAvg + update)",
                        check=one_of("train", "test"), when=ADAPTS)
    clients: Optional[int] = key(None, "evaluate (globally and personalized) on a seeded "
                                       "sample of this many clients, the same at every evaluation (null: every "
                                       "client)", check=positive_int, when=when("data.kind", "quadratic", negate=True))
    new_clients: int = key(0, "hold out this many clients (seeded) that never train; each evaluation also tests "
                              "the global model on them and, with eval.personalized_*, after their own adaptation "
                              "(new_client_* columns)", check=non_negative_int,
                           when=when("data.kind", "quadratic", negate=True))
    where: str = key("auto", "where the global model is tested: driver (the scheduler's process) | actors (the "
                             "ClientActors, in parallel, on their devices; with runtime.backend=local the client "
                             "host in the same process, which runs the actors' code) | auto (actors when they have "
                             "GPUs and rounds are synchronous, else driver); the same bits on the same kind of device",
                     check=one_of("auto", "driver", "actors"), when=when("data.kind", "quadratic", negate=True))
    curvature: bool = key(False, "log the exact objective J (mean client training loss plus the weight-decay "
                                 "term), its gradient's squared norm and the least eigenvalue of its Hessian at "
                                 "every evaluation (full Hessian: small models only)")


@dataclass
class OutputConfig:
    """Where results go."""

    dir: str = key("results/${name}", "the run's directory: a path, or a URI pyarrow understands (s3://..., "
                                      "gs://...); an earlier run there is refused unless raysim run --replace")
    save_model: bool = key(True, "write the final model, model.pt")
    flush_seconds: float = key(2.0, "new rows reach the Parquet logs at least this often (and at every checkpoint)",
                               check=non_negative)
    checkpoint_every: int = key(0, "server steps between checkpoints (checkpoint.pt, for raysim resume; one is "
                                "also written on Ctrl-C and SIGTERM); 0: by wall time", check=non_negative_int)
    checkpoint_seconds: float = key(60.0, "with checkpoint_every 0: wall seconds between checkpoints (at most 5% "
                                    "of the run's time goes to them); 0: only on Ctrl-C and SIGTERM",
                                    check=non_negative)
    tensorboard: bool = key(False, "also write the rounds' metrics (scalars) and histograms of staleness and "
                                   "participation as TensorBoard event files in <dir>/tensorboard/, at every "
                                   "flush of the Parquet logs (needs: pip install tensorboard)")


@dataclass
class Scenario:
    """A whole scenario."""

    name: str = key("scenario", "the run's name (letters, digits, '.', '_', '-'); output.dir defaults to "
                               "results/${name}")
    seed: int = key(0, "the one seed: data, model initialization, client sampling, every client's batches")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: Any = key(doc="the algorithm's name and its own keys (its keys dataclass; raysim list: algorithms)",
                         factory=lambda: {"name": "fedavg"})
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    communication: CommunicationConfig = field(default_factory=CommunicationConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


TOP_LEVEL_KEYS = tuple(Scenario.__dataclass_fields__)
