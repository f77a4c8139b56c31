"""Personal/global splits of the flat vector, LoRA adapters and personal-part initialisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from raysim.catalog import check_init
from raysim.errors import ScenarioError
from raysim.models.flat import FlatModel
from raysim.models.split import (LoRALinear, add_adapters, describe_split, init_personal,
                                 personal_mask)

P_MLP = 64 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10  # 8970


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


class Quadratic(nn.Module):
    """Bare parameters like the quadratic model's θ and w."""

    def __init__(self):
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(6, dtype=torch.float64))
        self.w = nn.Parameter(torch.zeros(4, dtype=torch.float64))


def functional_layer(layer, params, prefix, x):
    """One layer evaluated at the entries of ``params`` under ``prefix``."""
    local = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(prefix + ".")}
    return torch.func.functional_call(layer, local, (x,))


def _error(call, *args) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        call(*args)
    return info.value


@pytest.mark.parametrize("personal, count", [
    ("none", 0), ("input_layer", 64 * 64 + 64), ("output_layer", 64 * 10 + 10),
    (["3.*"], 64 * 64 + 64), (["*.bias", "5.weight"], 64 + 64 + 10 + 640)])
def test_mask_counts(personal, count):
    mask = personal_mask(mlp(), personal)
    assert mask.dtype == torch.bool and mask.shape == (P_MLP,)
    assert int(mask.sum()) == count


def test_mask_positions_follow_flat_order():
    module = mlp()
    flat = FlatModel(module)
    mask = personal_mask(module, "output_layer")
    parts = flat.unflatten(mask)
    assert all(parts[n].all() for n in ("5.weight", "5.bias"))
    assert not any(parts[n].any() for n in ("1.weight", "1.bias", "3.weight", "3.bias"))


def test_adapter_mask_and_layers():
    module = add_adapters(mlp(), 4, None)
    assert isinstance(module[1], LoRALinear) and isinstance(module[3], LoRALinear) and type(module[5]) is nn.Linear
    names = [n for n, _ in module.named_parameters()]
    assert names[:4] == ["1.weight", "1.bias", "1.lora_a", "1.lora_b"]
    mask = personal_mask(module, "adapter")
    assert mask.shape == (P_MLP + 2 * (4 * 64 + 64 * 4),)
    assert int(mask.sum()) == 2 * (4 * 64 + 64 * 4)
    assert int(personal_mask(module, "input_layer").sum()) == 64 * 64 + 64 + 4 * 64 + 64 * 4
    assert describe_split(module, mask) == {"personal": 1024, "global": P_MLP,
                                            "personal_names": ["1.lora_a", "1.lora_b", "3.lora_a", "3.lora_b"]}
    only_last = add_adapters(mlp(), 2, ["5"])
    assert isinstance(only_last[5], LoRALinear) and type(only_last[1]) is nn.Linear
    assert int(personal_mask(only_last, "adapter").sum()) == 2 * 64 + 10 * 2


def test_adapter_starts_as_no_op_and_learns():
    x = torch.randn(8, 64)
    before = FlatModel(mlp())
    expected = before.logits(before.initial_vector(), x)
    base = before.module[1]
    module = add_adapters(before.module, 4, None)  # in place
    assert module[1].weight is base.weight and module[1].bias is base.bias
    assert module[1].lora_a.abs().max() <= 1 / 8 and not module[1].lora_b.any()
    flat = FlatModel(module)
    v0 = flat.initial_vector()
    assert torch.equal(flat.logits(v0, x), expected)

    mask = personal_mask(module, "adapter")
    is_a = torch.cat([torch.full((n,), name.endswith("lora_a")) for name, n in zip(flat.names, flat.numels)])
    loss = lambda v: flat.logits(v, x).square().sum()  # noqa: E731
    assert not grad(loss)(v0)[is_a].any()  # lora_b = 0: no gradient reaches lora_a
    v1 = v0.clone()
    v1[mask & ~is_a] = 0.1
    assert grad(loss)(v1)[is_a].abs().sum() > 0

    # the forward is base(x) + (x Aᵀ) Bᵀ
    p = flat.unflatten(v1)
    h = x @ p["1.weight"].T + p["1.bias"] + (x @ p["1.lora_a"].T) @ p["1.lora_b"].T
    assert torch.allclose(functional_layer(module[1], p, "1", x), h, atol=1e-5)


def test_adapter_under_vmap():
    flat = FlatModel(add_adapters(mlp(), 3, ["1", "5"]))
    mask = personal_mask(flat.module, "adapter")
    rows = flat.initial_vector().repeat(4, 1)
    rows[:, mask] = torch.randn(4, int(mask.sum()))
    x = torch.randn(5, 64)
    batched = vmap(flat.logits, in_dims=(0, None))(rows, x)
    assert batched.shape == (4, 5, 10)
    assert torch.allclose(batched, torch.stack([flat.logits(r, x) for r in rows]), atol=1e-5)
    assert not torch.allclose(batched[0], batched[1])


def test_split_errors():
    names = "1.weight, 1.bias, 3.weight, 3.bias, 5.weight, 5.bias"
    for personal in (["nope*"], "adapter", ["*"], []):
        exc = _error(personal_mask, mlp(), personal)
        assert (exc.key, exc.value) == ("model.personal", personal)
        assert f"a split that leaves both personal and global parameters; parameters here: {names}" in str(exc)
    exc = _error(personal_mask, nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), "input_layer")
    assert "parameters here: 1.weight, 1.bias" in str(exc)
    exc = _error(personal_mask, mlp(), ["1.*", 3])
    assert (exc.key, exc.value) == ("model.personal", ["1.*", 3]) and "patterns (strings)" in str(exc)
    exc = _error(personal_mask, mlp(), "hidden_layer")
    assert exc.value == "hidden_layer" and "none, input_layer, output_layer, adapter" in str(exc)


def test_adapter_errors():
    exc = _error(add_adapters, mlp(), 65, None)
    assert (exc.key, exc.value) == ("model.adapter_rank", 65)
    assert "an integer in [1, 64] (layer '1' is 64→64)" in str(exc)
    exc = _error(add_adapters, mlp(), 11, ["1", "5"])
    assert "an integer in [1, 10] (layer '5' is 64→10)" in str(exc)
    assert _error(add_adapters, mlp(), 0, None).key == "model.adapter_rank"
    exc = _error(add_adapters, mlp(), 4, ["1", "2"])
    assert (exc.key, exc.value) == ("model.adapter_layers", ["1", "2"])
    assert "names of Linear layers: 1, 3, 5" in str(exc)
    exc = _error(add_adapters, nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), 1, None)
    assert (exc.key, exc.value) == ("model.personal", "adapter") and "Linear layers here: 1)" in str(exc)


def test_check_init():
    check_init("adapter", "random")
    check_init("output_layer", "zero")
    exc = _error(check_init, "adapter", "zero")
    assert (exc.key, exc.value) == ("model.personal_init", "zero")
    assert "random or global with model.personal=adapter (a zero LoRA pair has zero gradient)" in str(exc)
    assert _error(check_init, "none", "normal").key == "model.personal_init"


def _rngs(*seeds):
    return [np.random.default_rng(s) for s in seeds]


def test_init_random_draws_per_client():
    flat = FlatModel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)))
    mask = personal_mask(flat.module, "output_layer")
    g = flat.initial_vector()
    torch.manual_seed(1)
    rows = init_personal(flat, mask, g, _rngs(1, 2), "random")
    torch.manual_seed(2)  # torch's global RNG plays no part
    again = init_personal(flat, mask, g, _rngs(1, 3), "random")
    assert rows.shape == (2, flat.size) and rows.dtype == torch.float32
    assert torch.equal(rows[:, ~mask], g[~mask].expand(2, -1))
    assert torch.equal(again[0], rows[0]) and not torch.equal(again[1], rows[1])
    assert (rows[0, mask] != rows[1, mask]).all()
    personal = rows[:, mask]
    bound = 1 / math.sqrt(32)
    assert personal.abs().max() <= bound and personal.abs().max() > 0.9 * bound
    assert not torch.equal(personal[0], g[mask])


def test_init_random_laws():
    conv = FlatModel(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 2 * 2, 3)))
    mask = personal_mask(conv.module, "input_layer")
    personal = init_personal(conv, mask, conv.initial_vector(), _rngs(0, 1), "random")[:, mask]
    bound = 1 / math.sqrt(3 * 3 * 3)
    assert personal.abs().max() <= bound and personal.abs().max() > 0.9 * bound

    lora = FlatModel(add_adapters(mlp(), 4, ["3"]))
    mask = personal_mask(lora.module, "adapter")
    parts = lora.unflatten(init_personal(lora, mask, lora.initial_vector(), _rngs(5), "random")[0])
    assert parts["3.lora_a"].abs().max() <= 1 / 8 and parts["3.lora_a"].abs().max() > 0.9 / 8
    assert not parts["3.lora_b"].any()

    quad = FlatModel(Quadratic())
    mask = personal_mask(quad.module, ["w"])
    rows = init_personal(quad, mask, quad.initial_vector(), _rngs(0, 1, 2), "random")
    assert rows.dtype == torch.float64 and rows[0, 6:].tolist() == np.random.default_rng(0).uniform(0, 1, 4).tolist()
    assert ((rows[:, 6:] >= 0) & (rows[:, 6:] < 1)).all()
    assert not rows[:, :6].any()


def test_init_random_laws_of_the_benchmark_models_layers():
    """LSTM weights and biases U(±1/sqrt(hidden)), Embedding N(0, 1), GroupNorm weight 1 and bias 0,
    as PyTorch initializes them (char_lstm and resnet18_gn made partly personal)."""
    module = nn.ModuleDict({"embed": nn.Embedding(50, 40), "lstm": nn.LSTM(40, 16), "norm": nn.GroupNorm(2, 8),
                            "out": nn.Linear(16, 3)})
    flat = FlatModel(module)
    mask = personal_mask(module, ["embed.*", "lstm.*", "norm.*"])
    parts = flat.unflatten(init_personal(flat, mask, flat.initial_vector(), _rngs(7), "random")[0])
    embed = parts["embed.weight"]
    assert abs(float(embed.mean())) < 0.05 and abs(float(embed.std()) - 1) < 0.05 and embed.abs().max() > 2.5
    for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
        values = parts[f"lstm.{name}"]
        assert values.abs().max() <= 0.25 and values.abs().max() > 0.9 * 0.25, name  # 1/sqrt(16)
    assert torch.equal(parts["norm.weight"], torch.ones(8)) and torch.equal(parts["norm.bias"], torch.zeros(8))
    assert torch.equal(parts["out.weight"], module["out"].weight.detach())  # global: the model's own


def test_init_zero_and_global():
    flat = FlatModel(mlp())
    mask = personal_mask(flat.module, ["*.bias"])
    g = flat.initial_vector()
    zero = init_personal(flat, mask, g, _rngs(0, 1, 2), "zero")
    assert zero.shape == (3, flat.size)
    assert not zero[:, mask].any() and torch.equal(zero[:, ~mask], g[~mask].expand(3, -1))
    assert torch.equal(init_personal(flat, mask, g, _rngs(0, 1), "global"), g.expand(2, -1))
    none = personal_mask(flat.module, "none")
    assert torch.equal(init_personal(flat, none, g, _rngs(0), "random"), g[None])
