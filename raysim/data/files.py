"""Data sets read from the user's files at ``data.path``: what each kind expects there, how its
files are found and read, and how a centralized image set read from them is split over clients."""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from raysim.data.federated import FederatedDataset, client_order
from raysim.data.leaf import has_own_split
from raysim.data.parquet import SPLIT_COLUMN, has_split_column
from raysim.data.partition import partition
from raysim.errors import ScenarioError

_CHUNK = 2 ** 20  # bytes read at a time from a file whose size a header declares


def own_split(kind: str, path) -> str | None:
    """What in the files at ``path`` fixes the train/test split of a ``kind`` data set (so that
    data.test_fraction has nothing to do), or None."""
    if not path:
        return None
    if kind == "leaf" and has_own_split(path):
        return "data.path has train/ and test/, LEAF's own split"
    if kind == "parquet" and has_split_column(path):
        return f"data.path has a {SPLIT_COLUMN!r} column, which splits the rows"
    return None


def find_file(directory: str, names: list[str], what: str) -> str:
    """The first of ``names`` that exists in ``directory``; else ScenarioError naming ``what`` the
    directory should hold."""
    for name in names:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    raise ScenarioError("data.path", directory, f"a directory holding {what} ({' or '.join(names)} is missing)")


def read_bytes(path: str, size: int = -1) -> bytes:
    """The bytes of ``path`` (only its first ``size`` when >= 0), decompressed when its name ends in
    ``.gz`` (only as far as ``size`` needs). Read in chunks: the memory taken grows with what the
    file holds, never past ``size``, whatever ``size`` a header declares."""
    try:
        with open(path, "rb") as f:
            if not path.endswith(".gz"):
                return _read_at_most(f, size)
            with gzip.GzipFile(fileobj=f) as unzipped:
                return _gunzipped(lambda: _read_at_most(unzipped, size), path)
    except OSError as exc:
        raise ScenarioError("data.path", path, f"a readable file ({exc.strerror})") from None


def _read_at_most(f, size: int) -> bytes:
    """The first ``size`` bytes of the file object ``f`` (all of them when ``size`` < 0), fewer if it ends first."""
    if size < 0:
        return f.read()
    chunks = []
    while size > 0 and (chunk := f.read(min(size, _CHUNK))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _gunzipped(decompress, path: str) -> bytes:
    """``decompress()``, its errors a ScenarioError naming the gzip file ``path``."""
    try:
        return decompress()
    except (OSError, EOFError, zlib.error) as exc:
        raise ScenarioError("data.path", path, f"a complete gzip file ({exc})") from None


def check_labels(labels: np.ndarray, num_classes: int, path: str) -> None:
    """Every label lies in [0, ``num_classes``); else ScenarioError naming ``path`` and the first bad one."""
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        raise ScenarioError("data.path", path, f"labels in [0, {num_classes - 1}] "
                                               f"(record {int(np.argmax(bad))} has {labels[np.argmax(bad)]})")


def partition_images(pixels: np.ndarray, labels: np.ndarray, num_classes: int, num_clients: int, partition_cfg,
                     test_fraction: float, seed: int) -> FederatedDataset:
    """8-bit images ``pixels`` ``[N, C, H, W]`` with ``labels`` split over clients by the partitioner
    (:func:`raysim.data.partition.partition`, as ``digits``), pixels scaled to [0, 1]."""
    train, test = partition(labels, num_clients, partition_cfg, test_fraction, seed)
    order = client_order(train, test)
    x = pixels[order].astype(np.float32)
    x /= 255
    return FederatedDataset.from_sorted(x, labels[order], [len(t) for t in train], [len(t) for t in test],
                                        num_classes, pixels.shape[1:])
