"""The benchmark models of :mod:`raysim.models.zoo` (char_lstm, femnist_cnn, resnet18_gn, bn_cnn): their
sizes against the papers' figures, vectorized evaluation of a batch of clients, the hand-written
LSTM against ``nn.LSTM``, determinism, the refusal of data they cannot take, and short runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn
from torch.func import vmap

from raysim.scenario import ModelConfig, load_scenario
from raysim.engine.runtime import LocalRuntime
from raysim.engine.run import run_scenario
from raysim.preparation import prepare
from raysim.errors import ScenarioError
from raysim.models import build_model
from raysim.models.zoo import lstm_last_hidden

REPO = Path(__file__).resolve().parents[1]
SHAPES = {"char_lstm": (80,), "femnist_cnn": (1, 28, 28), "resnet18_gn": (3, 32, 32), "bn_cnn": (1, 8, 8)}


def _build(kind: str, shape=None, classes: int = 10, seed: int = 0):
    return build_model(ModelConfig(kind=kind), SHAPES[kind] if shape is None else shape, classes, seed)


def _inputs(kind: str, classes: int, *lead: int) -> torch.Tensor:
    """Features of ``kind``'s data: float character indices for char_lstm, images otherwise."""
    gen = torch.Generator().manual_seed(1)
    if kind == "char_lstm":
        return torch.randint(0, classes, (*lead, *SHAPES[kind]), generator=gen).float()
    return torch.randn(*lead, *SHAPES[kind], generator=gen)


def _lstm_count(vocab: int, embed: int = 8, hidden: int = 256) -> int:
    """Embedding V·E; per LSTM layer 4H·(in + H) weights and two 4H biases (PyTorch keeps b_ih and
    b_hh); output layer H·V + V."""
    layers = sum(4 * hidden * (n_in + hidden) + 2 * 4 * hidden for n_in in (embed, hidden))
    return vocab * embed + layers + hidden * vocab + vocab


def _femnist_count(classes: int) -> int:
    """conv 1→32 5x5 (+bias), conv 32→64 5x5 (+bias), dense 7·7·64 → 2048, dense 2048 → K."""
    return (25 * 32 + 32) + (32 * 25 * 64 + 64) + (7 * 7 * 64 * 2048 + 2048) + (2048 * classes + classes)


def _resnet_count(classes: int, channels: int = 3) -> int:
    """Bias-free 3x3 convolutions, GroupNorm γ and β (2 per channel), 1x1 shortcuts where the
    width changes, linear 512 → K: the ResNet-18 count (GroupNorm has as many as BatchNorm)."""
    count = channels * 64 * 9 + 2 * 64
    width = 64
    for planes in (64, 128, 256, 512):
        for block in range(2):
            n_in = width if block == 0 else planes
            count += n_in * planes * 9 + planes * planes * 9 + 4 * planes
            if n_in != planes:
                count += n_in * planes + 2 * planes
        width = planes
    return count + 512 * classes + classes


def _bn_cnn_count(classes: int, side: int, channels: int = 1) -> int:
    """FedBN's DigitModel at 1/4 width: 5x5 convolutions c→16→16→32 (+bias), each with BatchNorm2d
    (γ, β); max-pooling twice (side/4 left); dense 32·(side/4)² → 512 → 128 (+bias), each with
    BatchNorm1d; output 128 → K."""
    convs = (25 * channels * 16 + 16) + (25 * 16 * 16 + 16) + (25 * 16 * 32 + 32) + 2 * (16 + 16 + 32)
    dense = (32 * (side // 4) ** 2 * 512 + 512) + (512 * 128 + 128) + 2 * (512 + 128)
    return convs + dense + 128 * classes + classes


@pytest.mark.parametrize("kind, shape, classes, expected", [
    ("bn_cnn", (1, 8, 8), 10, 154_074),  # digits
    ("bn_cnn", (1, 28, 28), 10, 891_354),  # MNIST
])
def test_bn_cnn_parameter_count_is_its_architectures(kind, shape, classes, expected):
    assert _bn_cnn_count(classes, shape[1], shape[0]) == expected
    model = _build(kind, shape, classes)
    assert model.size == expected
    assert not list(model.module.buffers())  # BatchNorm without running statistics
    assert model.batch_statistics


@pytest.mark.parametrize("kind, classes, expected", [
    ("char_lstm", 80, 819_920),  # LEAF's TensorFlow cell has one bias per layer: 817,872
    ("femnist_cnn", 62, 6_603_710),  # LEAF FEMNIST
    ("femnist_cnn", 10, 6_497_162),  # MNIST
    ("resnet18_gn", 10, 11_173_962),  # CIFAR-10 ResNet-18
    ("resnet18_gn", 100, 11_220_132),  # CIFAR-100
])
def test_parameter_counts_are_the_papers(kind, classes, expected):
    formula = {"char_lstm": _lstm_count, "femnist_cnn": _femnist_count, "resnet18_gn": _resnet_count}[kind]
    assert formula(classes) == expected
    model = _build(kind, classes=classes)
    assert model.size == expected
    assert not list(model.module.buffers())  # nothing but parameters: no running statistics to average


@pytest.mark.parametrize("kind, classes", [("char_lstm", 80), ("femnist_cnn", 62), ("resnet18_gn", 10),
                                           ("bn_cnn", 10)])
def test_vmap_over_three_clients_equals_three_single_passes(kind, classes):
    model = _build(kind, classes=classes)
    gen = torch.Generator().manual_seed(2)
    params = model.initial_vector() + 0.01 * torch.randn(3, model.size, generator=gen)  # three distinct clients
    x = _inputs(kind, classes, 3, 2)
    batched = vmap(model.logits)(params, x)
    assert batched.shape == (3, 2, classes)
    single = torch.stack([model.logits(params[c], x[c]) for c in range(3)])
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-5)


def test_hand_written_lstm_equals_nn_lstm_and_its_gradients():
    torch.manual_seed(0)
    lstm = nn.LSTM(8, 32, 2, batch_first=True)
    x = torch.randn(5, 12, 8)
    expected = lstm(x)[0][:, -1]
    got = lstm_last_hidden(lstm, x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    weights = list(lstm.parameters())
    grads = torch.autograd.grad(got.square().sum(), weights)
    expected_grads = torch.autograd.grad(expected.square().sum(), weights)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_char_lstm_is_lstm_on_the_embedding_of_the_indices():
    module = _build("char_lstm", classes=80).module
    x = _inputs("char_lstm", 80, 4)
    reference = module.fc(module.lstm(module.embedding(x.long()))[0][:, -1])
    torch.testing.assert_close(module(x), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_initial_vector_is_determined_by_the_seed(kind):
    state = torch.random.get_rng_state()
    first, again, other = (_build(kind, seed=s).initial_vector() for s in (7, 7, 8))
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("kind, shape", [
    ("femnist_cnn", (3, 32, 32)), ("femnist_cnn", (784,)), ("femnist_cnn", (1, 8, 8)),
    ("char_lstm", (1, 28, 28)), ("char_lstm", (60,)),
    ("resnet18_gn", (60,)), ("resnet18_gn", (32, 32)),
    ("bn_cnn", (64,)), ("bn_cnn", (1, 2, 8)),
])
def test_features_of_the_wrong_shape_are_refused(kind, shape):
    with pytest.raises(ScenarioError) as caught:
        _build(kind, shape)
    assert caught.value.key == "model.kind" and caught.value.value == kind
    assert str(caught.value).endswith(f"(features here have shape {list(shape)})")
    assert "\n" not in str(caught.value)


def _scenario_file(tmp_path) -> str:
    path = tmp_path / "zoo.yaml"
    path.write_text("name: zoo\nruntime:\n  backend: local\n")
    return str(path)


@pytest.mark.parametrize("command, overrides", [
    ("validate", ["data.kind=gaussian_mixture", "model.kind=femnist_cnn"]),
    ("run", ["data.kind=synthetic_images", "data.num_clients=4", "model.kind=char_lstm"]),
])
def test_command_line_refuses_the_wrong_data_with_one_line(tmp_path, command, overrides):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", command, _scenario_file(tmp_path), *overrides,
                           "execution.clients_per_round=4", f"output.dir={out}"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.kind = "), proc.stderr
    assert "features here have shape" in lines[0]
    assert not (out / "rounds.parquet").exists()


def test_wrong_data_is_refused_before_ray_starts(tmp_path):
    """On the ray backend: one line, and Ray never started (no session directory in its temp dir)."""
    ray_tmp = tmp_path / "ray"
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", _scenario_file(tmp_path),
                           "data.kind=synthetic_images", "data.num_clients=4", "model.kind=femnist_cnn",
                           "execution.clients_per_round=4", "runtime.backend=ray", "runtime.num_cpus=2",
                           f"output.dir={tmp_path / 'out'}"], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "RAY_TMPDIR": str(ray_tmp)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: model.kind = 'femnist_cnn': expected 28x28 grey-scale images of shape [1, 28, 28] (leaf FEMNIST, "
        "mnist, fashion_mnist; synthetic_images with data.image_shape=[1,28,28]) (features here have shape "
        "[3, 32, 32])"]
    assert not ray_tmp.exists()


@pytest.mark.parametrize("overrides, shape", [
    (["data.kind=synthetic_images", "model.kind=femnist_cnn"], [3, 32, 32]),
    (["data.kind=synthetic_images", "model.kind=char_lstm"], [3, 32, 32]),
    (["data.kind=gaussian_mixture", "model.kind=cnn"], [60]),
    (["data.kind=gaussian_mixture", "model.kind=resnet18_gn"], [60]),
    (["data.kind=gaussian_mixture", "model.kind=bn_cnn"], [60]),
])
def test_prepare_refuses_the_wrong_shape_before_meanwhile(tmp_path, overrides, shape):
    cfg = load_scenario(None, ["runtime.backend=local", "data.num_clients=4", "execution.clients_per_round=4",
                               f"output.dir={tmp_path}", *overrides])
    started = []
    with pytest.raises(ScenarioError, match=rf"\(features here have shape {re.escape(str(shape))}\)$"):
        prepare(cfg, meanwhile=lambda: started.append(True))
    assert not started


def _run(tmp_path, name: str, *overrides: str) -> tuple[dict, dict]:
    """(summary, rounds.parquet as a dict) of a small local run."""
    cfg = load_scenario(None, ["name=zoo", "runtime.backend=local", f"output.dir={tmp_path}/{name}",
                               "output.flush_seconds=0", "eval.every=1", *overrides])
    summary = run_scenario(prepare(cfg), LocalRuntime())
    return summary, pq.read_table(tmp_path / name / "rounds.parquet").to_pydict()


FEMNIST_RUN = ("data.kind=synthetic_images", "data.image_shape=[1,28,28]", "data.num_clients=4",
               "data.samples_per_client=40", "model.kind=femnist_cnn", "execution.rounds=3",
               "execution.clients_per_round=4", "algorithm.lr=0.05")


def test_femnist_cnn_trains_and_repeats_bit_for_bit(tmp_path):
    summary, rounds = _run(tmp_path, "a", *FEMNIST_RUN)
    assert summary["status"] == "completed"
    assert rounds["train_loss"][-1] < rounds["train_loss"][0]
    assert rounds["test_loss"][-1] < rounds["test_loss"][0]
    again, _ = _run(tmp_path, "b", *FEMNIST_RUN)
    assert again["model_sha256"] == summary["model_sha256"]


def test_char_lstm_trains_on_parquet_character_sequences(tmp_path):
    vocab, length = 12, 80
    text = np.random.default_rng(0).integers(0, vocab, 400)
    text[::2] = np.arange(200) % vocab  # a predictable next character for half the positions
    starts = np.arange(0, 400 - length - 1, 3)  # labels (the next characters) take every value: vocab = classes
    columns = {f"c{i}": text[starts + i] for i in range(length)}
    pq.write_table(pa.table({"client_id": np.arange(len(starts)) % 3, **columns, "label": text[starts + length]}),
                   tmp_path / "chars.parquet")
    summary, rounds = _run(tmp_path, "lstm", "data.kind=parquet", f"data.path={tmp_path}/chars.parquet",
                           "model.kind=char_lstm", "execution.rounds=2", "execution.clients_per_round=3",
                           "algorithm.lr=0.5", "algorithm.batch_size=8")
    assert summary["status"] == "completed"
    assert rounds["train_loss"][-1] < rounds["train_loss"][0]


def test_resnet18_gn_runs_a_round(tmp_path):
    summary, rounds = _run(tmp_path, "resnet", "data.kind=synthetic_images", "data.num_clients=2",
                           "data.samples_per_client=4", "model.kind=resnet18_gn", "execution.rounds=1",
                           "execution.clients_per_round=2", "algorithm.batch_size=4", "algorithm.lr=0.01")
    assert summary["status"] == "completed"
    assert np.isfinite(rounds["train_loss"][0]) and np.isfinite(rounds["test_loss"][0])


def test_bn_cnn_trains_on_digits_above_chance(tmp_path):
    summary, rounds = _run(tmp_path, "bn", "data.kind=digits", "data.num_clients=10", "model.kind=bn_cnn",
                           "execution.rounds=4", "execution.clients_per_round=10", "algorithm.local_steps=5",
                           "algorithm.batch_size=16", "algorithm.lr=0.05")
    assert summary["status"] == "completed"
    assert rounds["train_loss"][-1] < rounds["train_loss"][0]
    assert summary["final_test_accuracy"] > 0.5  # chance: 0.1


def test_bn_cnn_tests_each_client_on_a_batch_of_its_own_rows():
    """Batch statistics: a client's test figures are those of its rows alone, whoever shares its task."""
    from raysim.algorithms import RowData
    from raysim.engine.evaluation import client_tests

    model = _build("bn_cnn")
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(9, 1, 8, 8, generator=gen), torch.randint(0, 10, (9,), generator=gen)
    offsets = np.array([[0, 2, 5], [5, 6, 9]])  # client 0: train 0-1, test 2-4; client 1: train 5, test 6-8
    both = client_tests(model, model.initial_vector(), RowData(x, y, offsets), np.array([0, 1]))
    alone = client_tests(model, model.initial_vector(), RowData(x[5:], y[5:], offsets[1:] - 5), np.array([1]))
    assert both.test_loss_sum[1] == alone.test_loss_sum[0] and both.test_correct[1] == alone.test_correct[0]
