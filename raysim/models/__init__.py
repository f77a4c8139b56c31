"""Model zoo: ``logreg``, ``mlp`` and a small ``cnn``, built deterministically from the seed."""

from __future__ import annotations

import math

import torch
from torch import nn

from raysim.errors import ScenarioError
from raysim.models.flat import FlatModel

MODELS = {
    "logreg": "multinomial logistic regression (one Linear layer)",
    "mlp": "fully connected net; keys model.hidden (sizes), model.activation",
    "cnn": "small conv net for image data (digits, or parquet with data.image_shape); key model.channels",
}

ACTIVATIONS = {"relu": nn.ReLU, "elu": nn.ELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}

__all__ = ["ACTIVATIONS", "MODELS", "FlatModel", "build_model"]


def build_model(model_cfg, feature_shape: tuple, num_classes: int, seed: int) -> FlatModel:
    """Build the scenario's model with parameters drawn from ``seed`` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = _module(model_cfg, tuple(feature_shape), num_classes)
    return FlatModel(module)


def _module(cfg, feature_shape: tuple, num_classes: int) -> nn.Module:
    num_features = math.prod(feature_shape)
    if cfg.kind == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(num_features, num_classes))
    if cfg.kind == "mlp":
        layers, width = [nn.Flatten()], num_features
        for hidden in cfg.hidden:
            layers += [nn.Linear(width, hidden), ACTIVATIONS[cfg.activation]()]
            width = hidden
        return nn.Sequential(*layers, nn.Linear(width, num_classes))
    if cfg.kind == "cnn":
        if len(feature_shape) != 3:
            raise ScenarioError("model.kind", "cnn", "image data: data.kind=digits, or parquet with "
                                f"data.image_shape set (features here have shape {list(feature_shape)})")
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
