"""CIFAR-10 and CIFAR-100 from their binary versions: records of label byte(s) then 3072 pixel bytes
(32x32 red, then green, then blue), the training and test files pooled and split over clients as
``digits``."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from raysim.data.federated import FederatedDataset
from raysim.data.files import check_labels, find_file, partition_images, read_bytes
from raysim.errors import ScenarioError

CIFAR_SHAPE = (3, 32, 32)
_PIXELS = 3 * 32 * 32


@dataclass(frozen=True)
class CifarFormat:
    """Where one CIFAR variant's binary files are and how its records look."""

    folder: str  # the directory its archive unpacks to
    files: tuple[str, ...]  # training files, then the test file
    label_bytes: int  # label bytes before the pixels; the last of them is the label used
    num_classes: int

    @property
    def record_bytes(self) -> int:
        return self.label_bytes + _PIXELS


CIFAR10 = CifarFormat("cifar-10-batches-bin", tuple(f"data_batch_{i}.bin" for i in range(1, 6)) + ("test_batch.bin",),
                      1, 10)
CIFAR100 = CifarFormat("cifar-100-binary", ("train.bin", "test.bin"), 2, 100)  # coarse, then fine label
CIFAR_FORMATS = {"cifar10": CIFAR10, "cifar100": CIFAR100}  # data.kind -> its format


def read_records(path: str, fmt: CifarFormat) -> tuple[np.ndarray, np.ndarray]:
    """Pixels ``[N, 3, 32, 32]`` (uint8) and labels of the CIFAR binary file ``path``."""
    data = read_bytes(path)
    size = fmt.record_bytes
    if not data or len(data) % size:
        raise ScenarioError("data.path", path, f"records of {size} bytes ({fmt.label_bytes} label byte(s) and "
                                               f"{_PIXELS} pixels; the file has {len(data)} bytes)")
    records = np.frombuffer(data, np.uint8).reshape(-1, size)
    labels = records[:, fmt.label_bytes - 1].astype(np.int64)
    check_labels(labels, fmt.num_classes, path)
    return records[:, fmt.label_bytes:].reshape(-1, *CIFAR_SHAPE), labels


def cifar_files(path: str, fmt: CifarFormat) -> list[str]:
    """The binary files of ``fmt`` (training, then test) in ``path`` or its subdirectory ``fmt.folder``."""
    folder = os.path.join(path, fmt.folder)
    directory = folder if os.path.isdir(folder) else path
    what = f"the CIFAR files {', '.join(fmt.files)} (or {fmt.folder}/ with them)"
    return [find_file(directory, [name], what) for name in fmt.files]


def cifar_rows(path: str, fmt: CifarFormat) -> int:
    """Records in the files :func:`load_cifar` reads, from their sizes (a partial record is refused there)."""
    return sum(os.path.getsize(file) // fmt.record_bytes for file in cifar_files(path, fmt))


def load_cifar(path: str, fmt: CifarFormat, num_clients: int, partition_cfg, test_fraction: float,
               seed: int) -> FederatedDataset:
    """CIFAR-10 (``fmt`` :data:`CIFAR10`) or CIFAR-100 (:data:`CIFAR100`, fine labels) in ``path`` or its
    subdirectory ``fmt.folder``: images ``[3, 32, 32]`` scaled to [0, 1]. The training and test
    records are pooled and split over ``num_clients`` clients by ``partition_cfg``, each keeping
    ``test_fraction`` of its rows for testing, exactly as ``digits``."""
    parts = [read_records(file, fmt) for file in cifar_files(path, fmt)]
    return partition_images(np.concatenate([p for p, _ in parts]), np.concatenate([y for _, y in parts]),
                            fmt.num_classes, num_clients, partition_cfg, test_fraction, seed)
