"""The names a scenario may give to models, activations, the personal split and algorithms: the
one registry of built-in algorithms (implementation, keys, client state kept) and of model kinds
(their layouts, from which their parameters are counted before they are built), with one line
each for ``raysim list``.

Torch-free on purpose: a scenario is validated (and Ray's start-up begun) before torch
loads. The builders (:mod:`raysim.models`, :mod:`raysim.algorithms`) map these names to code.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing

from raysim.algorithms import keys
from raysim.data.leaf import FEMNIST_SHAPE, SHAKESPEARE_LENGTH  # the shapes char_lstm and femnist_cnn take
from raysim.errors import ScenarioError
from raysim.importing import import_object

ACTIVATIONS = ("elu", "relu", "sigmoid", "tanh")

PERSONAL_MODES = ("none", "input_layer", "output_layer", "adapter", "normalization")
PERSONAL_INITS = ("random", "zero", "global")


class BuiltinAlgorithm(typing.NamedTuple):
    """A built-in algorithm, declared once: its implementation (``module:Class``), its keys, and the
    parameter-sized vectors it keeps per visited client (the memory estimate's client state; its
    class's ``stateful`` says the same to the engine). ``keeps_personal``: it keeps the personal
    part w instead, with ``model.personal_state: stateful``."""

    implementation: str
    keys: type
    kept_vectors: int = 0
    keeps_personal: bool = False


ALGORITHMS = {  # the one registry of built-ins
    "fedavg": BuiltinAlgorithm("raysim.algorithms.fedavg:FedAvg", keys.FedAvgKeys),
    "fedprox": BuiltinAlgorithm("raysim.algorithms.fedavg:FedProx", keys.FedProxKeys),
    "fedavgm": BuiltinAlgorithm("raysim.algorithms.fedavg:FedAvgM", keys.FedAvgMKeys),
    "fedadam": BuiltinAlgorithm("raysim.algorithms.fedavg:FedAdam", keys.FedAdamKeys),
    "fedyogi": BuiltinAlgorithm("raysim.algorithms.fedavg:FedYogi", keys.FedYogiKeys),
    "fedadagrad": BuiltinAlgorithm("raysim.algorithms.fedavg:FedAdagrad", keys.FedAdagradKeys),
    "feddyn": BuiltinAlgorithm("raysim.algorithms.feddyn:FedDyn", keys.FedDynKeys, kept_vectors=1),
    "fedacg": BuiltinAlgorithm("raysim.algorithms.fedacg:FedACG", keys.FedACGKeys),
    "scaffold": BuiltinAlgorithm("raysim.algorithms.scaffold:Scaffold", keys.ScaffoldKeys, kept_vectors=1),
    "localgd": BuiltinAlgorithm("raysim.algorithms.local_gd:LocalGD", keys.LocalGDKeys),
    "ffgg": BuiltinAlgorithm("raysim.algorithms.ffgg:FFGG", keys.FFGGKeys, keeps_personal=True),
    "local_ffgg": BuiltinAlgorithm("raysim.algorithms.ffgg:LocalFFGG", keys.LocalFFGGKeys, keeps_personal=True),
    "l2gd": BuiltinAlgorithm("raysim.algorithms.l2gd:L2GD", keys.L2GDKeys, kept_vectors=1),
    "perfedavg": BuiltinAlgorithm("raysim.algorithms.perfedavg:PerFedAvg", keys.PerFedAvgKeys),
    "ditto": BuiltinAlgorithm("raysim.algorithms.ditto:Ditto", keys.DittoKeys, kept_vectors=1),
    "apfl": BuiltinAlgorithm("raysim.algorithms.apfl:APFL", keys.APFLKeys, kept_vectors=1),
    "pfedme": BuiltinAlgorithm("raysim.algorithms.pfedme:PFedMe", keys.PFedMeKeys, kept_vectors=1),
    "fedper": BuiltinAlgorithm("raysim.algorithms.fedrep:FedPer", keys.FedPerKeys, keeps_personal=True),
    "fedrep": BuiltinAlgorithm("raysim.algorithms.fedrep:FedRep", keys.FedRepKeys, keeps_personal=True),
    "fedbn": BuiltinAlgorithm("raysim.algorithms.fedrep:FedBN", keys.FedBNKeys, keeps_personal=True),
    "lg_fedavg": BuiltinAlgorithm("raysim.algorithms.fedrep:LGFedAvg", keys.LGFedAvgKeys, keeps_personal=True),
    "local_only": BuiltinAlgorithm("raysim.algorithms.local_only:LocalOnly", keys.LocalOnlyKeys, kept_vectors=1),
}


def algorithm_class(name: str):
    """The class that ``algorithm.name`` names: a built-in, or an imported ``package.module:Class``
    that subclasses :class:`raysim.algorithms.Algorithm` (imports torch)."""
    if name in ALGORITHMS:
        return import_object("algorithm.name", ALGORITHMS[name].implementation, "an algorithm")
    if ":" not in name:
        raise ScenarioError("algorithm.name", name, "one of " + ", ".join(sorted(ALGORITHMS))
                            + ", or package.module:Class")
    cls = import_object("algorithm.name", name, "an algorithm class")
    from raysim.algorithms.base import Algorithm

    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        got = f"class {cls.__name__}" if isinstance(cls, type) else type(cls).__name__
        raise ScenarioError("algorithm.name", name, f"a subclass of raysim.algorithms.Algorithm (got {got})")
    given = cls.Keys
    if not (isinstance(given, type) and dataclasses.is_dataclass(given) and issubclass(given, keys.StepKeys)):
        raise ScenarioError("algorithm.name", name, "an algorithm whose Keys is a dataclass derived from "
                                                    "raysim.algorithms.keys.StepKeys (such as FedAvgKeys) "
                                                    f"(its Keys is {getattr(given, '__name__', repr(given))})")
    if cls.client_update is Algorithm.client_update:
        raise ScenarioError("algorithm.name", name, "an algorithm class that defines client_update")
    _check_diagnostics(name, cls)
    try:
        declared = typing.get_type_hints(given)
    except Exception as exc:  # an annotation naming what its module does not define
        raise ScenarioError("algorithm.name", name, f"an algorithm whose Keys annotations resolve ({exc})") from None
    for field, builtin in builtin_key_types().items():
        if field in declared and declared[field] not in builtin:  # raysim reads that key as one of these types
            raise ScenarioError("algorithm.name", name, f"an algorithm whose Keys gives {field} a type raysim's keys "
                                f"of that name have ({' or '.join(map(_type_text, builtin))}), or another name to its "
                                f"own key (it declares {field}: {_type_text(declared[field])})")
    return cls


def _check_diagnostics(name: str, cls) -> None:
    """A custom class's ``server_diagnostics`` name new rounds.parquet columns (or FFGG's
    grad_norm_sq), its ``client_diagnostics`` new events.parquet columns: tuples of distinct
    identifiers; else ScenarioError."""
    for kind, (table, taken) in _log_columns().items():
        declared = getattr(cls, kind)
        if not (isinstance(declared, (tuple, list)) and all(isinstance(n, str) and n.isidentifier() for n in declared)
                and len(set(declared)) == len(declared)) or set(declared) & taken:
            allowed = "; grad_norm_sq is allowed" if kind == "server_diagnostics" else ""
            raise ScenarioError("algorithm.name", name, f"an algorithm whose {kind} is a tuple of distinct "
                                f"identifiers, none of them a column {table} already has ("
                                + ", ".join(sorted(taken)) + f"{allowed}) (it declares {declared!r})")


@functools.cache
def _log_columns() -> dict:
    """{kind of diagnostics: (the log it adds columns to, the columns that log has already)}."""
    from omegaconf import OmegaConf

    from raysim.communication.config import EVENT_COLUMNS as SECURE_AGGREGATION_COLUMNS
    from raysim.output.directory import EVENTS_SCHEMA, ROUNDS_SCHEMA  # pyarrow: only for a custom algorithm
    from raysim.privacy.config import EVENT_COLUMNS
    from raysim.system import SystemConfig, SystemModel

    profile = SystemModel(OmegaConf.structured(SystemConfig), 1, 0).profile  # each event row's client fields
    return {"server_diagnostics": ("rounds.parquet", set(ROUNDS_SCHEMA.names) - {"grad_norm_sq"}),
            "client_diagnostics": ("events.parquet", {*EVENTS_SCHEMA.names, *profile, *EVENT_COLUMNS,
                                                      *SECURE_AGGREGATION_COLUMNS})}


@functools.cache
def builtin_key_types() -> dict:
    """The types the built-in algorithms give each key name (local_steps: int, or Optional[int])."""
    types: dict = {}
    for builtin in ALGORITHMS.values():
        for name, kind in typing.get_type_hints(builtin.keys).items():
            if kind not in types.setdefault(name, []):
                types[name].append(kind)
    return types


def _type_text(kind) -> str:
    """``int``, ``Optional[int]``: a type annotation as it is written."""
    return kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")


def algorithm_keys(name: str) -> type:
    """The keys dataclass of ``algorithm.name``: torch-free for built-ins; a custom class's ``Keys``."""
    if name in ALGORITHMS:
        return ALGORITHMS[name].keys
    return algorithm_class(name).Keys


def algorithm_doc(keys_class: type) -> str:
    """The one-line description of an algorithm: its keys dataclass's docstring."""
    return " ".join((keys_class.__doc__ or "").split())


def check_init(personal, how: str) -> None:
    """Validate ``model.personal_init`` against ``model.personal``."""
    if how not in PERSONAL_INITS:
        raise ScenarioError("model.personal_init", how, "one of " + ", ".join(PERSONAL_INITS))
    if how == "zero" and personal == "adapter":
        raise ScenarioError("model.personal_init", how,
                            "random or global with model.personal=adapter (a zero LoRA pair has zero gradient)")
    if how == "zero" and personal == "normalization":
        raise ScenarioError("model.personal_init", how, "random or global with model.personal=normalization (a zero "
                                                        "normalization weight silences its layer)")


def check_model_data(kind: str, feature_shape: tuple, num_classes: int, source: str | None = None) -> None:
    """The built-in ``model.kind`` takes data of ``feature_shape`` with ``num_classes`` classes (0: the
    quadratic problem); else ScenarioError, naming ``source`` (the data's file, if it has one). Torch-free,
    so that :func:`raysim.preparation.prepare` checks it before Ray starts;
    :func:`raysim.models.build_model` checks it before building."""
    shape = [int(size) for size in feature_shape]
    seen = f"(features {'here' if source is None else f'of data.path {source!r}'} have shape {shape})"
    if ":" in kind:  # a user's factory decides
        return
    if kind == "quadratic" and num_classes != 0:
        raise ScenarioError("model.kind", kind, "data.kind=quadratic (the model of that problem)")
    if kind != "quadratic" and num_classes == 0:
        raise ScenarioError("model.kind", kind, "quadratic with data.kind=quadratic")
    if kind == "cnn" and len(shape) != 3:
        raise ScenarioError("model.kind", kind, "image data: data.kind=digits, synthetic_images, mnist, fashion_mnist, "
                            f"cifar10, cifar100 or leaf (FEMNIST), or parquet with data.image_shape set {seen}")
    if kind == "char_lstm" and shape != [SHAKESPEARE_LENGTH]:
        raise ScenarioError("model.kind", kind, f"character sequences: features of {SHAKESPEARE_LENGTH} character "
                            f"indices, as LEAF Shakespeare's {seen}")
    if kind == "femnist_cnn" and shape != list(FEMNIST_SHAPE):
        raise ScenarioError("model.kind", kind, "28x28 grey-scale images of shape [1, 28, 28] (leaf FEMNIST, mnist, "
                            f"fashion_mnist; synthetic_images with data.image_shape=[1,28,28]) {seen}")
    if kind == "bn_cnn" and (len(shape) != 3 or min(shape[1:]) < 4):
        raise ScenarioError("model.kind", kind, "image data of shape [channels, height, width], height and width at "
                            "least 4 (digits, mnist, fashion_mnist, cifar10, cifar100, leaf FEMNIST, synthetic_images, "
                            f"or parquet with data.image_shape set) {seen}")
    if kind == "resnet18_gn" and len(shape) != 3:
        raise ScenarioError("model.kind", kind, "image data of shape [channels, height, width] (cifar10, cifar100, "
                            f"synthetic_images, or parquet with data.image_shape set) {seen}")


def _resnet18_gn_body(channels: int, height: int, width: int) -> tuple[int, list]:
    """(parameters, convolution output sizes) of ResNet18GN before its Linear layer: a bias-free 3x3 stem
    to 64 channels with GroupNorm (γ, β), then per stage (64, 128, 256, 512 channels; stride 2 from the
    second) two blocks of two bias-free 3x3 convolutions with GroupNorm, the first block with a 1x1
    convolution and GroupNorm as shortcut where the width changes."""
    count, sizes, n_in = 9 * channels * 64 + 2 * 64, [64 * height * width], 64
    for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        height, width = -(-height // stride), -(-width // stride)
        shortcut = n_in * planes + 2 * planes if n_in != planes else 0
        count += 9 * planes * (n_in + 3 * planes) + 8 * planes + shortcut  # 4 convolutions, 4 GroupNorms
        sizes += [planes * height * width] * (4 + bool(shortcut))
        n_in = planes
    return count, sizes


class ModelKind(typing.NamedTuple):
    """A built-in ``model.kind``, declared once: its line in ``raysim list`` and its layout, from
    which its parameters are counted without building it: ``layout(model_cfg, features, classes)``
    gives (parameters before its Linear layers, widths of its hidden activations, the sizes of its
    Linear layers in order)."""

    doc: str
    layout: typing.Callable
    normalization: bool = False  # it has normalization layers (BatchNorm, GroupNorm, LayerNorm): FedBN's split
    batch_statistics: bool = False  # it normalizes each batch by the batch's own statistics (BatchNorm)


def _logreg(m, features: tuple, classes: int) -> tuple:
    return 0, [], [math.prod(features), classes]


def _mlp(m, features: tuple, classes: int) -> tuple:
    return 0, list(m.hidden), [math.prod(features), *m.hidden, classes]


def _cnn(m, features: tuple, classes: int) -> tuple:
    if len(features) != 3:  # refused by check_model_data
        return _logreg(m, features, classes)
    (channels, height, width), body, widths = features, 0, []
    for out in m.channels:
        body += channels * out * 9 + out  # 3x3 kernels and a bias
        widths.append(out * height * width)
        if min(height, width) >= 2:
            height, width = height // 2, width // 2  # max-pooling
        channels = out
    return body, widths, [channels * height * width, classes]


def _bn_cnn(m, features: tuple, classes: int) -> tuple:
    """FedBN's digits CNN at a quarter of its widths: 5x5 convolutions 16, 16, 32 (with biases), each
    with BatchNorm2d (γ, β), the first two 2x2 max-pooled; dense 512 and 128, each with BatchNorm1d."""
    if len(features) != 3 or min(features[1:]) < 4:  # refused by check_model_data
        return _logreg(m, features, classes)
    channels, height, width = features
    body = sum(25 * n_in * out + out + 2 * out for n_in, out in ((channels, 16), (16, 16), (16, 32))) + 2 * (512 + 128)
    widths = [16 * height * width, 16 * (height // 2) * (width // 2), 32 * (height // 4) * (width // 4), 512, 128]
    return body, widths, [32 * (height // 4) * (width // 4), 512, 128, classes]


def _quadratic(m, features: tuple, classes: int) -> tuple:
    return sum(features), [], []  # theta, w


def _bilinear(m, features: tuple, classes: int) -> tuple:
    flat = math.prod(features)
    return flat + flat * flat, [], []  # w1 [d], W2 [d, d]


def _char_lstm(m, features: tuple, classes: int) -> tuple:
    """Embedding V x 8; per LSTM layer (in 8, then 256) 4·256·(in + 256) weights and 2 biases; 80 steps x 2
    layers of activations: 4 gates, c and h."""
    body = classes * 8 + sum(4 * 256 * (n_in + 256) + 2 * 4 * 256 for n_in in (8, 256))
    return body, [SHAKESPEARE_LENGTH * 8, SHAKESPEARE_LENGTH * 2 * 6 * 256], [256, classes]


def _femnist_cnn(m, features: tuple, classes: int) -> tuple:
    """5x5 convolutions 1 -> 32 -> 64 (with biases), each 2x2 max-pooled, then dense 2048."""
    body = (25 * 1 * 32 + 32) + (25 * 32 * 64 + 64)
    return body, [32 * 28 * 28, 64 * 14 * 14, 2048], [64 * 7 * 7, 2048, classes]


def _resnet18_gn(m, features: tuple, classes: int) -> tuple:
    if len(features) != 3:  # refused by check_model_data
        return _logreg(m, features, classes)
    return (*_resnet18_gn_body(*features), [512, classes])


MODELS = {
    "logreg": ModelKind("multinomial logistic regression (one Linear layer)", _logreg),
    "mlp": ModelKind("fully connected net; keys model.hidden (sizes), model.activation", _mlp),
    "cnn": ModelKind("small conv net for image data (digits, synthetic_images, mnist, fashion_mnist, cifar10, "
                     "cifar100, leaf FEMNIST, or parquet with data.image_shape); key model.channels", _cnn),
    "quadratic": ModelKind("the parameters (theta, w) of data.kind=quadratic, both starting at 0; personal part: "
                           "model.personal=[w]", _quadratic),
    "bilinear": ModelKind("the saddle problem's model (data.kind=saddle): logits [0, w1ᵀW2h] with w1 [d], W2 [d, d], "
                          "so the cross-entropy is log(1 + exp(−γ·w1ᵀW2h)); key model.init_scale", _bilinear),
    "char_lstm": ModelKind("LEAF's Shakespeare model: embedding 8, 2-layer LSTM 256; next of 80 characters "
                           "(vocab = classes)", _char_lstm),
    "femnist_cnn": ModelKind("LEAF/FedAvg CNN for [1, 28, 28] images: 5x5 convs 32, 64 with max-pooling, dense 2048",
                             _femnist_cnn),
    "resnet18_gn": ModelKind("CIFAR ResNet-18 with GroupNorm (2 groups), as FedACG's; [channels, height, width] "
                             "images", _resnet18_gn, normalization=True),
    "bn_cnn": ModelKind("FedBN's digits CNN at 1/4 width: 5x5 convs 16, 16, 32 with BatchNorm (batch statistics), "
                        "dense 512, 128 with BatchNorm; [channels, height, width] images, sides >= 4", _bn_cnn,
                        normalization=True, batch_statistics=True),
}


def parameter_count(model_cfg, features: tuple, classes: int) -> tuple[int, list]:
    """(parameters, widths of the hidden layers) of the model :func:`raysim.models.build_model`
    builds for data of shape ``features`` with ``classes`` classes, counted from its kind's layout
    without building it (LoRA adapters counted on every Linear layer but the output layer; a custom
    kind, ``package.module:function``: (0, []), its size is known once built)."""
    if ":" in model_cfg.kind:
        return 0, []
    body, widths, linear = MODELS[model_cfg.kind].layout(model_cfg, features, classes)
    layers = list(zip(linear, linear[1:]))
    count = body + sum(i * o + o for i, o in layers)
    if model_cfg.personal == "adapter":
        count += sum(model_cfg.adapter_rank * (i + o) for i, o in layers[:-1])
    return count, widths
