"""Model zoo: ``logreg``, ``mlp``, a small ``cnn``, the ``quadratic`` model (θ, w), the saddle
problem's ``bilinear`` model, the benchmarks' ``char_lstm``, ``femnist_cnn``, ``resnet18_gn`` and ``bn_cnn``
(:mod:`raysim.models.zoo`), or a user's ``package.module:factory``, built deterministically
from the seed, with the split of parameters into global θ and personal w (``model.personal``,
see :mod:`raysim.models.split`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from raysim.catalog import MODELS, check_model_data
from raysim.errors import ScenarioError
from raysim.importing import USER_CODE_ERRORS, call_imported, raised_in
from raysim.models.bilinear import Bilinear
from raysim.models.flat import FlatModel
from raysim.models.split import add_adapters, personal_mask
from raysim.models.zoo import ZOO


ACTIVATIONS = {"relu": nn.ReLU, "elu": nn.ELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}  # raysim.catalog names them

__all__ = ["ACTIVATIONS", "MODELS", "FlatModel", "build_model"]


class QuadraticModel(nn.Module):
    """Parameters of the quadratic problem: global ``theta`` [d_θ] and personal ``w`` [d_w], float64
    (the problem is solved to 1e-8 relative error); evaluated by the problem, not by ``forward``."""

    def __init__(self, d_theta: int, d_w: int):
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(d_theta, dtype=torch.float64))
        self.w = nn.Parameter(torch.zeros(d_w, dtype=torch.float64))


def build_model(model_cfg, feature_shape: tuple, num_classes: int, seed: int) -> FlatModel:
    """Build the scenario's model with parameters drawn from ``seed`` (global RNG untouched),
    LoRA adapters added for ``model.personal: adapter``, and its personal mask set."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = _module(model_cfg, tuple(feature_shape), num_classes, seed)
        if model_cfg.personal == "adapter":
            module = add_adapters(module, model_cfg.adapter_rank, model_cfg.adapter_layers)
    personal = model_cfg.personal
    return FlatModel(module, personal_mask(module, personal if isinstance(personal, str) else list(personal)))


def _module(cfg, feature_shape: tuple, num_classes: int, seed: int) -> nn.Module:
    if ":" in cfg.kind:
        return _custom(cfg, feature_shape, num_classes)
    check_model_data(cfg.kind, feature_shape, num_classes)
    if cfg.kind == "quadratic":
        return QuadraticModel(*feature_shape)
    if cfg.kind in ZOO:
        return ZOO[cfg.kind](feature_shape, num_classes)
    num_features = math.prod(feature_shape)
    if cfg.kind == "bilinear":
        return Bilinear(num_features, cfg.init_scale, seed)
    if cfg.kind == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(num_features, num_classes))
    if cfg.kind == "mlp":
        layers, width = [nn.Flatten()], num_features
        for hidden in cfg.hidden:
            layers += [nn.Linear(width, hidden), ACTIVATIONS[cfg.activation]()]
            width = hidden
        return nn.Sequential(*layers, nn.Linear(width, num_classes))
    if cfg.kind == "cnn":
        channels, height, width = feature_shape
        layers = []
        for out in cfg.channels:
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU()]
            if min(height, width) >= 2:
                layers.append(nn.MaxPool2d(2))
                height, width = height // 2, width // 2
            channels = out
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * height * width, num_classes))
    raise ScenarioError("model.kind", cfg.kind, "one of " + ", ".join(sorted(MODELS)))


def _custom(cfg, feature_shape: tuple, num_classes: int) -> nn.Module:
    """A user's ``package.module:factory(feature_shape, num_classes, **model.options)``."""
    what = "a function returning a torch.nn.Module"
    module = call_imported("model.kind", cfg.kind, what, feature_shape, num_classes, **dict(cfg.options or {}))
    if not isinstance(module, nn.Module):
        raise ScenarioError("model.kind", cfg.kind, f"{what} (it returned {type(module).__name__})")
    running = [name for name, m in module.named_modules()
               if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats]
    if running:  # buffers that training updates in place: not in the model vector, not per client
        raise ScenarioError("model.kind", cfg.kind, f"{what} without running statistics (module {running[0]!r} "
                                                    "keeps them: use GroupNorm or LayerNorm, or "
                                                    "track_running_stats=False)")
    if num_classes == 0:  # the quadratic problem: no classes to check the output against
        return module
    try:
        with torch.no_grad():
            out = module(torch.zeros(1, *feature_shape))
    except USER_CODE_ERRORS as exc:  # the user's forward may fail in any way
        raise ScenarioError("model.kind", cfg.kind, f"{what} that takes a batch of features of shape "
                                                    f"[batch, {', '.join(map(str, feature_shape))}] "
                                                    f"({raised_in(exc)})") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ScenarioError("model.kind", cfg.kind, f"{what} whose output is [batch, {num_classes}] for the "
                                                    f"data's {num_classes} classes (one example gives {got})")
    return module
