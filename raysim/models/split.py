"""Personal / global split of a model's flat parameter vector, and LoRA adapters.

``model.personal`` picks the personal part of the flat vector (see :func:`personal_mask`);
``model.personal_init`` says how a client's personal part starts (see :func:`init_personal`).
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from raysim.catalog import PERSONAL_MODES, check_init
from raysim.errors import ScenarioError
from raysim.models.flat import FlatModel

_INIT_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)  # _NormBase: BatchNorm, InstanceNorm


class LoRALinear(nn.Module):
    """A Linear layer plus a low-rank pair: ``y = x Wᵀ + b + (x Aᵀ) Bᵀ``.

    ``weight`` and ``bias`` are the base layer's own parameters (shared, not copied);
    ``lora_a`` ([rank, in]) starts like a Linear weight and ``lora_b`` ([out, rank]) at
    zero, so the layer first computes exactly what the base layer did.
    """

    def __init__(self, base: nn.Linear, rank: int):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.lora_a = nn.Parameter(torch.empty(rank, self.in_features))
        self.lora_b = nn.Parameter(torch.zeros(self.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # nn.Linear's law: U(±1/sqrt(in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.lora_a), self.lora_b)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.lora_a.shape[0]}"


def add_adapters(module: nn.Module, rank, layers) -> nn.Module:
    """Replace Linear submodules of ``module`` (in place) by :class:`LoRALinear`; returns ``module``.

    ``layers`` are names from ``module.named_modules()`` (e.g. ``"1"`` in an
    ``nn.Sequential``); ``None`` adapts every Linear layer but the last (the output layer).
    Draws ``lora_a`` from torch's global RNG: call it under the model's seeded RNG.
    """
    linear = {name: m for name, m in module.named_modules() if name and isinstance(m, nn.Linear)}
    if layers is None:
        chosen = list(linear)[:-1]
    elif isinstance(layers, str) or any(name not in linear for name in layers):
        raise ScenarioError("model.adapter_layers", layers, "names of Linear layers: " + (", ".join(linear) or "none"))
    else:
        chosen = list(dict.fromkeys(layers))
    if not chosen:
        raise ScenarioError("model.personal", "adapter", "a model with a Linear layer to adapt (model.adapter_layers "
                            f"null adapts all but the output layer; Linear layers here: {', '.join(linear) or 'none'})")
    tight = min(chosen, key=lambda name: min(linear[name].in_features, linear[name].out_features))
    base = linear[tight]
    bound = min(base.in_features, base.out_features)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= bound:
        raise ScenarioError("model.adapter_rank", rank, f"an integer in [1, {bound}] "
                            f"(layer '{tight}' is {base.in_features}→{base.out_features})")
    for name in chosen:
        parent, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent), child, LoRALinear(linear[name], rank))
    return module


def _parameters(module: nn.Module) -> list:
    """``(name, parameter, owning module, name in owner)`` in ``named_parameters()`` (FlatModel) order."""
    owners = {}
    for owner in module.modules():
        for leaf, p in owner.named_parameters(recurse=False):
            owners.setdefault(id(p), (owner, leaf))
    return [(name, p, *owners[id(p)]) for name, p in module.named_parameters()]


def _selected(module: nn.Module, params: list, personal) -> list:
    """Per parameter of ``params``: whether ``personal`` makes it personal."""
    if isinstance(personal, (list, tuple)):
        if not all(isinstance(pattern, str) for pattern in personal):
            raise ScenarioError("model.personal", personal, "a list of parameter-name patterns (strings)")
        return [any(fnmatchcase(name, pattern) for pattern in personal) for name, *_ in params]
    if personal == "none":
        return [False] * len(params)
    if personal == "adapter":
        return [isinstance(owner, LoRALinear) and leaf in ("lora_a", "lora_b") for _, _, owner, leaf in params]
    if personal == "normalization":
        return [isinstance(owner, NORM_LAYERS) for _, _, owner, _ in params]
    if personal in ("input_layer", "output_layer"):
        layers = [m for m in module.modules() if next(m.parameters(recurse=False), None) is not None]
        layer = layers[0 if personal == "input_layer" else -1]
        return [owner is layer for _, _, owner, _ in params]
    raise ScenarioError("model.personal", personal, ", ".join(PERSONAL_MODES) + " or a list of parameter-name patterns")


def personal_mask(module: nn.Module, personal) -> torch.Tensor:
    """Bool mask ``[P]`` over the flat vector (FlatModel order): True on personal entries.

    ``personal``: ``"none"`` (nothing), ``"input_layer"`` / ``"output_layer"`` (all
    parameters of the first / last module that owns parameters), ``"adapter"`` (every
    LoRA pair), ``"normalization"`` (the affine weight and bias of every BatchNorm, InstanceNorm,
    GroupNorm and LayerNorm) or a list of fnmatch patterns on the names of ``named_parameters()``.
    Any split but ``"none"`` must leave both personal and global parameters.
    """
    params = _parameters(module)
    selected = _selected(module, params, personal)
    if personal == "normalization" and not any(selected):
        raise ScenarioError("model.personal", personal, "a model with normalization layers (BatchNorm, GroupNorm, "
                            "LayerNorm); parameters here: " + ", ".join(name for name, *_ in params))
    if personal != "none" and (all(selected) or not any(selected)):
        raise ScenarioError("model.personal", personal, "a split that leaves both personal and global parameters; "
                            "parameters here: " + ", ".join(name for name, *_ in params))
    return torch.cat([torch.full((p.numel(),), s, dtype=torch.bool) for (_, p, *_), s in zip(params, selected)])


def _law(p: torch.Tensor, owner: nn.Module, leaf: str) -> tuple:
    """PyTorch's default init of one parameter: ``("uniform", low, high)``, ``("normal", mean, std)``
    or ``("constant", value, value)``."""
    if leaf == "lora_b":
        return "uniform", 0.0, 0.0  # zeros, drawn so that the draws after them stay where they were
    if isinstance(owner, nn.LSTM):
        bound = 1.0 / math.sqrt(owner.hidden_size)
        return "uniform", -bound, bound
    if isinstance(owner, nn.Embedding):
        return "normal", 0.0, 1.0
    if isinstance(owner, NORM_LAYERS):
        value = 1.0 if leaf == "weight" else 0.0
        return "constant", value, value
    if leaf == "lora_a":
        fan_in = p.shape[1]
    elif isinstance(owner, _INIT_LAYERS + (LoRALinear,)):
        fan_in = owner.weight[0].numel()  # in_features, or in_channels/groups * kernel size
    else:
        return "uniform", 0.0, 1.0  # a bare parameter (the quadratic model's θ, w)
    bound = 1.0 / math.sqrt(fan_in)
    return "uniform", -bound, bound


def _draw(rng: np.random.Generator, n: int, kind: str, a: float, b: float) -> np.ndarray:
    """``n`` draws of one :func:`_law` from ``rng`` (a constant draws nothing)."""
    if kind == "uniform":
        return rng.uniform(a, b, n)
    if kind == "normal":
        return rng.normal(a, b, n)
    return np.full(n, a)


def init_personal(model: FlatModel, mask: torch.Tensor, global_vector: torch.Tensor, rngs: list,
                  how: str) -> torch.Tensor:
    """Full parameter rows ``[C, P]``, one per client, for a visit's start.

    Global entries (``~mask``) equal ``global_vector``; personal entries are ``global_vector``'s
    own (``"global"``), 0 (``"zero"``) or, for ``"random"``, a fresh draw from each client's
    numpy Generator in ``rngs`` following PyTorch's default init of each tensor
    (Linear/Conv weight and bias, ``lora_a``: U(±1/sqrt(fan_in)); ``lora_b``: 0; LSTM weights and
    biases: U(±1/sqrt(hidden)); Embedding: N(0, 1); normalization layers: weight 1, bias 0; other
    parameters: U[0, 1]), drawn in float64 and cast to the vector's dtype. Draws do not touch torch's global RNG.
    """
    check_init(None, how)
    rows = global_vector.detach().expand(len(rngs), -1).clone()
    mask = mask.cpu()
    if how == "global" or not rngs or not mask.any():
        return rows
    if how == "zero":
        rows[:, mask.to(rows.device)] = 0
        return rows
    offsets = np.cumsum([0, *model.numels]).tolist()
    spans = [(start, stop, _law(p, owner, leaf))
             for (_, p, owner, leaf), start, stop in zip(_parameters(model.module), offsets, offsets[1:])
             if mask[start:stop].any()]
    index = torch.cat([torch.arange(start, stop) for start, stop, _ in spans])
    draws = np.stack([np.concatenate([_draw(rng, stop - start, *law) for start, stop, law in spans]) for rng in rngs])
    keep = mask[index]
    rows[:, index[keep].to(rows.device)] = torch.from_numpy(draws)[:, keep].to(rows)
    return rows


def describe_split(module: nn.Module, mask: torch.Tensor) -> dict:
    """Sizes of the split for logs: ``{"personal": n, "global": n, "personal_names": [...]}``."""
    params = _parameters(module)
    offsets = np.cumsum([0] + [p.numel() for _, p, *_ in params]).tolist()
    personal = int(mask.sum())
    return {"personal": personal, "global": int(mask.numel()) - personal,
            "personal_names": [name for i, (name, *_) in enumerate(params) if mask[offsets[i]:offsets[i + 1]].any()]}
