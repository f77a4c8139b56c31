"""MNIST and Fashion-MNIST from their IDX files (``train-images-idx3-ubyte`` … , each optionally
gzipped) in a directory: the training and t10k images pooled and split over clients as ``digits``."""

from __future__ import annotations

import math

import numpy as np

from raysim.data.federated import FederatedDataset
from raysim.data.files import check_labels, find_file, partition_images, read_bytes
from raysim.errors import ScenarioError

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
MNIST_CLASSES = 10
_UNSIGNED_BYTE = 0x08  # the IDX type code of unsigned bytes


def read_idx(path: str, dims: int) -> np.ndarray:
    """The unsigned-byte array of the IDX file ``path`` (gzipped when its name ends in ``.gz``),
    which must have ``dims`` dimensions and exactly the bytes its header announces. The header is
    read first, and then never more than it announces (and one byte, to tell a longer file): a
    small gzip file holding gigabytes behind a header of a few images is refused, not decompressed."""
    shape = idx_shape(path, dims)
    size, header = math.prod(shape), 4 + 4 * dims
    data = read_bytes(path, header + size + 1)
    if len(data) - header != size:
        found = "more" if len(data) - header > size else len(data) - header
        raise ScenarioError("data.path", path, f"{size} bytes of data after the header, as its sizes "
                                               f"{list(shape)} say (the file has {found})")
    return np.frombuffer(data, np.uint8, size, header).reshape(shape)


def idx_shape(path: str, dims: int) -> tuple[int, ...]:
    """The sizes in the header of the IDX file ``path``: its first bytes only (decompressed as far as needed)."""
    return _header(read_bytes(path, 4 + 4 * dims), dims, path)


def _header(data: bytes, dims: int, path: str) -> tuple[int, ...]:
    """The sizes in the IDX header at the start of ``data`` (unsigned bytes in ``dims`` dimensions)."""
    magic = bytes([0, 0, _UNSIGNED_BYTE, dims])
    if data[:4] != magic:
        raise ScenarioError("data.path", path, f"an IDX file of unsigned bytes in {dims} dimension(s): magic number "
                                               f"0x{magic.hex()} (found 0x{data[:4].hex()})")
    header = 4 + 4 * dims
    if len(data) < header:
        raise ScenarioError("data.path", path, f"an IDX header of {header} bytes (the file has {len(data)})")
    return tuple(int(v) for v in np.frombuffer(data, ">u4", dims, 4))


def idx_file(directory: str, name: str) -> str:
    """The IDX file ``name`` (one of :data:`IDX_FILES`) or ``name.gz`` in ``directory``."""
    what = "the IDX files " + ", ".join(IDX_FILES) + " (each may end in .gz)"
    return find_file(directory, [name, name + ".gz"], what)


def mnist_shape(directory: str) -> tuple[int, tuple[int, ...]]:
    """(images, shape of one) of the pooled set :func:`load_mnist` reads, from the image files' headers."""
    train, test = (idx_shape(idx_file(directory, name), 3) for name in (IDX_FILES[0], IDX_FILES[2]))
    return train[0] + test[0], (1, *train[1:])


def _images_and_labels(directory: str, images_name: str, labels_name: str) -> tuple[np.ndarray, np.ndarray]:
    """One part (train or t10k): images ``[N, H, W]`` and their labels in [0, 10)."""
    labels_path = idx_file(directory, labels_name)
    images_path = idx_file(directory, images_name)
    labels = read_idx(labels_path, 1).astype(np.int64)
    images = read_idx(images_path, 3)
    if len(images) != len(labels):
        raise ScenarioError("data.path", images_path, f"as many images as {labels_path} has labels "
                                                      f"({len(labels)}; found {len(images)})")
    check_labels(labels, MNIST_CLASSES, labels_path)
    return images, labels


def load_mnist(path: str, num_clients: int, partition_cfg, test_fraction: float, seed: int) -> FederatedDataset:
    """MNIST or Fashion-MNIST (the same files) in the directory ``path``: images of shape
    ``[1, 28, 28]`` scaled to [0, 1], 10 classes. The training and t10k images are pooled and
    split over ``num_clients`` clients by ``partition_cfg``, each keeping ``test_fraction`` of its
    rows for testing, exactly as ``digits``."""
    train_images, train_labels = _images_and_labels(path, IDX_FILES[0], IDX_FILES[1])
    test_images, test_labels = _images_and_labels(path, IDX_FILES[2], IDX_FILES[3])
    if train_images.shape[1:] != test_images.shape[1:]:
        raise ScenarioError("data.path", path, f"training and t10k images of one size (found "
                                               f"{list(train_images.shape[1:])} and {list(test_images.shape[1:])})")
    pixels = np.concatenate([train_images, test_images])[:, None]
    return partition_images(pixels, np.concatenate([train_labels, test_labels]), MNIST_CLASSES, num_clients,
                            partition_cfg, test_fraction, seed)
