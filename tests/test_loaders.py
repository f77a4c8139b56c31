"""Loaders of the standard FL data sets from local files (LEAF JSON, MNIST / Fashion-MNIST IDX, CIFAR
binaries): exact arrays, the split over clients, determinism, and every bad file through the CLI."""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raysim.scenario import load_scenario
from raysim.data import build_dataset, load_cifar, load_leaf, load_mnist
from raysim.data.cifar import CIFAR10, CIFAR100
from raysim.data.idx import read_idx
from raysim.data.leaf import VOCABULARY
from raysim.data.partition import split_train_test
from raysim.errors import ScenarioError
from raysim.streams import Purpose, stream

REPO = Path(__file__).resolve().parents[1]


# --- writing tiny files in each format ------------------------------------------------------------

def write_idx(path: Path, array: np.ndarray, magic: bytes | None = None, cut: int = 0) -> Path:
    """``array`` (unsigned bytes) as an IDX file, gzipped when ``path`` ends in .gz; ``magic``
    replaces the magic number and ``cut`` drops bytes from the end."""
    data = (magic or bytes([0, 0, 8, array.ndim])) + b"".join(struct.pack(">I", s) for s in array.shape)
    data = (data + array.astype(np.uint8).tobytes())[:len(data) + array.size - cut]
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def images(count: int, first: int = 0, size: int = 28) -> np.ndarray:
    """``count`` distinct images: image i holds (first + i + pixel number) mod 256, so its first
    pixel tells which it is."""
    return (first + np.arange(count)[:, None, None] + np.arange(size * size).reshape(size, size)) % 256


def write_mnist(directory: Path, train: int = 20, test: int = 5, gz: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Fake MNIST files (train images gzipped when ``gz``); returns every image and label, train then t10k."""
    directory.mkdir(parents=True, exist_ok=True)
    pixels = images(train + test)
    labels = np.arange(train + test) % 10
    suffix = ".gz" if gz else ""
    write_idx(directory / f"train-images-idx3-ubyte{suffix}", pixels[:train])
    write_idx(directory / f"train-labels-idx1-ubyte{suffix}", labels[:train])
    write_idx(directory / "t10k-images-idx3-ubyte", pixels[train:])
    write_idx(directory / "t10k-labels-idx1-ubyte", labels[train:])
    return pixels, labels


def cifar_records(count: int, label_bytes: int, first: int = 0) -> bytes:
    """``count`` records: labels (coarse = record number mod 20, then the label = record number mod
    the classes) and 3072 pixels (first + record + pixel number) mod 256."""
    rows = first + np.arange(count)
    labels = [rows % 20, rows % 100] if label_bytes == 2 else [rows % 10]
    pixels = (rows[:, None] + np.arange(3072)) % 256
    return np.column_stack([*labels, pixels]).astype(np.uint8).tobytes()


def write_cifar10(directory: Path, per_file: int = 3) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate([f"data_batch_{k}.bin" for k in range(1, 6)] + ["test_batch.bin"]):
        (directory / name).write_bytes(cifar_records(per_file, 1, first=i * per_file))


def leaf_json(users: dict[str, tuple[list, list]], **replace) -> dict:
    """A LEAF file's object for ``{user: (x, y)}``; ``replace`` overrides its keys."""
    content = {"users": list(users), "num_samples": [len(x) for x, _ in users.values()],
               "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
    return {**content, **replace}


def write_json(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def shakespeare_rows(start: int, count: int) -> tuple[list[str], list[str]]:
    """``count`` windows of 80 characters of the vocabulary read cyclically, and the next character."""
    text = VOCABULARY * 3
    return ([text[start + i:start + i + 80] for i in range(count)],
            [text[start + i + 80] for i in range(count)])


def femnist_rows(value: float, count: int, label: int) -> tuple[list, list]:
    return [[value + i] * 784 for i in range(count)], [label + i for i in range(count)]


def data_config(*overrides):
    return load_scenario(None, ["runtime.backend=local", "model.kind=logreg", *overrides]).data


# --- MNIST / Fashion-MNIST ------------------------------------------------------------------------

@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
    array = images(3, size=4)
    path = write_idx(tmp_path / ("a.gz" if gz else "a"), array)
    read = read_idx(str(path), 3)
    assert read.dtype == np.uint8 and np.array_equal(read, array)


@pytest.mark.parametrize("kind", ["mnist", "fashion_mnist"])
def test_mnist_pools_train_and_t10k_scales_pixels_and_splits_like_digits(tmp_path, kind):
    pixels, labels = write_mnist(tmp_path)
    ds = build_dataset(data_config(f"data.kind={kind}", f"data.path={tmp_path}", "data.num_clients=3",
                                   "execution.clients_per_round=3", "data.test_fraction=0.25"), seed=0)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape) == (3, 10, (1, 28, 28))
    x, y = ds.features(), ds.labels()
    which = np.rint(x[:, 0] * 255).astype(int)  # image i's first pixel is i
    assert sorted(which) == list(range(25))  # every training and t10k image, once
    assert np.array_equal(x, pixels[which].reshape(25, 784).astype(np.float32) / 255)
    assert np.array_equal(y, labels[which])
    assert ds.train_sizes().tolist() == [7, 6, 6] and ds.test_sizes().tolist() == [2, 2, 2]  # 9, 8, 8 rows


def test_mnist_gzip_or_not_and_seed_decide_the_table(tmp_path):
    write_mnist(tmp_path / "gz", gz=True)
    write_mnist(tmp_path / "plain", gz=False)
    first = load_mnist(str(tmp_path / "gz"), 4, data_config().partition, 0.2, 7)
    assert first.table.equals(load_mnist(str(tmp_path / "gz"), 4, data_config().partition, 0.2, 7).table)
    assert first.table.equals(load_mnist(str(tmp_path / "plain"), 4, data_config().partition, 0.2, 7).table)
    assert not first.table.equals(load_mnist(str(tmp_path / "gz"), 4, data_config().partition, 0.2, 8).table)


def test_mnist_uses_every_partitioner(tmp_path):
    write_mnist(tmp_path, train=60, test=20)
    shards = build_dataset(data_config("data.kind=mnist", f"data.path={tmp_path}", "data.num_clients=4",
                                       "execution.clients_per_round=4", "data.partition.kind=shards",
                                       "data.partition.shards_per_client=1", "data.test_fraction=0"), seed=0)
    offsets = shards.offsets()
    assert shards.train_sizes().tolist() == [20] * 4  # label-sorted shards of 20 rows, 8 of each class:
    assert [len(np.unique(shards.labels()[a:e])) for a, _, e in offsets] == [3] * 4  # 3 classes each
    dirichlet = build_dataset(data_config("data.kind=mnist", f"data.path={tmp_path}", "data.num_clients=4",
                                          "execution.clients_per_round=4", "data.partition.kind=dirichlet"), seed=0)
    assert dirichlet.table.num_rows == 80 and dirichlet.num_clients == 4


# --- CIFAR ----------------------------------------------------------------------------------------

def test_cifar10_records_in_the_archive_folder_or_directly(tmp_path):
    write_cifar10(tmp_path / "cifar-10-batches-bin")
    write_cifar10(tmp_path / "flat")
    ds = build_dataset(data_config("data.kind=cifar10", f"data.path={tmp_path}", "data.num_clients=2",
                                   "execution.clients_per_round=2", "data.test_fraction=0"), seed=0)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape) == (2, 10, (3, 32, 32))
    x, y = ds.features(), ds.labels()
    which = np.rint(x[:, 0] * 255).astype(int)
    assert sorted(which) == list(range(18))
    expected = (which[:, None] + np.arange(3072)) % 256
    assert np.array_equal(x, expected.astype(np.float32) / 255)  # red plane, then green, then blue
    assert np.array_equal(y, which % 10)
    assert ds.table.equals(load_cifar(str(tmp_path / "flat"), CIFAR10, 2, data_config().partition, 0.0, 0).table)


def test_cifar100_uses_the_fine_label(tmp_path):
    (tmp_path / "train.bin").write_bytes(cifar_records(30, 2))
    (tmp_path / "test.bin").write_bytes(cifar_records(10, 2, first=30))
    ds = load_cifar(str(tmp_path), CIFAR100, 1, data_config().partition, 0.25, 0)
    assert ds.num_classes == 100 and ds.test_sizes().tolist() == [10]
    which = np.rint(ds.features()[:, 0] * 255).astype(int)
    assert sorted(which) == list(range(40)) and np.array_equal(ds.labels(), which % 100)


# --- LEAF -----------------------------------------------------------------------------------------

def test_leaf_femnist_keeps_leafs_split_one_client_per_writer_in_sorted_order(tmp_path):
    write_json(tmp_path / "train" / "b.json", leaf_json({"f2": femnist_rows(0.5, 2, 60)}))
    write_json(tmp_path / "train" / "a.json", leaf_json({"f1": femnist_rows(0.25, 1, 3), "f0": femnist_rows(0, 3, 0)}))
    write_json(tmp_path / "test" / "a.json", leaf_json({"f0": femnist_rows(0.75, 1, 9), "f2": femnist_rows(1, 2, 7)}))
    ds = build_dataset(data_config("data.kind=leaf", f"data.path={tmp_path}", "execution.clients_per_round=2"), seed=0)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape) == (3, 62, (1, 28, 28))
    assert ds.train_sizes().tolist() == [3, 1, 2] and ds.test_sizes().tolist() == [1, 0, 2]  # f0, f1, f2
    assert ds.features()[:, 0].tolist() == [0, 1, 2, 0.75, 0.25, 0.5, 1.5, 1, 2]
    assert ds.labels().tolist() == [0, 1, 2, 9, 3, 60, 61, 7, 8]
    assert np.array_equal(ds.features(), np.repeat(ds.features()[:, :1], 784, axis=1))


def test_leaf_shakespeare_characters_become_vocabulary_indices(tmp_path):
    write_json(tmp_path / "train" / "all.json",
               leaf_json({"HAMLET": shakespeare_rows(5, 2), "ARIEL": shakespeare_rows(0, 1)}))
    write_json(tmp_path / "test" / "all.json", leaf_json({"HAMLET": shakespeare_rows(79, 1)}))
    ds = load_leaf(str(tmp_path), 0.2, 0)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape) == (2, 80, (80,))
    assert ds.train_sizes().tolist() == [1, 2] and ds.test_sizes().tolist() == [0, 1]  # ARIEL, HAMLET
    expected = [np.arange(start, start + 80) % 80 for start in (0, 5, 6, 79)]
    assert np.array_equal(ds.features(), np.array(expected, dtype=np.float32))
    assert ds.labels().tolist() == [80 % 80, 85 % 80, 86 % 80, 159 % 80]
    assert VOCABULARY[int(ds.labels()[1])] == shakespeare_rows(5, 1)[1][0]


def test_leaf_synthetic_files_are_split_by_test_fraction_with_the_seed(tmp_path):
    rng = np.random.default_rng(0)
    users = {u: (rng.normal(size=(n, 60)).round(3).tolist(), rng.integers(0, 5, n).tolist())
             for u, n in (("u1", 10), ("u0", 5))}
    users["u0"][1][0] = 9
    write_json(tmp_path / "part1.json", leaf_json({"u1": users["u1"]}))
    write_json(tmp_path / "part0.json", leaf_json({"u0": users["u0"]}))
    ds = build_dataset(data_config("data.kind=leaf", f"data.path={tmp_path}", "data.test_fraction=0.2",
                                   "execution.clients_per_round=2"), seed=3)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape) == (2, 10, (60,))
    assert ds.train_sizes().tolist() == [4, 8] and ds.test_sizes().tolist() == [1, 2]
    x = np.concatenate([np.array(users[u][0], dtype=np.float32) for u in ("u0", "u1")])
    y = np.concatenate([users[u][1] for u in ("u0", "u1")])
    train, test = split_train_test([np.arange(5), np.arange(5, 15)], 0.2, stream(3, Purpose.PARTITION))
    order = np.concatenate([train[0], test[0], train[1], test[1]])
    assert np.array_equal(ds.features(), x[order]) and np.array_equal(ds.labels(), y[order])
    assert ds.table.equals(load_leaf(str(tmp_path), 0.2, 3).table)
    assert not ds.table.equals(load_leaf(str(tmp_path), 0.2, 4).table)
    single = write_json(tmp_path / "one" / "all.json", leaf_json(users))
    assert load_leaf(str(single), 0.2, 3).table.equals(ds.table)  # one file or a directory: the same users


def test_missing_files_and_inconsistent_leaf_users_are_refused(tmp_path):
    write_mnist(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ScenarioError, match=r"\(t10k-labels-idx1-ubyte or t10k-labels-idx1-ubyte\.gz is missing\)$"):
        load_mnist(str(tmp_path / "mnist"), 2, data_config().partition, 0.2, 0)
    with pytest.raises(ScenarioError, match=r"\(data_batch_1\.bin is missing\)$"):
        load_cifar(str(tmp_path), CIFAR10, 2, data_config().partition, 0.2, 0)
    write_json(tmp_path / "leaf" / "train" / "a.json", leaf_json({"a": femnist_rows(0, 2, 0)}))
    stray = write_json(tmp_path / "leaf" / "test" / "a.json", leaf_json({"b": femnist_rows(0, 1, 0)}))
    with pytest.raises(ScenarioError, match=rf"^data\.path = '{stray}': expected test users that also have training"):
        load_leaf(str(tmp_path / "leaf"), 0.2, 0)
    mixed = write_json(tmp_path / "mixed.json", leaf_json({"a": femnist_rows(0, 1, 0), "b": shakespeare_rows(0, 1)}))
    with pytest.raises(ScenarioError, match=r"expected rows of one LEAF task \(femnist, as the first user's; user 'b'"):
        load_leaf(str(mixed), 0.2, 0)


def test_data_path_applies_to_the_file_kinds_only(tmp_path):
    with pytest.raises(ScenarioError, match=r"^data\.path = None: expected an existing directory of the MNIST IDX"):
        data_config("data.kind=mnist")
    with pytest.raises(ScenarioError, match=r"^data\.path = '.*nowhere': expected an existing LEAF JSON file"):
        data_config("data.kind=leaf", f"data.path={tmp_path / 'nowhere'}")
    with pytest.raises(ScenarioError, match=r"^data\.path = .*: expected no setting \(it applies only with data\.kind"):
        data_config("data.kind=digits", f"data.path={tmp_path}")
    with pytest.raises(ScenarioError, match=r"^data\.partition\.kind = 'iid': expected no setting"):
        data_config("data.kind=leaf", f"data.path={tmp_path}", "data.partition.kind=iid")


# --- bad files, through the command line ----------------------------------------------------------

def raysim(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raysim.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def scenario(tmp_path: Path, kind: str, path: Path, model: str = "logreg", **execution) -> str:
    """A tiny scenario file over the data set ``kind`` at ``path``."""
    content = {"name": "loaders", "data": {"kind": kind, "path": str(path), "num_clients": 2},
               "model": {"kind": model}, "algorithm": {"name": "fedavg", "lr": 0.1, "batch_size": 4},
               "execution": {"rounds": 1, "clients_per_round": 2, **execution}, "runtime": {"backend": "local"},
               "output": {"dir": str(tmp_path / "out")}}
    if kind in ("leaf", "parquet"):  # their files decide the clients
        del content["data"]["num_clients"]
    target = tmp_path / "scenario.yaml"
    target.write_text(yaml.safe_dump(content))
    return str(target)


def leaf_file(content):
    """A case: the LEAF file ``content`` is data.path."""
    def make(t: Path) -> tuple[str, Path, Path]:
        path = write_json(t / "leaf" / "train.json", content)
        return "leaf", path, path
    return make


def mnist_file(name: str, array: np.ndarray, **how):
    """A case: fake MNIST files, with ``name`` replaced by ``array`` written as ``write_idx`` does."""
    def make(t: Path) -> tuple[str, Path, Path]:
        write_mnist(t / "mnist")
        return "mnist", t / "mnist", write_idx(t / "mnist" / name, array, **how)
    return make


def cifar_file(kind: str, name: str, content: bytes):
    """A case: fake CIFAR files of ``kind``, with the file ``name`` holding ``content``."""
    def make(t: Path) -> tuple[str, Path, Path]:
        if kind == "cifar10":
            write_cifar10(t / "c")
        else:
            (t / "c").mkdir()
            (t / "c" / "train.bin").write_bytes(cifar_records(3, 2))
        (t / "c" / name).write_bytes(content)
        return kind, t / "c", t / "c" / name
    return make


NOT_LEAF = "LEAF JSON: an object with users, num_samples and user_data"
BAD_FILES = {
    "leaf not json": (leaf_file('{"users": ["a"'), NOT_LEAF + " (Expecting"),
    "leaf no user_data": (leaf_file({"users": ["a"], "num_samples": [1]}),
                          NOT_LEAF + " (found ['num_samples', 'users'])"),
    "leaf num_samples": (leaf_file(leaf_json({"a": femnist_rows(0, 2, 0)}, num_samples=[3])),
                         "(num_samples [3] does not match the users' rows [2])"),
    "leaf character": (leaf_file(leaf_json({"a": (["é" * 80], ["a"])})),
                       "characters of LEAF's Shakespeare vocabulary (user 'a' has 'é')"),
    "femnist label": (leaf_file(leaf_json({"a": femnist_rows(0, 1, 62)})),
                      "labels in [0, 61] (user 'a' has labels from 62 to 62)"),
    "idx magic": (mnist_file("t10k-images-idx3-ubyte", images(5), magic=bytes([0, 0, 8, 1])),
                  "an IDX file of unsigned bytes in 3 dimension(s): magic number 0x00000803 (found 0x00000801)"),
    "idx truncated": (mnist_file("t10k-images-idx3-ubyte", images(5), cut=10),
                      "3920 bytes of data after the header, as its sizes [5, 28, 28] say (the file has 3910)"),
    "idx gzip truncated": (mnist_file("train-images-idx3-ubyte.gz", images(20), cut=1),
                           "15680 bytes of data after the header, as its sizes [20, 28, 28] say (the file has 15679)"),
    "mnist label": (mnist_file("t10k-labels-idx1-ubyte", np.array([0, 1, 10, 2, 3])),
                    "labels in [0, 9] (record 2 has 10)"),
    "cifar record length": (cifar_file("cifar10", "data_batch_2.bin", bytes(3074)),
                            "records of 3073 bytes (1 label byte(s) and 3072 pixels; the file has 3074 bytes)"),
    "cifar10 label": (cifar_file("cifar10", "test_batch.bin", bytes([10]) + bytes(3072)),
                      "labels in [0, 9] (record 0 has 10)"),
    "cifar100 label": (cifar_file("cifar100", "test.bin", bytes([1, 100]) + bytes(3072)),
                       "labels in [0, 99] (record 0 has 100)"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_file_is_one_error_line_naming_it(tmp_path, case):
    make, allowed = BAD_FILES[case]
    kind, data_path, bad_file = make(tmp_path)
    proc = raysim("validate", scenario(tmp_path, kind, data_path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: data.path = '{bad_file}': expected "), lines[0]
    assert allowed in lines[0], lines[0]


def test_cnn_refuses_shakespeare_rows_in_one_line(tmp_path):
    path = write_json(tmp_path / "s.json", leaf_json({"a": shakespeare_rows(0, 2), "b": shakespeare_rows(3, 2)}))
    proc = raysim("validate", scenario(tmp_path, "leaf", path, model="cnn"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.kind = 'cnn': expected image data"), proc.stderr
    assert lines[0].endswith(f"(features of data.path '{path}' have shape [80])")  # the file, what it holds


def test_run_a_cnn_on_a_tiny_fake_mnist(tmp_path):
    write_mnist(tmp_path / "mnist", train=40, test=8)
    proc = raysim("run", scenario(tmp_path, "mnist", tmp_path / "mnist", model="cnn", rounds=2), "--quiet",
                  "model.channels=[4]", "data.num_clients=4")
    assert proc.returncode == 0, proc.stderr
    rounds = pq.read_table(tmp_path / "out" / "rounds.parquet")
    assert rounds.num_rows == 2  # one row per round


def test_leaf_users_decide_the_clients_and_data_num_clients_is_refused(tmp_path):
    users = {f"w{i}": femnist_rows(i / 4, 3, i) for i in range(3)}
    path = write_json(tmp_path / "leaf" / "all.json", leaf_json(users))
    file = scenario(tmp_path, "leaf", path)
    proc = raysim("validate", file, "data.num_clients=2")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: data.num_clients = 2: expected no setting (it applies only with data.kind not in {parquet, leaf} "
        "(here data.kind = 'leaf'))"]
    proc = raysim("run", "--quiet", file, "execution.clients_per_round=3")
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(tmp_path / "out" / "rounds.parquet").num_rows == 1
    proc = raysim("run", file, "--quiet", "execution.clients_per_round=4")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: execution.clients_per_round = 4: expected an integer in [1, 3] (the data set's number of clients)"]


@pytest.mark.parametrize("example, overrides", [
    ("femnist", ["execution.clients_per_round=2", "eval.clients=2"]),
    ("shakespeare", ["execution.clients_per_round=2", "eval.clients=2", "algorithm.local_steps=1"]),
    ("cifar10_resnet", ["data.num_clients=2", "execution.clients_per_round=2",
                        "algorithm.local_epochs=1"]),
])
def test_example_scenarios_run_on_tiny_files_of_their_formats(tmp_path, example, overrides):
    """scenarios/examples/{femnist,shakespeare,cifar10_resnet}.yaml, pointed at a few records in
    each format, run a round and write their logs."""
    if example == "cifar10_resnet":
        write_cifar10(tmp_path / "data" / "cifar-10-batches-bin", per_file=4)
    else:
        rows = femnist_rows if example == "femnist" else (lambda i, n, _: shakespeare_rows(i, n))
        for split, count in (("train", 3), ("test", 1)):
            write_json(tmp_path / "data" / split / "all.json",
                       leaf_json({f"u{i}": rows(i, count, i) for i in range(3)}))
    proc = raysim("run", f"scenarios/examples/{example}.yaml", "--quiet", f"data.path={tmp_path / 'data'}",
                  "execution.rounds=1", "eval.every=1", "runtime.backend=local", f"output.dir={tmp_path / 'out'}",
                  *overrides)
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(tmp_path / "out" / "rounds.parquet").num_rows == 1
