"""The scenario's checks, each run once: what the keys alone decide, in :func:`validate` (when the
scenario is loaded, before Ray starts); what needs the built data set or model, in
:func:`check_built`, right after they are built.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
from omegaconf import DictConfig, OmegaConf

from raysim.algorithms.keys import check_aggregator
from raysim.catalog import (ACTIVATIONS, MODELS, PERSONAL_MODES, algorithm_class, algorithm_keys, check_init,
                            check_model_data, parameter_count)
from raysim.data._checks import check_num_clients
from raysim.data.federated import FederatedDataset
from raysim.data.files import own_split
from raysim.data.generated import GeneratedDataset
from raysim.data.kinds import CLIENTS_FROM_FILES, DATA_FILES, DATASETS, PARTITIONED_FILES
from raysim.data.partition import PARTITIONERS
from raysim.data.sizes import data_shape
from raysim.errors import SHOWN_VALUE, ScenarioError, shortened
from raysim.importing import import_object
from raysim.scenario.schema import (SPLIT_KINDS, DataConfig, EvalConfig, ExecutionConfig, ModelConfig, OutputConfig,
                                    PartitionConfig, RuntimeConfig, Scenario, SelectionConfig)
from raysim.schema import (INT64_MAX, check_numbers, check_values, field_of, inapplicable, non_negative, positive,
                           require, require_one_of)
from raysim.privacy.accounting import accountant_kind, participation_law
from raysim.communication.config import DownlinkConfig, SecureAggregationConfig, UplinkConfig
from raysim.privacy.config import AdaptiveClipConfig, PrivacyConfig
from raysim.system import validate_system
from raysim.system.config import OMNISCIENT_ATTACKS, byzantine_count

OUTPUT_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "abfs", "abfss")  # pyarrow's, but its in-memory mock://
CURVATURE_MAX_PARAMETERS = 2000  # eval.curvature's full float64 Hessian: at most 32 MB, and P passes per evaluation


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


def check_eval_clients(cfg, num_clients: int) -> None:
    """``eval.clients`` is null or at most the number of clients; ``eval.new_clients`` leaves a round's
    clients to train."""
    clients, new = cfg.eval.clients, cfg.eval.get("new_clients", 0)
    require(clients is None or clients <= num_clients - new, "eval.clients", clients,
            f"null (every client) or an integer in [1, {num_clients - new}] (the data set's number of clients"
            + (f", less eval.new_clients = {new})" if new else ")"))
    if new and cfg.execution.mode == "sync":
        room = num_clients - math.ceil(cfg.execution.over_selection * cfg.execution.clients_per_round)
        require(new <= room, "eval.new_clients", new,
                f"at most {room}: the {num_clients} clients less those a round samples (the held-out clients "
                "never train)")


def _check_new_clients(cfg: DictConfig) -> None:
    """New-client evaluation holds clients out of synchronous rounds drawn uniformly (or by a
    selection policy that samples from the clients it is shown)."""
    new, e = cfg.eval.get("new_clients", 0), cfg.execution
    if not new:
        return
    require(e.mode == "sync", "eval.new_clients", new, "0 in async mode (held-out clients: synchronous rounds only)")
    require(e.sampling == "uniform", "eval.new_clients", new,
            "0 with execution.sampling=poisson (each client's chance of taking part would not be q)")
    require(e.selection.kind != "importance", "eval.new_clients", new,
            "0 with execution.selection.kind=importance (its inclusion chances assume every client can be drawn)")


def validate(cfg: DictConfig, explicit=(), unsettable=frozenset()) -> None:
    """Check every value of a merged scenario, then that none of the ``explicit`` keys (dotted
    paths the scenario sets) would be ignored; raise ScenarioError on the first bad one (for
    one of ``unsettable``, set by the scenario rather than an override, it names ``~KEY``)."""
    require(bool(re.fullmatch(r"[A-Za-z0-9_.\-]+", cfg.name)) and cfg.name.strip(".") != "", "name", cfg.name,
            "a non-empty name of letters, digits, '.', '_' or '-', not only dots (it names the run's directory)")
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
        check_curvature(model_size(cfg))  # a custom model is checked once built (check_model)
    personal = m.personal if isinstance(m.personal, str) else OmegaConf.to_container(m.personal)
    require(personal in PERSONAL_MODES or (isinstance(personal, list) and personal
                                           and all(isinstance(x, str) for x in personal)),
            "model.personal", personal,
            "one of " + ", ".join(PERSONAL_MODES) + ", or a list of parameter-name patterns")
    require_one_of("model.personal_state", m.personal_state, ["stateful", "stateless"])
    check_init(personal, m.personal_init)  # personal_init is one of PERSONAL_INITS, and fits the split
    if personal == "normalization" and m.kind in MODELS and not MODELS[m.kind].normalization:
        raise ScenarioError("model.kind", m.kind, "a model with normalization layers (BatchNorm, GroupNorm or "
                            "LayerNorm) for model.personal=normalization (FedBN's split): "
                            + ", ".join(kind for kind, model in MODELS.items() if model.normalization)
                            + " or package.module:function")
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
    check_values(cfg, PrivacyConfig, "privacy")
    check_values(cfg, AdaptiveClipConfig, "privacy.adaptive_clip")
    _check_sampling(cfg)
    _check_selection(cfg)
    _check_privacy(cfg)
    check_values(cfg, UplinkConfig, "communication.uplink")
    _check_uplink(cfg)
    check_values(cfg, DownlinkConfig, "communication.downlink")
    check_values(cfg, SecureAggregationConfig, "communication.secure_aggregation")
    _check_secure_aggregation(cfg)

    v = cfg.eval
    check_values(cfg, EvalConfig, "eval")
    if d.kind not in CLIENTS_FROM_FILES:  # else the files decide the number of clients: checked once read
        check_eval_clients(cfg, d.num_clients)
    _check_new_clients(cfg)

    require(bool(str(cfg.output.dir).strip()), "output.dir", cfg.output.dir, "a directory path")
    scheme = str(cfg.output.dir).partition("://")[0] if "://" in str(cfg.output.dir) else None
    require(scheme is None or scheme in OUTPUT_SCHEMES, "output.dir", cfg.output.dir,
            f"a local path or a URI of a lasting filesystem ({', '.join(s + '://' for s in OUTPUT_SCHEMES)})")
    check_values(cfg, OutputConfig, "output")
    from raysim.output.tensorboard import check_tensorboard  # pyarrow: loaded by the run, not by validation

    check_tensorboard(cfg.output)

    _refuse_ignored(cfg, keys, explicit, unsettable)
    if field_of(keys, "aggregator") is not None and cfg.data.kind not in CLIENTS_FROM_FILES:  # else: prepare
        check_aggregator(cfg, cfg.data.num_clients)
    keys.check(cfg)


def _refuse_ignored(cfg, keys, explicit, unsettable) -> None:
    """ScenarioError naming every one of the ``explicit`` keys this scenario would ignore, in one
    message (the first as key = value, the others after it), and how to unset them."""
    ignored = []
    for path in explicit:
        why = why_ignored(cfg, keys, path)
        if why is None and path == "data.test_fraction":
            why = own_split(cfg.data.kind, cfg.data.path)
        if why is not None:
            value = OmegaConf.select(cfg, path)
            ignored.append((path, OmegaConf.to_container(value) if OmegaConf.is_config(value) else value, why))
    if not ignored:
        return
    unset = list(dict.fromkeys(f"~{path.split('[')[0]}" for path, _, _ in ignored if path in unsettable))  # a list: all
    (path, value, why), others = ignored[0], ignored[1:]
    more = "".join(f"; nor does {p} = {shortened(repr(v), SHOWN_VALUE)} ({w})" for p, v, w in others)
    hint = f"; {' '.join(unset)} {'unsets it' if len(unset) == 1 else 'unset them'}" if unset else ""
    raise ScenarioError(path, value, f"no setting ({why}){more}{hint}")


def check_data_set(cfg, dataset) -> None:
    """What needs the built data set, checked right after it is built (before Ray starts): the
    built-in model kind takes its shape and classes, the algorithm's ``check_data`` accepts its
    clients' training rows, and where the files decide the clients (parquet, leaf),
    ``clients_per_round``, ``eval.clients`` and the aggregator's inputs fit their number (from
    the keys alone, :func:`validate` checks them for every other kind)."""
    check_model_data(cfg.model.kind, dataset.feature_shape, dataset.num_classes,
                     cfg.data.path if cfg.data.kind in DATA_FILES else None)
    if cfg.model.kind in MODELS and MODELS[cfg.model.kind].batch_statistics:
        check_full_batches(cfg, dataset.train_sizes())
    if isinstance(dataset, (FederatedDataset, GeneratedDataset)):
        check_data = getattr(algorithm_keys(cfg.algorithm.name), "check_data", None)
        if check_data is not None:
            check_data(cfg, dataset.train_sizes())
    if cfg.data.kind in CLIENTS_FROM_FILES:
        check_clients_per_round(cfg, dataset.num_clients)
        check_eval_clients(cfg, dataset.num_clients)
        if "aggregator" in cfg.algorithm:
            check_aggregator(cfg, dataset.num_clients)


def check_model(cfg, model, dataset) -> None:
    """What needs the built model, checked once it is built: a custom model's size for
    ``eval.curvature`` (a built-in's is counted from its keys by :func:`validate`), and whether a
    custom model that normalizes by batch statistics gets full batches (a built-in's is checked
    with the data set, :func:`check_data_set`)."""
    if ":" in cfg.model.kind:
        if cfg.eval.curvature:
            check_curvature(model.size)
        if model.batch_statistics:
            check_full_batches(cfg, dataset.train_sizes())


def check_full_batches(cfg, train_sizes) -> None:
    """A model that normalizes each minibatch by its own statistics (BatchNorm) trains on full
    minibatches only: a short batch is padded to its task's widest, and the padding rows would
    enter the statistics, so a client's steps would depend on the clients it shares a task with.
    Hence a fixed number of steps (``local_steps``, FedRep's ``head_steps``; no epochs) of
    ``batch_size`` rows that every client has, and no ``eval.personalized_epochs``."""
    a, why = cfg.algorithm, (f"with model.kind={cfg.model.kind}, which normalizes each minibatch by its own "
                             "statistics: a short batch's padding would enter them")
    if "local_epochs" in a:
        require(a.get("local_steps") is not None, "algorithm.local_steps", a.get("local_steps"),
                f"a number of steps {why} (passes over the rows end in a short batch)")
    if "head_epochs" in a:
        require(a.get("head_steps") is not None, "algorithm.head_steps", a.get("head_steps"),
                f"a number of steps {why} (passes over the rows end in a short batch)")
    require(cfg.eval.personalized_epochs == 0, "eval.personalized_epochs", cfg.eval.personalized_epochs,
            f"0 (use eval.personalized_steps) {why}")
    batch = a.get("batch_size")
    require(batch is not None, "algorithm.batch_size", batch, f"a minibatch size {why} (full-batch steps pad "
                                                              "smaller clients)")
    fewest = int(np.argmin(train_sizes))
    short = int((train_sizes < batch).sum())
    require(short == 0, "algorithm.batch_size", batch,
            f"at most {int(train_sizes[fewest])}, the training rows of client {fewest} ({short} of "
            f"{len(train_sizes)} clients have fewer than {batch}), {why}")


def why_ignored(cfg: DictConfig, keys: type, path: str) -> str | None:
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


def _check_sampling(cfg: DictConfig) -> None:
    """Poisson sampling draws each client with the same probability: every client always available,
    and every client drawn counts (no over-selection)."""
    e = cfg.execution
    if e.mode == "sync" and e.sampling == "poisson":
        _draws_each_client_by_chance(cfg, "execution.sampling=poisson", "clients_per_round / N")


def _draws_each_client_by_chance(cfg: DictConfig, setting: str, chance: str) -> None:
    """A round that draws each client independently with a known ``chance`` keeps every client it
    draws (no over-selection) and can draw every client (always available)."""
    e = cfg.execution
    require(e.over_selection == 1, "execution.over_selection", e.over_selection,
            f"1 with {setting} (such a round keeps every client it draws)")
    kind = cfg.system.availability.kind
    require(kind == "always", "system.availability.kind", kind,
            f"always with {setting} (each client's probability of taking part is {chance} only if every client "
            "can be drawn)")


def _check_selection(cfg: DictConfig) -> None:
    """A selection policy chooses among uniform-sampling rounds: d ≥ the round's clients (and at most
    N); importance sampling's inclusion chances need every client available and no over-selection."""
    e = cfg.execution
    if e.mode != "sync":
        return
    check_values(cfg, SelectionConfig, "execution.selection")
    s = e.selection
    if s.kind == "uniform":
        return
    require(e.sampling == "uniform", "execution.sampling", e.sampling,
            f"uniform with execution.selection.kind={s.kind} (the policy chooses the round's clients)")
    round_size = math.ceil(e.over_selection * e.clients_per_round)
    if s.kind == "power_of_choice" and s.candidates is not None:
        require(s.candidates >= round_size, "execution.selection.candidates", s.candidates,
                f"at least the clients a round samples, {round_size} (d < k leaves too few to keep)")
        if cfg.data.kind not in CLIENTS_FROM_FILES:
            require(s.candidates <= cfg.data.num_clients, "execution.selection.candidates", s.candidates,
                    f"at most data.num_clients = {cfg.data.num_clients}")
    if s.kind == "oort":
        require(s.exploration_min <= s.exploration, "execution.selection.exploration_min", s.exploration_min,
                f"at most execution.selection.exploration = {s.exploration}")
    if s.kind == "importance":
        _draws_each_client_by_chance(cfg, "execution.selection.kind=importance", "min(1, clients_per_round · its share)")


def _check_privacy(cfg: DictConfig) -> None:
    """Differential privacy's keys agree with each other and with the algorithm: one of
    noise_multiplier and target_epsilon (the latter with a planned number of rounds), the mean
    aggregator under central DP, no update beside the one clipped, an accountant that can compose
    the run's events."""
    p = cfg.privacy
    if p.mechanism == "none":
        return
    require((p.noise_multiplier is None) != (p.target_epsilon is None), "privacy.noise_multiplier",
            p.noise_multiplier, f"a number >= 0, or null with privacy.target_epsilon set (here target_epsilon = "
            f"{p.target_epsilon}): set exactly one of them")
    if p.target_epsilon is not None:
        require(cfg.execution.mode == "sync", "privacy.target_epsilon", p.target_epsilon,
                "null in async mode (how often a client takes part is not planned there: set noise_multiplier)")
        require(p.mechanism != "dp_ftrl", "privacy.target_epsilon", p.target_epsilon,
                "null with privacy.mechanism=dp_ftrl (its ε follows from which tree nodes each client's "
                "participations reach, which no plan fixes: set noise_multiplier)")
    aggregator = cfg.algorithm.get("aggregator", "mean")
    require(p.mechanism != "central" or aggregator == "mean", "algorithm.aggregator", aggregator,
            "mean with privacy.mechanism=central (its noise is calibrated to the sensitivity of the clipped "
            "updates' sum, which a robust rule does not have)")
    uploads = algorithm_class(cfg.algorithm.name).uploads
    require(not uploads, "algorithm.name", cfg.algorithm.name,
            f"an algorithm whose clients upload only their update with privacy.mechanism={p.mechanism} "
            f"({cfg.algorithm.name} also uploads {', '.join(uploads)}, which clipping and noise would not cover)")
    law = participation_law(cfg, cfg.data.num_clients)  # its kind: the keys decide it
    require(accountant_kind(p, law) != "pld" or law.kind != "fixed_size", "privacy.accountant", p.accountant,
            "rdp or auto with uniform fixed-size sampling (dp-accounting's PLD accountant cannot compose "
            "sampling without replacement; execution.sampling=poisson can)")


def _check_secure_aggregation(cfg: DictConfig) -> None:
    """Secure aggregation sums whole synchronous rounds of plain updates with the mean: its values fit
    its field and float64, its threshold is reachable, and no stage needs the single updates."""
    secure, e = cfg.communication.secure_aggregation, cfg.execution
    protocol = secure.protocol
    if protocol == "none":
        return
    path = "communication.secure_aggregation"
    require(e.mode == "sync", f"{path}.protocol", protocol,
            "none in async mode (FedAsync applies each update alone: there is no round to sum over; a FedBuff "
            "buffer's clients never meet to agree on masks)")
    require(secure.value_bits <= min(secure.bits, 53), f"{path}.value_bits", secure.value_bits,
            f"at most {path}.bits = {secure.bits} (a value must fit the field) and at most 53 (exact in float64)")
    if secure.threshold is not None:
        require(secure.threshold <= e.clients_per_round, f"{path}.threshold", secure.threshold,
                f"at most execution.clients_per_round = {e.clients_per_round} (a round's survivors are at most the "
                "clients it keeps)")
    aggregator = cfg.algorithm.get("aggregator", "mean")
    require(aggregator == "mean", "algorithm.aggregator", aggregator,
            f"mean with {path}.protocol={protocol} (the server sees only the sum of the updates)")
    uplink = cfg.communication.uplink.kind
    require(uplink == "none", "communication.uplink.kind", uplink,
            f"none with {path}.protocol={protocol} (the masked field elements are what is uploaded)")
    require(not getattr(cfg.algorithm, "client_momentum", 0.0), "algorithm.client_momentum",
            getattr(cfg.algorithm, "client_momentum", None),
            f"0 with {path}.protocol={protocol} (the server cannot keep a momentum per client it cannot see)")
    uploads = algorithm_class(cfg.algorithm.name).uploads
    require(not uploads, "algorithm.name", cfg.algorithm.name,
            f"an algorithm whose clients upload only their update with {path}.protocol={protocol} "
            f"({cfg.algorithm.name} also uploads {', '.join(uploads)})")
    b = cfg.system.byzantine
    require(b.fraction == 0 and not b.clients, "system.byzantine.fraction", b.fraction,
            f"0 with {path}.protocol={protocol} (Byzantine clients under secure aggregation are not modelled)")


def _check_uplink(cfg: DictConfig) -> None:
    """An encoded upload is the update alone, and local DP's noise would undo any encoding."""
    kind = cfg.communication.uplink.kind
    if kind == "none":
        return
    uploads = algorithm_class(cfg.algorithm.name).uploads
    require(not uploads, "algorithm.name", cfg.algorithm.name,
            f"an algorithm whose clients upload only their update with communication.uplink.kind={kind} "
            f"({cfg.algorithm.name} also uploads {', '.join(uploads)}, which the encoding would not cover)")
    require(cfg.privacy.mechanism != "local", "communication.uplink.kind", kind,
            "none with privacy.mechanism=local (each client's dense noise comes after the encoding and undoes it)")
    if kind == "qsgd":
        coding = cfg.communication.uplink.coding
        require(coding == "fixed" or cfg.execution.mode == "sync", "communication.uplink.coding", coding,
                "fixed in async mode (an Elias-coded upload's size, so its arrival, is known only once the update "
                "is computed; asynchronous dispatch times a task before computing it)")
