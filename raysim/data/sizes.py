"""The sizes of a data set, from its data keys alone (and, for data files, their headers and
metadata): its rows, their feature shape, its classes and clients, and the bytes of its federated
table. The memory estimate (:mod:`raysim.footprint`) and ``data.on_demand: auto``
(:func:`raysim.data.builds_on_demand`) read them here.
"""

from __future__ import annotations

import math

from raysim.data._checks import quadratic_shapes, test_rows_beside
from raysim.data.cifar import CIFAR_FORMATS, CIFAR_SHAPE, cifar_rows
from raysim.data.generators import DIGITS_ROWS, DIGITS_SHAPE, IMAGE_SHAPE, LEAF_MEAN_ROWS, gaussian_mixture_rows
from raysim.data.idx import MNIST_CLASSES, mnist_shape
from raysim.data.parquet import parquet_shape

ROW_BYTES = 4 + 1 + 8  # client_id int32, split int8, label int64; features add 4 bytes each


def table_bytes(d) -> float:
    """Bytes of the federated table of the data keys ``d`` (every client's rows, or statistics)."""
    if d.kind == "quadratic":
        return d.num_clients * quadratic_client_bytes(d)
    rows, features, *_ = data_shape(d)
    return rows * (ROW_BYTES + 4 * math.prod(features))


def data_shape(d) -> tuple:
    """(rows, feature shape, classes, clients, keys it grows with) of the data keys ``d``."""
    clients = (("data.num_clients", d.num_clients),)
    if d.kind == "gaussian_mixture":
        return gaussian_mixture_rows(d.num_clients), (60,), 10, d.num_clients, clients
    if d.kind == "leaf_synthetic":
        return d.num_clients * LEAF_MEAN_ROWS, (60,), 10, d.num_clients, clients
    if d.kind == "digits":
        return DIGITS_ROWS, DIGITS_SHAPE, 10, d.num_clients, clients
    if d.kind == "blobs":
        return (d.num_samples, (d.num_features,), d.num_classes, d.num_clients,
                (("data.num_samples", d.num_samples), ("data.num_features", d.num_features)) + clients)
    if d.kind == "quadratic":
        return (d.num_clients, (d.d_theta, d.d_w), 0, d.num_clients,
                clients + (("data.d_theta", d.d_theta), ("data.d_w", d.d_w), ("data.n", d.n)))
    if d.kind == "saddle":
        rows = d.num_clients * (d.samples_per_client + test_rows_beside(d.samples_per_client, d.test_fraction))
        return (rows, (d.dim,), 2, d.num_clients,
                clients + (("data.samples_per_client", d.samples_per_client), ("data.dim", d.dim)))
    if d.kind == "synthetic_images":
        rows = d.num_clients * (d.samples_per_client + test_rows_beside(d.samples_per_client, d.test_fraction))
        shape = IMAGE_SHAPE if d.image_shape is None else tuple(d.image_shape)
        return (rows, shape, d.num_classes, d.num_clients,
                clients + (("data.samples_per_client", d.samples_per_client), ("data.image_shape", list(shape))))
    if d.kind == "parquet":
        feature_columns = None if d.feature_columns is None else list(d.feature_columns)
        rows, width, classes, num_clients = parquet_shape(d.path, d.label_column, d.client_column, feature_columns)
        shape = (width,) if d.image_shape is None else tuple(d.image_shape)
        return rows, shape, classes, num_clients, (("data.path", d.path),)
    if d.kind in ("mnist", "fashion_mnist"):
        rows, shape = mnist_shape(d.path)
        return rows, shape, MNIST_CLASSES, d.num_clients, (("data.path", d.path),)
    if d.kind in ("cifar10", "cifar100"):
        fmt = CIFAR_FORMATS[d.kind]
        return cifar_rows(d.path, fmt), CIFAR_SHAPE, fmt.num_classes, d.num_clients, (("data.path", d.path),)
    if d.kind == "leaf":  # rows, their shape, classes and users are known only once the JSON is parsed (the
        # task is told from the rows): peeking at a row means parsing a whole file, a good part of the load
        # itself. Sized from its files instead (estimate); 0 clients: unknown
        return 0, (0,), 0, 0, (("data.path", d.path),)
    return 0, (0,), 0, d.num_clients, clients  # a custom kind


def quadratic_client_bytes(d) -> int:
    """One quadratic client's float64 statistics P, q, C, D, e, c."""
    return 8 * sum(math.prod(shape) for shape in quadratic_shapes(d.d_theta, d.d_w).values())
