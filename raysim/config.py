"""Scenario schema (omegaconf structured configs): load, override, validate.

A scenario is a YAML file whose top-level keys are exactly ``name``, ``seed``,
``data``, ``model``, ``algorithm``, ``execution``, ``system``, ``runtime``,
``eval`` and ``output``. Every key, its type and its default is declared
below; :func:`load_scenario` merges a file and ``key=value`` overrides onto
the schema and :func:`validate` checks values, so that bad input fails before
Ray starts with one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, OmegaConfBaseException

from raysim.algorithms.keys import check_aggregator
from raysim.catalog import (ACTIVATIONS, ALGORITHMS, MODELS, PERSONAL_MODES, algorithm_keys, check_init,
                            parameter_count)
from raysim.data import DATASETS
from raysim.data._checks import check_num_clients
from raysim.data.files import CLIENTS_FROM_FILES, DATA_FILES, PARTITIONED_FILES, own_split
from raysim.data.generated import LAWS
from raysim.data.partition import PARTITIONERS
from raysim.data.sizes import data_shape
from raysim.errors import ScenarioError, first_line
from raysim.importing import import_object
from raysim.schema import (INT64_MAX, Check, Rule, check_numbers, check_values, field_of, inapplicable, key,
                           non_negative, non_negative_int, one_of, positive, positive_int, require, require_one_of,
                           when)
from raysim.system import validate_system
from raysim.system.config import OMNISCIENT_ATTACKS, SystemConfig, byzantine_count

DIGITS, QUADRATIC, LEAF, PARQUET, BLOBS, SADDLE = (when("data.kind", k) for k in
                                                   ("digits", "quadratic", "leaf_synthetic", "parquet", "blobs",
                                                    "saddle"))
SPLIT_KINDS = ("digits", "blobs", *PARTITIONED_FILES)  # centralized data sets that data.partition splits
SPLIT = when("data.kind", *SPLIT_KINDS)
ON_DEMAND = when("data.kind", *LAWS, "quadratic")  # generated kinds: a client's data can be built where it trains
SYNC, ASYNC = when("execution.mode", "sync"), when("execution.mode", "async")
EMBEDDED = when("runtime.address", None)  # a cluster joined at runtime.address declares its own resources
ON_RAY = when("runtime.backend", "ray")  # keys of Ray's actors and cluster, which the local backend does without
MAX_TORCH_THREADS = 1024  # far more threads than cores stalls torch's first parallel operation
CURVATURE_MAX_PARAMETERS = 2000  # eval.curvature's full float64 Hessian: at most 32 MB, and P passes per evaluation
PATH_PARTS = re.compile(r"([^.\[\]]+)|\[(\d+)\]")  # a dotted key's names and list indices: model.hidden[1]


def _partition(kind: str):
    return when("data.partition.kind", kind)


@dataclass
class PartitionConfig:
    """How a centralized data set (digits, blobs, and the image files: SPLIT_KINDS) is split across clients."""

    kind: str = key("iid", "iid | dirichlet | shards | pathological (raysim list: partitioners)")
    alpha: float = key(0.5, "dirichlet: concentration of the per-class Dirichlet(alpha) proportions (smaller: more "
                            "label skew)", check=positive, when=_partition("dirichlet"))
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

    kind: str = key("mlp", "logreg | mlp | cnn | quadratic | bilinear | char_lstm | femnist_cnn | resnet18_gn, or "
                           "package.module:function")
    hidden: List[int] = key(doc="mlp hidden sizes", factory=lambda: [64], when=when("kind", "mlp"))
    activation: str = key("relu", "mlp: relu | elu | tanh | sigmoid", when=when("kind", "mlp"))
    channels: List[int] = key(doc="cnn conv channels", factory=lambda: [16, 32], when=when("kind", "cnn"))
    init_scale: float = key(1e-3, "bilinear: every initial parameter is init_scale·N(0, 1) (0: exactly at the "
                                  "saddle, the origin)", check=non_negative, when=when("kind", "bilinear"))
    personal: Any = key("none", "the personal part w (the rest is the global θ): none | input_layer | output_layer | "
                                "adapter | a list of parameter-name patterns")
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


@dataclass
class ExecutionConfig:
    """How the server drives training (synchronous rounds or asynchronous updates)."""

    mode: str = key("sync", "sync (rounds) | async (updates applied as they arrive, in virtual-time order)")
    rounds: int = key(20, "sync: rounds", check=positive_int, when=SYNC)
    clients_per_round: int = key(10, "sync: updates kept per round", check=positive_int, when=SYNC)
    deadline: Optional[float] = key(None, "sync: virtual seconds; later updates are late (discarded)", when=SYNC)
    over_selection: float = key(1.0, "sync: sample ceil(f * clients_per_round), keep the earliest", when=SYNC)
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


ADAPTS = Rule(lambda cfg: cfg.eval.personalized_steps > 0 or cfg.eval.personalized_epochs > 0,
              "eval.personalized_steps > 0 or eval.personalized_epochs > 0", lambda cfg: "both are 0")


@dataclass
class EvalConfig:
    """Global (and optionally personalized) evaluation."""

    every: int = key(1, "server steps (rounds; async: model versions) between evaluations; 0: only at the end, "
                        "which is always evaluated", check=non_negative_int)
    personalized_steps: int = key(0, "> 0: also adapt the global model on each client with this many local steps, "
                                     "then test it (personalized_accuracy*)", check=non_negative_int)
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
                                      "gs://...); an earlier run's files there are removed first")
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
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


TOP_LEVEL_KEYS = tuple(Scenario.__dataclass_fields__)


def load_scenario(source, overrides: List[str] = ()) -> DictConfig:
    """Merge a scenario (a YAML file's path, a mapping of keys, a scenario loaded before, or
    None) and ``key=value`` overrides onto the schema and validate; a ``~key`` override removes a
    key the scenario sets (:func:`_unset`).

    The ``algorithm`` section's schema is the keys dataclass of the algorithm it names
    (:func:`raysim.catalog.algorithm_keys`). Keys that the scenario sets but that would be
    ignored (they apply to another algorithm, data kind or execution mode) are errors.
    Raises :class:`ScenarioError` for any problem, naming the key.
    """
    schema = OmegaConf.structured(Scenario)
    layers = []
    if isinstance(source, (dict, DictConfig)):
        layers.append(OmegaConf.create(OmegaConf.to_container(source) if isinstance(source, DictConfig) else source))
    elif source is not None:
        layers.append(_read_yaml(os.fspath(source)))
    layers.append(_parse_overrides(_unset(layers, overrides)))
    algorithm_layers = [_take_algorithm(layer) for layer in layers]
    loaded = 1 if isinstance(source, DictConfig) else 0  # a loaded scenario holds every key: none is "set"
    paths = [[*_leaf_paths(layer), *(f"algorithm.{p}" for p in _leaf_paths(section))]
             for layer, section in zip(layers[loaded:], algorithm_layers[loaded:])]
    explicit = [p for layer in paths for p in layer]
    cfg = schema
    for layer in layers:
        _check_layer(layer, schema)
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise _translate(exc) from None
    cfg.algorithm = _algorithm_section(algorithm_layers)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise _translate(exc) from None
    validate(cfg, explicit, unsettable=set(explicit) - set(paths[-1]))
    return cfg


def _unset(layers: list, overrides) -> list:
    """Apply the ``~key`` overrides: each removes a key that the scenario sets, so that the key's
    default applies and it no longer counts as set. Returns the other overrides."""
    rest = []
    for item in overrides:
        if not item.startswith("~"):
            rest.append(item)
            continue
        parent, _, name = item[1:].rpartition(".")
        nodes = [OmegaConf.select(layer, parent) if parent else layer for layer in layers] if name else []
        holders = [node for node in nodes if isinstance(node, DictConfig) and name in node]
        require(bool(holders) and "=" not in item, "override", item,
                "~KEY, for a key the scenario sets (its default then applies)")
        for node in holders:
            del node[name]
    return rest


def _take_algorithm(layer: DictConfig) -> DictConfig:
    """Remove and return a layer's ``algorithm`` section (merged onto its own schema later)."""
    if "algorithm" not in layer:
        return OmegaConf.create({})
    section = layer._get_node("algorithm")
    if not isinstance(section, DictConfig):
        raise ScenarioError("algorithm", _raw(layer, "algorithm"), "a mapping of algorithm keys (name: fedavg, ...)")
    del layer["algorithm"]
    return section


def _algorithm_section(layers: list) -> DictConfig:
    """The ``algorithm`` section: the named algorithm's keys with the layers' values merged on."""
    name = "fedavg"
    for layer in layers:
        if "name" in layer:
            name = _raw(layer, "name")
    if not isinstance(name, str):
        raise ScenarioError("algorithm.name", name, "a built-in name (raysim list) or package.module:Class")
    keys = algorithm_keys(name)
    try:
        section = OmegaConf.structured(keys)
    except OmegaConfBaseException as exc:  # a custom algorithm's Keys with a default of the wrong type
        raise ScenarioError("algorithm.name", name, f"an algorithm whose Keys have defaults of their types "
                                                    f"({first_line(exc)}: {exc.full_key})") from None
    for layer in layers:
        _check_layer(layer, section, "algorithm.", f"a key of algorithm.name={name}", from_file=layer is not layers[-1])
        try:
            section = OmegaConf.merge(section, layer)
        except OmegaConfBaseException as exc:
            raise _translate(exc, keys, "algorithm.") from None
    return section


def _leaf_paths(node: DictConfig, prefix: str = ""):
    """Dotted paths of the values a layer sets: sub-mappings are walked, and so are the mappings of a
    list of them (``system.compute.tiers[0].speed``); other lists are values."""
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            yield from _leaf_paths(child, f"{prefix}{k}.")
        elif isinstance(child, ListConfig) and (entries := _entries(child)):
            for i, entry in enumerate(entries):
                yield from _leaf_paths(entry, f"{prefix}{k}[{i}].")
        else:
            yield f"{prefix}{k}"


def _entries(node: ListConfig) -> list:
    """The mappings of a non-empty list of mappings (such as ``system.compute.tiers``), else []."""
    entries = [] if node._is_none() or node._is_interpolation() else [node._get_node(i) for i in range(len(node))]
    return entries if all(isinstance(e, DictConfig) for e in entries) else []


def _read_yaml(path: str) -> DictConfig:
    """A scenario file: a non-empty YAML mapping of scenario keys."""
    if not os.path.isfile(path):
        raise ScenarioError("scenario", path, "an existing YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        content = yaml.safe_load(text)  # OmegaConf would read an empty file, null or a word as a mapping
        if isinstance(content, dict) and content:
            return OmegaConf.create(text)
    except Exception as exc:  # yaml errors come in several types
        raise ScenarioError("scenario", path, f"valid YAML ({_yaml_problem(exc)})") from None
    shown = "null" if content is None else "a list" if isinstance(content, list) and content else repr(content)
    what = "the file is empty" if yaml.compose(text) is None else f"the file holds {shown}"  # None: no document
    raise ScenarioError("scenario", path, f"a YAML mapping of scenario keys ({', '.join(TOP_LEVEL_KEYS[:4])}, ...); "
                                          f"{what}")


def _yaml_problem(exc: Exception) -> str:
    """Where and what a YAML error is: "line L, column C: problem" (1-based) when the parser marked it."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem or type(exc).__name__}"
    return first_line(exc)


def _parse_overrides(overrides) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ScenarioError("override", item, "key=value, e.g. algorithm.lr=0.1")
    layer = OmegaConf.create()
    for item in overrides:  # one at a time, so that a value that is not YAML is named
        try:
            layer.merge_with_dotlist([item])
        except OmegaConfBaseException as exc:
            raise ScenarioError("override", " ".join(overrides), f"key=value pairs ({exc})") from None
        except yaml.YAMLError as exc:
            key, value = item.split("=", 1)
            problem = getattr(exc, "problem", None) or first_line(exc)
            raise ScenarioError(key, value, f"a YAML value ({problem})") from None
    return layer


def _check_layer(layer: DictConfig, schema: DictConfig, prefix: str = "", what: str = "a known key",
                 from_file: bool = False) -> None:
    """Reject keys the schema does not declare (listing the allowed ones; a key of other algorithms
    that the scenario file, ``from_file``, sets can be unset by override) and values of the wrong
    shape: a section needs a mapping, a list a list, and each entry of a list of sections (such
    as ``system.compute.tiers``) a mapping of that entry's keys, with values of their types."""
    for name in layer.keys():
        path = f"{prefix}{name}"
        if name not in schema:
            allowed = ", ".join(str(k) for k in schema.keys()) or "no name yet"
            if path == "sweep":
                suggestion, hint = "", "; a sweep: section is run by raysim sweep FILE"
            else:
                suggestion, owned = _suggestion(path, str(name), schema)
                hint = f"; ~{path} unsets it" if owned and from_file else ""
            raise ScenarioError(path, _raw(layer, name), f"{what}{suggestion}; allowed here: {allowed}{hint}")
        declared, child = schema._get_node(name), layer._get_node(name)
        if child._is_interpolation() or (child._is_none() and declared._metadata.optional):
            continue
        section = declared._metadata.ref_type
        if dataclasses.is_dataclass(section):
            _check_entry(layer, name, section, path, what)
        elif isinstance(declared, ListConfig):
            entry = declared._metadata.element_type
            require(isinstance(child, ListConfig), path, _raw(layer, name), f"a list of {_type_name(entry)}")
            for i in range(len(child)):
                if dataclasses.is_dataclass(entry):
                    _check_entry(child, i, entry, f"{path}[{i}]", what)
                elif entry in (int, float, str, bool):  # omegaconf lets a list or a mapping stand in for one
                    require(not isinstance(child._get_node(i), (DictConfig, ListConfig)), f"{path}[{i}]",
                            _raw(child, i), f"a value of type {_type_name(entry)}")
        elif isinstance(declared, DictConfig):  # a free-form mapping, e.g. model.options
            require(isinstance(child, DictConfig), path, _raw(layer, name), "a mapping of keys to values")


def _suggestion(path: str, name: str, schema: DictConfig) -> tuple[str, bool]:
    """For an unknown key: in the algorithm section, the built-in algorithms that take it; else a
    close name among the section's keys. True with the first: the key is another algorithm's."""
    owners = ([n for n, builtin in ALGORITHMS.items() if field_of(builtin.keys, name)]
              if path.startswith("algorithm.") else [])
    if owners:
        return f" ({name} is a key of {', '.join(owners)})", True
    close = difflib.get_close_matches(name, [str(k) for k in schema.keys()], n=1)
    return (f" (did you mean {close[0]}?)" if close else ""), False


def _check_entry(parent, key, section: type, path: str, what: str) -> None:
    """``parent[key]`` holds a mapping of the keys of ``section`` (a dataclass) with values of their types."""
    child, schema = parent._get_node(key), OmegaConf.structured(section)
    require(isinstance(child, DictConfig), path, _raw(parent, key),
            "a mapping of keys (" + ", ".join(schema.keys()) + ")")
    _check_layer(child, schema, path + ".", what)
    try:
        OmegaConf.merge(schema, OmegaConf.create(OmegaConf.to_container(child)))
    except OmegaConfBaseException as exc:
        raise _translate(exc, section, path + ".") from None


def _raw(layer: DictConfig, key) -> Any:
    value = layer._get_node(key)._value()
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value


def _translate(exc: OmegaConfBaseException, schema: type = Scenario, prefix: str = "") -> ScenarioError:
    """Turn an omegaconf merge/resolve error into a one-line ScenarioError (``schema``: the
    dataclass whose merge failed; ``prefix``: its section's path)."""
    key = getattr(exc, "full_key", None) or "scenario"
    if isinstance(exc, (InterpolationResolutionError, GrammarParseError)):
        return ScenarioError(prefix + key, "${...}", f"an interpolation that resolves ({first_line(exc)})")
    return ScenarioError(prefix + key, getattr(exc, "value", None), f"a value of type {_declared_type(key, schema)}")


def _declared_type(key: str, schema: type = Scenario) -> str:
    """The schema's type for a dotted key, e.g. 'int', 'Optional[float]' or, for 'model.hidden[1]', 'int'."""
    node = OmegaConf.structured(schema)
    for name, index in PATH_PARTS.findall(key):
        if name:
            node = node._get_node(name)
            declared = node._metadata.ref_type
        else:
            declared = node._metadata.element_type
            node = OmegaConf.structured(declared) if dataclasses.is_dataclass(declared) else None
    return _type_name(declared)


def _type_name(declared) -> str:
    """A type as a scenario author writes it: 'int', 'List[Tier]', 'Optional[float]'."""
    if hasattr(declared, "__args__"):
        return re.sub(r"\b(?:\w+\.)+", "", str(declared))
    return getattr(declared, "__name__", str(declared))


# ----------------------------------------------------------------------------- validation

def _custom_or_one_of(path: str, name: str, builtins, options, what: str) -> None:
    """``name`` is a built-in, or ``package.module:function`` that imports to a callable; the
    section's ``options`` (keyword arguments) are only for such a function."""
    if ":" not in name:
        require_one_of(path, name, builtins)
        section = path.rsplit(".", 1)[0]
        require(not options, f"{section}.options", OmegaConf.to_container(options), f"no setting (it applies only "
                f"with a custom {path}: package.module:function; here {path} = {name!r})")
    elif not callable(import_object(path, name, what)):
        raise ScenarioError(path, name, what)


def check_curvature(size: int) -> None:
    """``eval.curvature`` needs a full Hessian: refuse models of more than CURVATURE_MAX_PARAMETERS parameters."""
    if size > CURVATURE_MAX_PARAMETERS:
        raise ScenarioError("eval.curvature", True, f"false for a model of {size} parameters (a full Hessian: at "
                                                    f"most {CURVATURE_MAX_PARAMETERS})")


def model_size(cfg) -> int:
    """Parameters of the scenario's model, counted from its keys (0 for a custom model or data kind)."""
    _, features, classes, _, _ = data_shape(cfg.data)
    return parameter_count(cfg.model, features, classes)[0]


def check_clients_per_round(cfg, num_clients: int) -> None:
    """A synchronous round samples at most every one of the data set's ``num_clients`` clients."""
    k = cfg.execution.clients_per_round
    require(cfg.execution.mode != "sync" or 1 <= k <= num_clients, "execution.clients_per_round", k,
            f"an integer in [1, {num_clients}] (the data set's number of clients)")


def check_eval_clients(clients: int | None, num_clients: int) -> None:
    """``eval.clients`` is null or at most the number of clients."""
    require(clients is None or clients <= num_clients, "eval.clients", clients,
            f"null (every client) or an integer in [1, {num_clients}] (the data set's number of clients)")


def validate(cfg: DictConfig, explicit=(), unsettable=frozenset()) -> None:
    """Check every value of a merged scenario, then that none of the ``explicit`` keys (dotted
    paths the scenario sets) would be ignored; raise ScenarioError on the first bad one (for
    one of ``unsettable``, set by the scenario rather than an override, it names ``~KEY``)."""
    require(bool(re.fullmatch(r"[A-Za-z0-9_.\-]+", cfg.name)), "name", cfg.name,
            "a non-empty name of letters, digits, '.', '_' or '-'")
    require(0 <= cfg.seed <= INT64_MAX, "seed", cfg.seed, f"an integer in [0, {INT64_MAX}]")
    check_num_clients(cfg.data.num_clients)
    check_numbers(cfg)

    d = cfg.data
    _custom_or_one_of("data.kind", d.kind, DATASETS, d.options, "a function returning a raysim.data.FederatedDataset")
    require(0.0 <= d.test_fraction < 1.0, "data.test_fraction", d.test_fraction, "a number in [0, 1)")
    non_negative("data.alpha", d.alpha)
    non_negative("data.beta", d.beta)
    if d.kind in SPLIT_KINDS:
        p = d.partition
        require_one_of("data.partition.kind", p.kind, PARTITIONERS)
        check_values(cfg, PartitionConfig, "data.partition")
        if p.kind == "pathological":
            require(d.num_clients % 2 == 0, "data.num_clients", d.num_clients,
                    "an even number with data.partition.kind=pathological")
    if d.kind in DATA_FILES:
        exists = os.path.isdir if d.kind in PARTITIONED_FILES else os.path.exists
        require(d.path is not None and exists(d.path), "data.path", d.path, "an existing " + DATA_FILES[d.kind])
    if d.image_shape is not None and d.kind == "synthetic_images":
        require(len(d.image_shape) == 3 and all(s > 0 for s in d.image_shape) and d.image_shape[1] % 4 == 0
                and d.image_shape[2] % 4 == 0, "data.image_shape", list(d.image_shape),
                "[channels, height, width] of positive sizes, height and width multiples of 4")
    elif d.image_shape is not None:
        require(len(d.image_shape) in (2, 3) and all(s > 0 for s in d.image_shape), "data.image_shape",
                list(d.image_shape), "[height, width] or [channels, height, width] of positive sizes")
    if d.kind in ("blobs", "synthetic_images"):
        require(isinstance(d.num_classes, int) and d.num_classes >= 2, "data.num_classes", d.num_classes,
                "an integer >= 2")
    check_values(cfg, DataConfig, "data")

    m = cfg.model
    _custom_or_one_of("model.kind", m.kind, MODELS, m.options, "a function returning a torch.nn.Module")
    require((m.kind == "quadratic") == (d.kind == "quadratic"), "model.kind", m.kind,
            "quadratic with data.kind=quadratic" if d.kind == "quadratic"
            else "a model for row data (not quadratic, which needs data.kind=quadratic)")
    require((m.kind == "bilinear") == (d.kind == "saddle"), "model.kind", m.kind,
            "bilinear with data.kind=saddle" if d.kind == "saddle"
            else "a model for this data (not bilinear, which needs data.kind=saddle)")
    check_values(cfg, ModelConfig, "model")
    if cfg.eval.curvature:
        require(d.kind != "quadratic", "eval.curvature", True,
                "false with data.kind=quadratic (its exact metrics are logged at every server step already)")
        check_curvature(model_size(cfg))  # a custom model is checked once built (simulation.prepare)
    personal = m.personal if isinstance(m.personal, str) else OmegaConf.to_container(m.personal)
    require(personal in PERSONAL_MODES or (isinstance(personal, list) and personal
                                           and all(isinstance(x, str) for x in personal)),
            "model.personal", personal,
            "one of " + ", ".join(PERSONAL_MODES) + ", or a list of parameter-name patterns")
    require_one_of("model.personal_state", m.personal_state, ["stateful", "stateless"])
    check_init(personal, m.personal_init)  # personal_init is one of PERSONAL_INITS, and fits the split
    require(all(h > 0 for h in m.hidden), "model.hidden", list(m.hidden), "a list of positive layer sizes")
    require_one_of("model.activation", m.activation, ACTIVATIONS)
    require(len(m.channels) > 0 and all(c > 0 for c in m.channels), "model.channels", list(m.channels),
            "a non-empty list of positive channel counts")

    keys = algorithm_keys(cfg.algorithm.name)
    check_values(cfg, keys, "algorithm")

    e = cfg.execution
    require_one_of("execution.mode", e.mode, ["async", "sync"])
    if e.deadline is not None:
        positive("execution.deadline", e.deadline)
    require(e.over_selection >= 1.0, "execution.over_selection", e.over_selection,
            "a factor >= 1 (1: no over-selection)")
    require_one_of("execution.aggregation", e.aggregation, ["fedasync", "fedbuff"])
    require_one_of("execution.staleness.kind", e.staleness.kind, ["constant", "hinge", "polynomial"])
    non_negative("execution.staleness.a", e.staleness.a)
    non_negative("execution.staleness.b", e.staleness.b)
    if e.max_virtual_time is not None:
        positive("execution.max_virtual_time", e.max_virtual_time)
    if e.target_accuracy is not None:
        require(0 < e.target_accuracy <= 1, "execution.target_accuracy", e.target_accuracy, "a number in (0, 1]")
    if e.mode == "async":
        require(e.max_updates is not None or e.max_virtual_time is not None, "execution.max_updates", None,
                "a budget for async mode: execution.max_updates or execution.max_virtual_time "
                "(execution.target_accuracy may stop it earlier)")
        if e.target_accuracy is not None:
            require(cfg.eval.every > 0, "eval.every", cfg.eval.every,
                    "> 0 with execution.target_accuracy (accuracy is only known at evaluations)")
    if d.kind not in CLIENTS_FROM_FILES:  # else the files decide: checked once read
        check_clients_per_round(cfg, d.num_clients)
    check_values(cfg, ExecutionConfig, "execution")

    r = cfg.runtime
    require_one_of("runtime.backend", r.backend, ["local", "ray"])
    require_one_of("runtime.scheduler", r.scheduler, ["actor", "auto", "driver"])
    require_one_of("runtime.placement", r.placement, ["pack", "spread"])
    na = r.num_actors
    require(na == "auto" or (isinstance(na, int) and not isinstance(na, bool) and na > 0),
            "runtime.num_actors", na, "a positive integer or 'auto'")
    positive("runtime.cpus_per_actor", r.cpus_per_actor)
    non_negative("runtime.gpus_per_actor", r.gpus_per_actor)
    require(r.gpus_per_actor <= 1 or float(r.gpus_per_actor).is_integer(), "runtime.gpus_per_actor",
            r.gpus_per_actor, "a fraction in [0, 1] or a whole number of GPUs")
    if r.num_gpus is not None:
        non_negative("runtime.num_gpus", r.num_gpus)
    cpt = r.clients_per_task
    require(cpt == "auto" or (isinstance(cpt, int) and not isinstance(cpt, bool) and cpt > 0),
            "runtime.clients_per_task", cpt, "a positive integer or 'auto'")
    check_values(cfg, RuntimeConfig, "runtime")
    if r.backend == "ray":
        for path in ("data.kind", "model.kind", "algorithm.name", "algorithm.aggregator"):
            target = OmegaConf.select(cfg, path)
            require(not (isinstance(target, str) and target.startswith("__main__:")), path, target,
                    "a package.module:name that Ray's worker processes can import (__main__ is the driver's "
                    "script there: move the definition into a module, or use runtime.backend=local)")

    validate_system(cfg.system, None if d.kind in CLIENTS_FROM_FILES else d.num_clients)
    _check_byzantine(cfg)

    v = cfg.eval
    check_values(cfg, EvalConfig, "eval")
    if d.kind not in CLIENTS_FROM_FILES:  # else the files decide the number of clients: checked once read
        check_eval_clients(v.clients, d.num_clients)

    require(bool(str(cfg.output.dir).strip()), "output.dir", cfg.output.dir, "a directory path")
    check_values(cfg, OutputConfig, "output")
    from raysim.metrics.tensorboard import check_tensorboard  # pyarrow: loaded by the run, not by validation

    check_tensorboard(cfg.output)

    for path in explicit:
        why = _ignored(cfg, keys, path)
        if why is None and path == "data.test_fraction":
            why = own_split(d.kind, d.path)
        if why is not None:
            value = OmegaConf.select(cfg, path)
            unset = f"; ~{path.split('[')[0]} unsets it" if path in unsettable else ""  # a list: all of it
            raise ScenarioError(path, OmegaConf.to_container(value) if OmegaConf.is_config(value) else value,
                                f"no setting ({why}){unset}")
    if field_of(keys, "aggregator") is not None and cfg.data.kind not in CLIENTS_FROM_FILES:  # else: prepare
        check_aggregator(cfg, cfg.data.num_clients)
    keys.check(cfg)


def _ignored(cfg: DictConfig, keys: type, path: str) -> str | None:
    """Why the key at ``path`` would be ignored by the scenario ``cfg`` (``keys``: its algorithm's
    keys dataclass), or None if it applies."""
    section, _, rest = path.partition(".")
    return (inapplicable(cfg, keys, "algorithm", rest) if section == "algorithm"
            else inapplicable(cfg, Scenario, "", path))


def _check_byzantine(cfg: DictConfig) -> None:
    """Byzantine clients exist if asked for, and their attack fits the data and the execution mode."""
    b, e, d = cfg.system.byzantine, cfg.execution, cfg.data
    if b.fraction > 0 and d.kind not in CLIENTS_FROM_FILES:
        require(byzantine_count(b, d.num_clients) > 0, "system.byzantine.fraction", b.fraction,
                f"0, or a share that marks at least one of the data.num_clients={d.num_clients} clients "
                f"(round(fraction × clients) Byzantine clients)")
    if b.attack == "label_flip":
        require(cfg.data.kind != "quadratic", "system.byzantine.attack", b.attack,
                "an update attack (sign_flip, gaussian, nan, alie, ipm) with data.kind=quadratic (its clients "
                "have no labels to flip)")
    if b.attack in OMNISCIENT_ATTACKS and e.mode == "async" and e.aggregation == "fedasync":
        require(b.window is not None, "system.byzantine.window", b.window,
                f"a positive number of honest updates for attack {b.attack} under execution.aggregation=fedasync "
                "(a step holds one update: the attack sees the last `window` honest ones)")


def scenario_object(container: dict) -> Scenario:
    """A validated scenario (as a plain dict) as plain dataclasses: fast attribute access for
    the hot paths of the scheduler and the client hosts (``algorithm``: its keys dataclass)."""
    scenario = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Scenario), container))
    algorithm = container["algorithm"]
    scenario.algorithm = algorithm_keys(algorithm["name"])(**algorithm)
    return scenario


def to_yaml(cfg: DictConfig) -> str:
    """The resolved scenario as YAML text, without the keys this scenario ignores (another data
    kind's, mode's or algorithm's), so that ``raysim run`` of the saved file runs it again."""
    keys = algorithm_keys(cfg.algorithm.name)
    content = OmegaConf.to_container(cfg, resolve=True)
    for path in _leaf_paths(cfg):
        if _ignored(cfg, keys, path) is not None:
            *parents, leaf = [name or int(index) for name, index in PATH_PARTS.findall(path)]
            node = content
            for part in parents:
                node = node[part]
            del node[leaf]
    return OmegaConf.to_yaml(OmegaConf.create(_without_empty(content)))


def _without_empty(node):
    """A mapping without the sub-mappings that are left empty."""
    if not isinstance(node, dict):
        return node
    kept = {k: _without_empty(v) for k, v in node.items()}
    return {k: v for k, v in kept.items() if v != {} or not isinstance(node[k], dict)}
