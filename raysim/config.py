"""Scenario schema (omegaconf structured configs): load, override, validate.

A scenario is a YAML file whose top-level keys are exactly ``name``, ``seed``,
``data``, ``model``, ``algorithm``, ``execution``, ``system``, ``runtime``,
``eval`` and ``output``. Every key, its type and its default is declared
below; :func:`load_scenario` merges a file and ``key=value`` overrides onto
the schema and :func:`validate` checks values, so that bad input fails before
Ray starts with one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, OmegaConfBaseException

from raysim.errors import ScenarioError
from raysim.system.config import SystemConfig


@dataclass
class PartitionConfig:
    """How a centralized data set (digits) is split across clients."""

    kind: str = "iid"  # iid | dirichlet | shards | pathological
    alpha: float = 0.5  # dirichlet concentration
    shards_per_client: int = 2  # shards
    per_class: int = 10  # pathological: train images per class (a)
    test_per_class: int = 4  # pathological: test images per class
    diff_hetero: bool = False  # pathological: second group keeps one class only


@dataclass
class DataConfig:
    """The federated data set."""

    kind: str = "gaussian_mixture"  # gaussian_mixture | leaf_synthetic | digits | parquet | quadratic
    num_clients: int = 100
    n: int = 10000  # quadratic: rows of each client's matrices
    d_theta: int = 100  # quadratic: size of the global part θ
    d_w: int = 50  # quadratic: size of the personal part w
    realizable: bool = False  # quadratic: targets b_m, y_m from a planted (θ, w_m) (Assumption 2 holds)
    feature_shift: bool = False  # digits: per-client pixel gain, offset and one-pixel translation
    concept_shift: bool = False  # digits: per-client permutation of the labels
    alpha: float = 1.0  # leaf_synthetic: model heterogeneity (variance)
    beta: float = 1.0  # leaf_synthetic: data heterogeneity (variance)
    test_fraction: float = 0.2  # share of each client's rows held out for testing
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    path: Optional[str] = None  # parquet: file or directory
    label_column: str = "label"
    client_column: str = "client_id"
    feature_columns: Optional[List[str]] = None
    image_shape: Optional[List[int]] = None


@dataclass
class ModelConfig:
    """The model trained by every client (deterministic init from ``seed``)."""

    kind: str = "mlp"  # logreg | mlp | cnn | quadratic
    hidden: List[int] = field(default_factory=lambda: [64])  # mlp hidden sizes
    activation: str = "relu"  # mlp: relu | elu | tanh | sigmoid
    channels: List[int] = field(default_factory=lambda: [16, 32])  # cnn conv channels
    personal: Any = "none"  # none | input_layer | output_layer | adapter | [parameter-name patterns]
    adapter_rank: int = 4  # adapter: rank of each LoRA pair
    adapter_layers: Optional[List[str]] = None  # adapter: Linear module names (null: all but the output layer)
    personal_init: str = "random"  # random | zero | global: w at each client visit
    personal_state: str = "stateless"  # stateless | stateful (w kept per client between visits)


@dataclass
class AlgorithmConfig:
    """The federated algorithm and its client optimizer."""

    name: str = "fedavg"
    lr: float = 0.05  # client learning rate
    batch_size: int = 10
    local_epochs: int = 1
    local_steps: Optional[int] = None  # if set, a fixed number of steps replaces epochs
    weight_decay: float = 0.0
    server_lr: float = 1.0
    server_optimizer: str = "sgd"  # sgd | adam (FedAdam)
    server_betas: List[float] = field(default_factory=lambda: [0.9, 0.99])  # adam
    server_eps: float = 1e-3  # adam
    lr_unit: str = "absolute"  # absolute | inverse_smoothness (quadratic: lr, server_lr times 1/L constants)
    personal_lr: Optional[float] = None  # γ_w of the personal part (null: algorithm.lr)
    finetuner: str = "sgd"  # FFGG: sgd | cg | exact (cg, exact: quadratic data)
    penalty: float = 0.1  # l2gd: λ
    average_prob: Optional[float] = None  # l2gd: p (null: 1 / local_steps)
    pretrain_rounds: int = 0  # local_ffgg: FedAvg rounds on the whole model first
    pretrain_lr: Optional[float] = None  # local_ffgg: client lr of those rounds (null: algorithm.lr)


@dataclass
class StalenessConfig:
    """Asynchronous staleness weighting s(τ) of an update computed τ server steps ago."""

    kind: str = "constant"  # constant | polynomial: (1+τ)^-a | hinge: 1 if τ <= b else 1/(a(τ-b)+1)
    a: float = 0.5
    b: float = 4.0


@dataclass
class ExecutionConfig:
    """How the server drives training (synchronous rounds or asynchronous updates)."""

    mode: str = "sync"  # sync | async
    rounds: int = 20  # sync
    clients_per_round: int = 10  # sync: updates kept per round
    deadline: Optional[float] = None  # sync: virtual seconds; later updates are late (discarded)
    over_selection: float = 1.0  # sync: sample ceil(f * clients_per_round), keep the earliest
    concurrency: int = 10  # async: tasks in flight
    aggregation: str = "fedasync"  # async: fedasync | fedbuff
    buffer_size: int = 10  # async fedbuff: updates per server step
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    max_staleness: Optional[int] = None  # async: older updates are dropped (status stale)
    max_updates: Optional[int] = None  # async stop: applied updates
    max_virtual_time: Optional[float] = None  # async stop: virtual seconds
    target_accuracy: Optional[float] = None  # async stop: global test accuracy reached at an evaluation


@dataclass
class RuntimeConfig:
    """Where client work runs."""

    backend: str = "ray"  # ray | local
    num_actors: Any = "auto"  # int or "auto"
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    address: Optional[str] = None  # null: start an embedded local Ray
    num_cpus: Optional[int] = None  # embedded Ray: CPUs to declare (null: all)
    num_gpus: Optional[float] = None  # embedded Ray: GPUs to declare (null: detect)
    clients_per_task: Any = "auto"  # clients trained together (vectorized) in one task; auto: see README
    scheduler: str = "auto"  # actor | driver | auto (driver with an embedded Ray, actor on a cluster)
    placement: str = "spread"  # spread | pack: ClientActors over the cluster's nodes
    torch_threads: int = 1  # torch threads inside client work


@dataclass
class EvalConfig:
    """Global (and optionally personalized) evaluation."""

    every: int = 1  # rounds between evaluations; 0: only at the end
    personalized_steps: int = 0  # >0: fine-tune this many local steps before testing
    personalized_lr: Optional[float] = None  # null: algorithm.lr
    personalized_epochs: int = 0  # >0: fine-tune this many local epochs instead of steps


@dataclass
class OutputConfig:
    """Where results go."""

    dir: str = "results/${name}"
    save_model: bool = True
    flush_seconds: float = 2.0  # Parquet files are rewritten at most this often


@dataclass
class Scenario:
    """A whole scenario."""

    name: str = "scenario"
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


TOP_LEVEL_KEYS = tuple(Scenario.__dataclass_fields__)


def load_scenario(path: Optional[str], overrides: List[str] = ()) -> DictConfig:
    """Merge a scenario file and ``key=value`` overrides onto the schema and validate.

    Raises :class:`ScenarioError` for any problem, naming the key.
    """
    schema = OmegaConf.structured(Scenario)
    layers = []
    if path is not None:
        layers.append(_read_yaml(path))
    layers.append(_parse_overrides(overrides))
    cfg = schema
    for layer in layers:
        _check_unknown_keys(layer, schema)
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise _translate(exc) from None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise _translate(exc) from None
    validate(cfg)
    return cfg


def _read_yaml(path: str) -> DictConfig:
    if not os.path.isfile(path):
        raise ScenarioError("scenario", path, "an existing YAML file")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:  # yaml errors come in several types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ScenarioError("scenario", path, f"valid YAML ({first})") from None
    if not isinstance(loaded, DictConfig):
        raise ScenarioError("scenario", path, "a YAML mapping of keys to values")
    return loaded


def _parse_overrides(overrides) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ScenarioError("override", item, "key=value, e.g. algorithm.lr=0.1")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as exc:
        raise ScenarioError("override", " ".join(overrides), f"key=value pairs ({exc})") from None


def _check_unknown_keys(layer: DictConfig, schema: DictConfig, prefix: str = "") -> None:
    """Reject keys the schema does not declare, listing the allowed ones."""
    for key in layer.keys():
        path = f"{prefix}{key}"
        if key not in schema:
            allowed = ", ".join(str(k) for k in schema.keys()) or "no key yet"
            raise ScenarioError(path, _raw(layer, key), f"a known key; allowed here: {allowed}")
        sub, child = schema[key], layer._get_node(key)
        if isinstance(sub, DictConfig) and isinstance(child, DictConfig):
            _check_unknown_keys(child, sub, path + ".")


def _raw(layer: DictConfig, key) -> Any:
    value = layer._get_node(key)._value()
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value


def _translate(exc: OmegaConfBaseException) -> ScenarioError:
    """Turn an omegaconf merge/resolve error into a one-line ScenarioError."""
    key = getattr(exc, "full_key", None) or "scenario"
    if isinstance(exc, (InterpolationResolutionError, GrammarParseError)):
        return ScenarioError(key, "${...}", f"an interpolation that resolves ({str(exc).splitlines()[0]})")
    return ScenarioError(key, getattr(exc, "value", None), f"a value of type {_declared_type(key)}")


def _declared_type(key: str) -> str:
    """The schema's type for a dotted key, e.g. 'int' or 'Optional[float]'."""
    node = OmegaConf.structured(Scenario)
    for part in key.split("."):
        node = node._get_node(part)
    ref = node._metadata.ref_type
    return getattr(ref, "__name__", None) if not hasattr(ref, "__args__") else str(ref).replace("typing.", "")


# ----------------------------------------------------------------------------- validation

def _check(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise ScenarioError(key, value, allowed)


def _one_of(key: str, value, names) -> None:
    names = sorted(names)
    _check(value in names, key, value, "one of " + ", ".join(names))


def _positive(key: str, value, integer: bool = False) -> None:
    _check(value > 0, key, value, "a positive integer" if integer else "a number > 0")


def _non_negative(key: str, value) -> None:
    _check(value >= 0, key, value, "a number >= 0")


def validate(cfg: DictConfig) -> None:
    """Check every value of a merged scenario; raise ScenarioError on the first bad one."""
    from raysim.catalog import ACTIVATIONS, ALGORITHMS, MODELS, PERSONAL_MODES, check_init
    from raysim.data import DATASETS
    from raysim.data.partition import PARTITIONERS
    from raysim.system import validate_system

    _check(bool(re.fullmatch(r"[A-Za-z0-9_.\-]+", cfg.name)), "name", cfg.name,
           "a non-empty name of letters, digits, '.', '_' or '-'")
    _non_negative("seed", cfg.seed)

    d = cfg.data
    _one_of("data.kind", d.kind, DATASETS)
    _positive("data.num_clients", d.num_clients, integer=True)
    _check(0.0 <= d.test_fraction < 1.0, "data.test_fraction", d.test_fraction, "a number in [0, 1)")
    _positive("data.alpha", d.alpha)
    _positive("data.beta", d.beta)
    if d.kind == "digits":
        p = d.partition
        _one_of("data.partition.kind", p.kind, PARTITIONERS)
        _positive("data.partition.alpha", p.alpha)
        _positive("data.partition.shards_per_client", p.shards_per_client, integer=True)
        _positive("data.partition.per_class", p.per_class, integer=True)
        _non_negative("data.partition.test_per_class", p.test_per_class)
        if p.kind == "pathological":
            _check(d.num_clients % 2 == 0, "data.num_clients", d.num_clients,
                   "an even number with data.partition.kind=pathological")
    if d.kind == "parquet":
        _check(d.path is not None and os.path.exists(d.path), "data.path", d.path,
               "an existing Parquet file or directory")
    if d.image_shape is not None:
        _check(len(d.image_shape) in (2, 3) and all(s > 0 for s in d.image_shape), "data.image_shape",
               list(d.image_shape), "[height, width] or [channels, height, width] of positive sizes")

    if d.kind == "quadratic":
        for key in ("n", "d_theta", "d_w"):
            _positive(f"data.{key}", d[key], integer=True)

    m = cfg.model
    _one_of("model.kind", m.kind, MODELS)
    _check((m.kind == "quadratic") == (d.kind == "quadratic"), "model.kind", m.kind,
           "quadratic with data.kind=quadratic" if d.kind == "quadratic"
           else "a model for row data (not quadratic, which needs data.kind=quadratic)")
    personal = m.personal if isinstance(m.personal, str) else OmegaConf.to_container(m.personal)
    _check(personal in PERSONAL_MODES or (isinstance(personal, list) and personal
                                          and all(isinstance(x, str) for x in personal)),
           "model.personal", personal, "one of " + ", ".join(PERSONAL_MODES) + ", or a list of parameter-name patterns")
    _positive("model.adapter_rank", m.adapter_rank, integer=True)
    _one_of("model.personal_state", m.personal_state, ["stateful", "stateless"])
    check_init(personal, m.personal_init)  # personal_init is one of PERSONAL_INITS, and fits the split
    _check(all(h > 0 for h in m.hidden), "model.hidden", list(m.hidden), "a list of positive layer sizes")
    _one_of("model.activation", m.activation, ACTIVATIONS)
    _check(len(m.channels) > 0 and all(c > 0 for c in m.channels), "model.channels", list(m.channels),
           "a non-empty list of positive channel counts")

    a = cfg.algorithm
    _one_of("algorithm.name", a.name, ALGORITHMS)
    _positive("algorithm.lr", a.lr)
    _positive("algorithm.batch_size", a.batch_size, integer=True)
    _positive("algorithm.local_epochs", a.local_epochs, integer=True)
    if a.local_steps is not None:
        _positive("algorithm.local_steps", a.local_steps, integer=True)
    _non_negative("algorithm.weight_decay", a.weight_decay)
    _positive("algorithm.server_lr", a.server_lr)
    _validate_personalised(cfg)

    e = cfg.execution
    _one_of("execution.mode", e.mode, ["async", "sync"])
    _positive("execution.rounds", e.rounds, integer=True)
    if e.deadline is not None:
        _positive("execution.deadline", e.deadline)
    _check(e.over_selection >= 1.0, "execution.over_selection", e.over_selection, "a factor >= 1 (1: no over-selection)")
    _positive("execution.concurrency", e.concurrency, integer=True)
    _one_of("execution.aggregation", e.aggregation, ["fedasync", "fedbuff"])
    _positive("execution.buffer_size", e.buffer_size, integer=True)
    _one_of("execution.staleness.kind", e.staleness.kind, ["constant", "hinge", "polynomial"])
    _non_negative("execution.staleness.a", e.staleness.a)
    _non_negative("execution.staleness.b", e.staleness.b)
    if e.max_staleness is not None:
        _non_negative("execution.max_staleness", e.max_staleness)
    if e.max_updates is not None:
        _positive("execution.max_updates", e.max_updates, integer=True)
    if e.max_virtual_time is not None:
        _positive("execution.max_virtual_time", e.max_virtual_time)
    if e.target_accuracy is not None:
        _check(0 < e.target_accuracy <= 1, "execution.target_accuracy", e.target_accuracy, "a number in (0, 1]")
    if e.mode == "async":
        _check(e.max_updates is not None or e.max_virtual_time is not None, "execution.max_updates", None,
               "a budget for async mode: execution.max_updates or execution.max_virtual_time "
               "(execution.target_accuracy may stop it earlier)")
        if e.target_accuracy is not None:
            _check(cfg.eval.every > 0, "eval.every", cfg.eval.every,
                   "> 0 with execution.target_accuracy (accuracy is only known at evaluations)")
    if d.kind != "parquet":  # a Parquet file decides its own number of clients
        _check(1 <= e.clients_per_round <= d.num_clients, "execution.clients_per_round", e.clients_per_round,
               f"an integer in [1, data.num_clients={d.num_clients}]")
    else:
        _positive("execution.clients_per_round", e.clients_per_round, integer=True)

    r = cfg.runtime
    _one_of("runtime.backend", r.backend, ["local", "ray"])
    _one_of("runtime.scheduler", r.scheduler, ["actor", "auto", "driver"])
    _one_of("runtime.placement", r.placement, ["pack", "spread"])
    na = r.num_actors
    _check(na == "auto" or (isinstance(na, int) and not isinstance(na, bool) and na > 0),
           "runtime.num_actors", na, "a positive integer or 'auto'")
    _positive("runtime.cpus_per_actor", r.cpus_per_actor)
    _non_negative("runtime.gpus_per_actor", r.gpus_per_actor)
    _check(r.gpus_per_actor <= 1 or float(r.gpus_per_actor).is_integer(), "runtime.gpus_per_actor",
           r.gpus_per_actor, "a fraction in [0, 1] or a whole number of GPUs")
    if r.num_cpus is not None:
        _positive("runtime.num_cpus", r.num_cpus, integer=True)
    if r.num_gpus is not None:
        _non_negative("runtime.num_gpus", r.num_gpus)
    cpt = r.clients_per_task
    _check(cpt == "auto" or (isinstance(cpt, int) and not isinstance(cpt, bool) and cpt > 0),
           "runtime.clients_per_task", cpt, "a positive integer or 'auto'")
    _positive("runtime.torch_threads", r.torch_threads, integer=True)

    validate_system(cfg.system, None if d.kind == "parquet" else d.num_clients)

    v = cfg.eval
    _non_negative("eval.every", v.every)
    _non_negative("eval.personalized_steps", v.personalized_steps)
    _non_negative("eval.personalized_epochs", v.personalized_epochs)
    if v.personalized_lr is not None:
        _positive("eval.personalized_lr", v.personalized_lr)

    _check(bool(str(cfg.output.dir).strip()), "output.dir", cfg.output.dir, "a directory path")
    _non_negative("output.flush_seconds", cfg.output.flush_seconds)


QUADRATIC_ALGORITHMS = ("ffgg", "l2gd", "local_ffgg", "localgd", "scaffold")


def _validate_personalised(cfg: DictConfig) -> None:
    """The keys of partially personalised training and of the quadratic problem's algorithms."""
    a, d, e, m = cfg.algorithm, cfg.data, cfg.execution, cfg.model
    _one_of("algorithm.server_optimizer", a.server_optimizer, ["adam", "sgd"])
    _check(len(a.server_betas) == 2 and all(0 <= b < 1 for b in a.server_betas), "algorithm.server_betas",
           list(a.server_betas), "two numbers in [0, 1)")
    _positive("algorithm.server_eps", a.server_eps)
    _one_of("algorithm.lr_unit", a.lr_unit, ["absolute", "inverse_smoothness"])
    _one_of("algorithm.finetuner", a.finetuner, ["cg", "exact", "sgd"])
    if a.personal_lr is not None:
        _positive("algorithm.personal_lr", a.personal_lr)
    _positive("algorithm.penalty", a.penalty)
    if a.average_prob is not None:
        _check(0 < a.average_prob < 1, "algorithm.average_prob", a.average_prob, "a probability in (0, 1)")
    _check(a.pretrain_rounds >= 0, "algorithm.pretrain_rounds", a.pretrain_rounds, "an integer >= 0")
    if a.pretrain_lr is not None:
        _positive("algorithm.pretrain_lr", a.pretrain_lr)
    quadratic = d.kind == "quadratic"
    if a.lr_unit == "inverse_smoothness":
        _check(quadratic, "algorithm.lr_unit", a.lr_unit, "absolute unless data.kind=quadratic (whose "
               "smoothness constants are known)")
    if a.finetuner in ("cg", "exact"):
        _check(quadratic, "algorithm.finetuner", a.finetuner, "sgd unless data.kind=quadratic")
    if quadratic:
        _one_of("algorithm.name", a.name, QUADRATIC_ALGORITHMS)
        steps_free = (a.name == "ffgg" and a.finetuner == "exact") or (a.name == "l2gd" and a.average_prob is not None)
        _check(a.local_steps is not None or steps_free, "algorithm.local_steps", None,
               f"a positive integer for algorithm.name={a.name} on data.kind=quadratic (its clients have no rows "
               "to make epochs of)")
        _check(a.pretrain_rounds == 0, "algorithm.pretrain_rounds", a.pretrain_rounds,
               "0 with data.kind=quadratic (FedAvg pre-training needs rows)")
    if a.name in ("ffgg", "local_ffgg"):
        personal = m.personal if isinstance(m.personal, str) else list(m.personal)
        if quadratic:
            _check(personal == ["w"], "model.personal", personal, "[w] for algorithm.name="
                   f"{a.name} on data.kind=quadratic (w is that problem's personal part)")
        else:
            _check(personal != "none", "model.personal", personal, f"a split with personal parameters for "
                   f"algorithm.name={a.name}: input_layer, output_layer, adapter or name patterns")
    if a.pretrain_rounds:
        _check(a.name == "local_ffgg", "algorithm.pretrain_rounds", a.pretrain_rounds, "0 unless algorithm.name=local_ffgg")
        _check(e.mode == "sync", "algorithm.pretrain_rounds", a.pretrain_rounds, "0 in execution.mode=async")
        _check(a.pretrain_rounds < e.rounds, "algorithm.pretrain_rounds", a.pretrain_rounds,
               f"fewer than execution.rounds={e.rounds} (they are part of them)")
    if a.name == "l2gd":
        _check(e.mode == "sync", "execution.mode", e.mode, "sync for algorithm.name=l2gd")
        _check(e.clients_per_round == d.num_clients, "execution.clients_per_round", e.clients_per_round,
               f"data.num_clients={d.num_clients} for algorithm.name=l2gd (full participation)")


def scenario_object(container: dict) -> Scenario:
    """A validated scenario (as a plain dict) as plain dataclasses: fast attribute access for
    the hot paths of the scheduler and the client hosts."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Scenario), container))


def to_yaml(cfg: DictConfig) -> str:
    """The resolved scenario as YAML text."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def describe_keys(node=None, prefix: str = "") -> List[tuple]:
    """(key path, default) for every key of the schema, for docs and ``raysim list``."""
    node = OmegaConf.structured(Scenario) if node is None else node
    rows = []
    for key in node.keys():
        value = node[key]
        path = f"{prefix}{key}"
        if isinstance(value, DictConfig):
            rows.extend(describe_keys(value, path + "."))
        else:
            rows.append((path, OmegaConf.to_container(value) if isinstance(value, ListConfig) else value))
    return rows
