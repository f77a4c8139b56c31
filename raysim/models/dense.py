"""A fast path for plain MLPs: the forward and backward passes of C clients' models written out.

``torch.func.vmap`` over ``functional_call`` plus the autograd engine costs a few milliseconds
per local step on the tiny batches of federated clients, mostly in Python and dispatch
overhead, not arithmetic. For a model that is a plain stack of ``nn.Linear`` layers and
element-wise activations (``logreg``, ``mlp``), :class:`DenseStack` runs the same passes by
hand, calling **the same ATen kernels on tensors of the same shapes and strides, in the same
order** as autograd does through the vmapped model, so its gradients are bit-identical to the
reference path (``tests/test_client_speed.py`` checks this):

* forward, C > 1 (vmap's decomposition of ``linear``): ``bmm(h, Wᵀ) + b``;
  one client (no vmap): ``addmm(b, h, Wᵀ)``;
* backward of a linear layer with output gradient g: ``dWᵀ = bmm(hᵀ, g)`` (one client:
  ``dW = mm(gᵀ, h)``), ``db = sum(g, rows)``, ``dh = bmm(g, W)`` (``mm``);
* activations through their own backward kernels (``threshold_backward`` for ReLU on its
  output, ``tanh_backward``/``sigmoid_backward`` on the output, ``elu_backward`` on the input).

Any other module (convolutions, LoRA adapters, custom models, hooks) keeps the generic path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

_aten = torch.ops.aten
_ACTIVATIONS = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.ELU)


@dataclass(frozen=True)
class DenseLayer:
    """A linear layer's place in the flat vector and the activation that follows it (or None)."""

    weight: tuple  # (start, end) of the [out, in] weight, row-major
    bias: tuple | None  # (start, end) of the [out] bias
    out_features: int
    in_features: int
    activation: str | None  # 'relu', 'tanh', 'sigmoid', 'elu' or None
    alpha: float = 1.0  # ELU's alpha


class DenseStack:
    """``[Flatten], Linear, [activation], Linear, …`` evaluated for C flat parameter vectors at once."""

    def __init__(self, layers: tuple, flatten: bool):
        self.layers, self.flatten = layers, flatten

    @staticmethod
    def of(module: nn.Module, names: list, numels: list) -> "DenseStack | None":
        """The stack of ``module`` whose flat parameters are ``names`` (sizes ``numels``, in that
        order), or None unless it is exactly a plain ``nn.Sequential`` MLP without hooks (checked
        now: hooks registered later are not seen)."""
        if type(module) is not nn.Sequential or _hooked(module) or any(True for _ in module.buffers()):
            return None
        children = list(module.named_children())
        flatten = False
        if children and type(children[0][1]) is nn.Flatten:
            f = children[0][1]
            if (f.start_dim, f.end_dim) != (1, -1):
                return None
            flatten, children = True, children[1:]
        offsets, at = {}, 0
        for name, numel in zip(names, numels):
            offsets[name] = (at, at + numel)
            at += numel
        layers, used = [], set()
        for name, child in children:
            if type(child) is nn.Linear:
                weight, bias = f"{name}.weight", f"{name}.bias"
                if weight not in offsets or (child.bias is not None and bias not in offsets):
                    return None
                used.update([weight] + ([bias] if child.bias is not None else []))
                layers.append(DenseLayer(offsets[weight], offsets[bias] if child.bias is not None else None,
                                         child.out_features, child.in_features, None))
            elif type(child) in _ACTIVATIONS and layers and layers[-1].activation is None:
                if type(child) is nn.ELU and child.inplace:  # an in-place ELU differentiates through its output
                    return None
                kind = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.ELU: "elu"}[type(child)]
                alpha = float(child.alpha) if kind == "elu" else 1.0
                last = layers[-1]
                layers[-1] = DenseLayer(last.weight, last.bias, last.out_features, last.in_features, kind, alpha)
            else:
                return None
        if not layers or used != set(names):
            return None
        return DenseStack(tuple(layers), flatten)

    def loss_backward(self, params: torch.Tensor, x: torch.Tensor, head, batched: bool = True) -> tuple:
        """(gradients [C, P], what ``head`` returned) for the scalar ``head`` puts on the outputs.

        ``head(outputs [C·B, K]) -> (grad_outputs [C·B, K], result)`` is a loss's forward and
        backward (:func:`raysim.algorithms.oracles.per_client_loss_backward` for cross-entropy);
        ``x`` is [C, B, ...]. ``batched`` false (one client, which the reference does not vmap)
        takes the un-vmapped kernels (``addmm``/``mm``).

        BLAS kernels may round differently with the operands' alignment and with the number of
        matrices in a batch (MKL does both): every operand here has the reference's shape, strides
        and address modulo 64 bytes (fresh tensors, or the same views of ``params`` and ``x``)."""
        count, rows = x.shape[0], x.shape[1]
        h = x.reshape(count, rows, -1) if self.flatten else x
        if h.dim() != 3:
            raise ValueError("DenseStack takes features [C, B, F], or [C, B, ...] when the stack flattens first")
        if not batched:
            if count != 1:
                raise ValueError("an un-vmapped pass takes exactly one client")
            return self._single(params, h[0], head)
        tape = []  # per layer: its weight, its input, and what its activation's backward needs
        for layer in self.layers:
            (w0, w1), bias = layer.weight, layer.bias
            weight = params[:, w0:w1].view(count, layer.out_features, layer.in_features)
            z = torch.bmm(h, weight.transpose(1, 2))
            if bias is not None:
                z = params[:, bias[0]:bias[1]].view(count, 1, layer.out_features) + z
            activated, saved = _activate(layer, z)
            tape.append((weight, h, saved))
            h = activated
        grad, result = head(h.reshape(-1, h.shape[-1]))
        grad = grad.view(h.shape)
        grads = torch.empty(params.shape, dtype=params.dtype, device=params.device)
        # the blocks are copied into place (exact); on the CPU through numpy, whose strided
        # (transposing) copies are about twice as fast as torch's for these small blocks
        into = grads.numpy() if grads.device.type == "cpu" else None  # C-contiguous: fresh
        for i in range(len(self.layers) - 1, -1, -1):
            layer, (weight, inputs, saved) = self.layers[i], tape[i]
            (w0, w1), bias = layer.weight, layer.bias
            grad = _activation_backward(layer, grad, saved)
            weight_t = torch.bmm(inputs.transpose(1, 2), grad)  # [C, in, out]: dWᵀ as autograd computes it
            bias_grad = torch.sum(grad, 1, keepdim=True) if bias is not None else None
            if into is not None:
                np.copyto(_blocks(into, w0, weight.shape), weight_t.numpy().transpose(0, 2, 1))
                if bias is not None:
                    np.copyto(into[:, bias[0]:bias[1]], bias_grad.numpy().reshape(count, -1))
            else:
                grads[:, w0:w1].view(weight.shape).copy_(weight_t.transpose(1, 2))
                if bias is not None:
                    grads[:, bias[0]:bias[1]].copy_(bias_grad.view(count, -1))
            if i:
                grad = torch.bmm(grad, weight)
        return grads, result

    def _single(self, params: torch.Tensor, h: torch.Tensor, head) -> tuple:
        """One client as ``functional_call`` runs it without vmap: ``addmm``, then ``mm`` backward."""
        row = params[0]
        tape = []
        for layer in self.layers:
            weight = row[layer.weight[0]:layer.weight[1]].view(layer.out_features, layer.in_features)
            z = (torch.addmm(row[layer.bias[0]:layer.bias[1]], h, weight.t()) if layer.bias is not None
                 else torch.mm(h, weight.t()))
            activated, saved = _activate(layer, z)
            tape.append((h, saved))
            h = activated
        grad, result = head(h)
        grads = torch.empty(params.shape, dtype=params.dtype, device=params.device)
        for i in range(len(self.layers) - 1, -1, -1):
            layer, (inputs, saved) = self.layers[i], tape[i]
            grad = _activation_backward(layer, grad, saved)
            weight = row[layer.weight[0]:layer.weight[1]].view(layer.out_features, layer.in_features)
            grads[0, layer.weight[0]:layer.weight[1]].view(layer.out_features, layer.in_features).copy_(
                torch.mm(grad.t(), inputs))
            if layer.bias is not None:
                grads[0, layer.bias[0]:layer.bias[1]].copy_(torch.sum(grad, 0, keepdim=True).view(-1))
            if i:
                grad = torch.mm(grad, weight)
        return grads, result


def _activate(layer: DenseLayer, z: torch.Tensor) -> tuple:
    """(the activation of ``z``, what its backward needs: the output, or ELU's input)."""
    if layer.activation is None:
        return z, None
    if layer.activation == "relu":
        out = torch.relu(z)
        return out, out
    if layer.activation == "tanh":
        out = torch.tanh(z)
        return out, out
    if layer.activation == "sigmoid":
        out = torch.sigmoid(z)
        return out, out
    return torch.nn.functional.elu(z, layer.alpha), z


def _activation_backward(layer: DenseLayer, grad: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
    """The activation's backward kernel, as autograd calls it."""
    if layer.activation is None:
        return grad
    if layer.activation == "relu":
        return _aten.threshold_backward(grad, saved, 0)
    if layer.activation == "tanh":
        return _aten.tanh_backward(grad, saved)
    if layer.activation == "sigmoid":
        return _aten.sigmoid_backward(grad, saved)
    return _aten.elu_backward(grad, layer.alpha, 1, 1, False, saved)


def _blocks(array: np.ndarray, start: int, shape: tuple) -> np.ndarray:
    """The [C, out, in] blocks of ``array`` [C, P] (C-contiguous) at column ``start``, a view."""
    item = array.itemsize
    return np.ndarray(shape, array.dtype, array, start * item, (array.strides[0], shape[2] * item, item))


def _hooked(module: nn.Module) -> bool:
    """Whether any hook could change what ``functional_call`` computes for ``module``."""
    from torch.nn.modules import module as module_globals

    if any(getattr(module_globals, name, None) for name in
           ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks", "_global_forward_hooks_always_called")):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
               for m in module.modules())
