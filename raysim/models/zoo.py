"""The models of the standard federated benchmarks, with the papers' fixed architectures:

* ``char_lstm``: LEAF's Shakespeare next-character model (Caldas et al., "LEAF: A Benchmark for
  Federated Settings"): 8-dimensional embedding, 2-layer LSTM of 256 units, linear to the vocabulary;
* ``femnist_cnn``: the FEMNIST/MNIST CNN of LEAF and McMahan et al. ("Communication-Efficient
  Learning of Deep Networks from Decentralized Data"), with LEAF's 2048-unit dense layer;
* ``resnet18_gn``: the CIFAR ResNet-18 with GroupNorm (2 groups) of FedACG (Kim et al.,
  "Communication-Efficient Federated Learning with Accelerated Client Gradient");
* ``bn_cnn``: the BatchNorm CNN of FedBN's digits experiments (Li, Jiang, Zhang, Kamp, Dou, "FedBN:
  Federated Learning on Non-IID Features via Local Batch Normalization"), its widths scaled down.

Every one runs under ``torch.func.vmap`` over ``functional_call`` (clients train as a batch) and
keeps no buffers (nothing but parameters is averaged). ``aten::lstm`` has no vmap batching rule,
so :class:`CharLSTM` keeps an ``nn.LSTM`` for its parameters (PyTorch's names, initialization and
gate order) and runs the recurrence with plain tensor operations (:func:`lstm_last_hidden`).
BatchNorm's running statistics are buffers updated in place, which vmap cannot batch:
:class:`BNCNN`'s BatchNorm layers keep none (``track_running_stats=False``, as
``torch.func.replace_all_batch_norm_modules_`` sets it) and normalize every batch with its own
statistics, in training and in evaluation alike (evaluation batches hold one client's rows).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def lstm_last_hidden(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """The last layer's hidden state after the last step of ``x`` [B, T, input] (zero initial
    state), computed as ``lstm`` (unidirectional, ``batch_first``, with biases, no projection) would,
    with matmuls and element-wise operations only, so that it runs under ``torch.func.vmap``.
    Gates in PyTorch's order: input, forget, cell, output."""
    hidden = lstm.hidden_size
    for layer in range(lstm.num_layers):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
        b_ih, b_hh = getattr(lstm, f"bias_ih_l{layer}"), getattr(lstm, f"bias_hh_l{layer}")
        inputs = F.linear(x, w_ih, b_ih)  # [B, T, 4H]: every step's input projection at once
        h = c = inputs.new_zeros(inputs.shape[0], hidden)
        outputs = []
        for t in range(inputs.shape[1]):
            i, f, g, o = (inputs[:, t] + F.linear(h, w_hh, b_hh)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        if layer + 1 < lstm.num_layers:  # the next layer's input sequence (the last layer's is not needed)
            x = torch.stack(outputs, dim=1)
    return h


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model: character indices [B, T] (float, cast to long) -> logits [B, vocab]
    of the next character, from the last hidden state of a 2-layer LSTM of 256 units over an
    8-dimensional embedding."""

    def __init__(self, vocab: int, embedding: int = 8, hidden: int = 256, layers: int = 2):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True)  # holds the parameters; see lstm_last_hidden
        self.fc = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(lstm_last_hidden(self.lstm, self.embedding(x.long())))


def femnist_cnn(num_classes: int) -> nn.Sequential:
    """The LEAF FEMNIST CNN on [1, 28, 28]: two 5x5 'same' convolutions (32, 64 channels), each with
    ReLU and 2x2 max-pooling (28 -> 14 -> 7), a dense layer of 2048 with ReLU, and the output layer."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 2048), nn.ReLU(), nn.Linear(2048, num_classes))


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with GroupNorm (2 groups) and a shortcut (a 1x1 convolution
    and GroupNorm where the stride or the width changes)."""

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(2, planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(2, planes)
        self.shortcut = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.GroupNorm(2, planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class ResNet18GN(nn.Module):
    """CIFAR ResNet-18 with GroupNorm, as FedACG's: 3x3 stem convolution (stride 1, no max-pool),
    four stages of two :class:`BasicBlock` (64, 128, 256, 512 channels; stride 2 from the second
    on), global average pooling and a linear layer."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(2, 64)
        stages, width = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(width, planes, stride), BasicBlock(planes, planes, 1)))
            width = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


class BatchNorm1dOfBatch(nn.BatchNorm1d):
    """BatchNorm1d without running statistics: each batch normalized with its own mean and (biased)
    variance, then scaled by ``weight`` and shifted by ``bias``. A batch of one row, which
    nn.BatchNorm1d refuses in training, normalizes to about 0 (the output is about ``bias``)."""

    def __init__(self, features: int):
        super().__init__(features, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.batch_norm(x, self.weight, self.bias, None, None, True, 0.0, self.eps, False)


class BNCNN(nn.Module):
    """FedBN's digits CNN (its DigitModel) with widths scaled by ``scale`` (default 1/4: channels 16,
    16, 32 and dense layers 512, 128 instead of 64, 64, 128 and 2048, 512), so that it trains fast on
    CPUs: three 5x5 'same' convolutions, each followed by BatchNorm2d and ReLU, the first two by 2x2
    max-pooling (28 -> 14 -> 7; 8 -> 4 -> 2), then two dense layers each followed by BatchNorm1d and
    ReLU, and the output layer. Takes [channels, height, width] images (height and width >= 4). Every
    BatchNorm normalizes with the statistics of its batch (no running statistics; see the module)."""

    def __init__(self, feature_shape: tuple, num_classes: int, scale: float = 0.25):
        super().__init__()
        channels, height, width = feature_shape
        c1, c2, c3, d1, d2 = (max(1, round(n * scale)) for n in (64, 64, 128, 2048, 512))
        self.features = nn.Sequential(
            nn.Conv2d(channels, c1, 5, padding=2), nn.BatchNorm2d(c1, track_running_stats=False), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.BatchNorm2d(c2, track_running_stats=False), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c2, c3, 5, padding=2), nn.BatchNorm2d(c3, track_running_stats=False), nn.ReLU())
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c3 * (height // 4) * (width // 4), d1), BatchNorm1dOfBatch(d1), nn.ReLU(),
            nn.Linear(d1, d2), BatchNorm1dOfBatch(d2), nn.ReLU(), nn.Linear(d2, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


# model.kind -> builder(feature_shape, num_classes); raysim.catalog.check_model_data has checked the shape
ZOO = {"char_lstm": lambda feature_shape, num_classes: CharLSTM(num_classes),
       "femnist_cnn": lambda feature_shape, num_classes: femnist_cnn(num_classes),
       "resnet18_gn": lambda feature_shape, num_classes: ResNet18GN(feature_shape[0], num_classes),
       "bn_cnn": BNCNN}
