"""Load a federated dataset from Parquet: one row per sample, with a client and a label column."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raysim.data._checks import check_test_fraction
from raysim.data.federated import FederatedDataset
from raysim.errors import ScenarioError
from raysim.streams import Purpose, stream

SPLIT_COLUMN = "split"
MAX_CLASSES = 2 ** 20  # labels are class indices: the model has one output per class


def _array(table: pa.Table, name: str) -> pa.Array:
    """A column as one Array, dictionary-decoded (hive partition columns are dictionaries)."""
    arr = table.column(name).combine_chunks()
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _features(table: pa.Table, columns: list[str], requested, path: str) -> np.ndarray:
    """float32 ``[N, D]`` from one list column or several numeric scalar columns, all finite."""
    def bad(allowed: str) -> ScenarioError:
        return ScenarioError("data.feature_columns", requested, allowed)

    if not columns:
        raise bad("at least one feature column besides the label, client and split columns")
    arrays = [_array(table, name) for name in columns]
    for name, a in zip(columns, arrays):
        if a.null_count:
            raise ScenarioError("data.path", path, f"feature columns without missing values (column {name!r} has "
                                                   f"{a.null_count} missing)")
    n = table.num_rows
    if len(arrays) == 1 and _is_list(arrays[0].type):
        lengths = pc.list_value_length(arrays[0]).to_numpy(zero_copy_only=False)
        values = [arrays[0].flatten()]
        if not _is_numeric(values[0].type) or values[0].null_count:
            raise ScenarioError("data.path", path, f"a list column of numbers without missing values (column "
                                                   f"{columns[0]!r} holds {values[0].type}, {values[0].null_count} "
                                                   "missing)")
        if (lengths != lengths[0]).any() or lengths[0] == 0:
            raise bad("a list column whose rows all have the same, non-zero length")
        with np.errstate(over="ignore"):  # a value beyond float32's range becomes inf, reported below
            x = values[0].to_numpy(zero_copy_only=False).astype(np.float32).reshape(n, -1)
    else:
        non_numeric = [name for name, a in zip(columns, arrays) if not _is_numeric(a.type)]
        if non_numeric:
            raise bad(f"numeric columns or a single list column (not numeric: {', '.join(non_numeric)})")
        values = arrays
        x = np.empty((n, len(arrays)), dtype=np.float32)
        with np.errstate(over="ignore"):
            for j, a in enumerate(arrays):
                x[:, j] = a.to_numpy(zero_copy_only=False)
    finite = np.isfinite(x)
    if not finite.all():
        row, j = np.unravel_index(int(np.argmin(finite)), x.shape)
        value = values[j][row] if len(values) > 1 else values[0][row * x.shape[1] + j]
        raise ScenarioError("data.path", path, f"finite feature values within float32's range "
                                               f"(column {columns[min(j, len(columns) - 1)]!r} holds {value.as_py()})")
    return x


def _labels(table: pa.Table, label_column: str, path: str) -> np.ndarray:
    """int64 labels in [0, MAX_CLASSES) from ``label_column``."""
    labels = _array(table, label_column)
    if labels.null_count or not pa.types.is_integer(labels.type):
        held = f"has {labels.null_count} missing" if labels.null_count else f"holds values of type {labels.type}"
        raise ScenarioError("data.path", path, f"integer class labels without missing values (column "
                                               f"{label_column!r} {held})")
    y = labels.to_numpy(zero_copy_only=False).astype(np.int64)
    bad = (y < 0) | (y >= MAX_CLASSES)
    if bad.any():
        raise ScenarioError("data.path", path, f"class labels in [0, {MAX_CLASSES - 1}] "
                                               f"(column {label_column!r} holds {labels[int(np.argmax(bad))].as_py()})")
    return y


def load_parquet(path: str, label_column: str, client_column: str, feature_columns: list[str] | None,
                 image_shape: list[int] | None, test_fraction: float, seed: int) -> FederatedDataset:
    """Read a Parquet file (or a directory of them) into a federated dataset.

    Client ids may be any integers or strings; they become ``0..num_clients-1`` in sorted order.
    Features are ``feature_columns`` (default: every column but the label, client and ``split``
    columns): one list column, or numeric scalar columns stacked in order. An optional ``split``
    column ('train'/'test', or 0/1) fixes the split; otherwise each client's rows are shuffled
    with ``seed`` and ``round(test_fraction * n)`` of them (keeping >= 1 train row) go to test.
    ``num_classes`` is the largest label + 1; ``image_shape`` (optional) reshapes the features.
    """
    test_fraction = check_test_fraction(test_fraction)
    dataset, columns = _open(path, label_column, client_column, feature_columns)
    table = _read(dataset, path)
    x = _features(table, columns, None if feature_columns is None else columns, path)
    dim = x.shape[1]
    if image_shape is None:
        feature_shape = (dim,)
    else:
        feature_shape = tuple(int(d) for d in image_shape)
        if not feature_shape or min(feature_shape) < 1 or int(np.prod(feature_shape)) != dim:
            raise ScenarioError("data.image_shape", list(image_shape),
                                f"positive sizes whose product is {dim}, the number of features")

    y = _labels(table, label_column, path)

    ids = _array(table, client_column)
    if ids.null_count:
        raise ScenarioError("data.path", path, f"client ids without missing values (column {client_column!r} has "
                                               f"{ids.null_count} missing)")
    unique_ids = pc.unique(ids)
    unique_ids = unique_ids.take(pc.sort_indices(unique_ids))
    client = pc.index_in(ids, value_set=unique_ids).to_numpy(zero_copy_only=False).astype(np.int64)
    num_clients = len(unique_ids)

    if SPLIT_COLUMN in table.column_names:
        split = _split_flags(_array(table, SPLIT_COLUMN), path)
        order = np.lexsort((split, client))  # stable: keeps file order inside each part
    else:
        rng = stream(seed, Purpose.PARQUET_SPLIT)
        order = np.lexsort((rng.permutation(len(client)), client))
        sizes = np.bincount(client, minlength=num_clients)
        n_test = np.minimum(np.round(test_fraction * sizes), sizes - 1).astype(np.int64)
        starts = np.cumsum(sizes) - sizes
        position = np.arange(len(order)) - starts[client[order]]
        split = np.empty(len(order), dtype=np.int8)
        split[order] = position >= (sizes - n_test)[client[order]]
    sizes_by_part = np.bincount(client * 2 + split, minlength=2 * num_clients).reshape(num_clients, 2)
    no_train = np.flatnonzero(sizes_by_part[:, 0] == 0)
    if len(no_train):
        raise ScenarioError("data.path", path, "a file where every client has at least one train row "
                                               f"(client {unique_ids[int(no_train[0])].as_py()!r} has none)")
    return FederatedDataset.from_sorted(x[order], y[order], sizes_by_part[:, 0], sizes_by_part[:, 1],
                                        int(y.max()) + 1, feature_shape)


def parquet_shape(path: str, label_column: str, client_column: str,
                  feature_columns: list[str] | None) -> tuple[int, int, int, int]:
    """(rows, features per row, classes, clients) of the data set :func:`load_parquet` would load,
    read from the file's metadata, its label and client columns and one row: what the memory
    estimate needs without reading the features. Bad paths, columns and labels raise as there."""
    dataset, columns = _open(path, label_column, client_column, feature_columns)
    table = _read(dataset, path, [label_column, client_column])
    classes = int(_labels(table, label_column, path).max()) + 1
    clients = pc.count_distinct(_array(table, client_column)).as_py()
    types = [dataset.schema.field(c).type for c in columns]
    if len(types) == 1 and _is_list(types[0]):
        first = dataset.fragments[0].head(1, columns=columns).column(0)
        return table.num_rows, max(1, pc.list_value_length(first)[0].as_py()), classes, clients
    return table.num_rows, max(1, len(columns)), classes, clients


def has_split_column(path: str) -> bool:
    """Whether the Parquet data at ``path`` has a ``split`` column (which fixes the split); False
    when it cannot be read (the loader then says why)."""
    try:
        return SPLIT_COLUMN in pq.ParquetDataset(path).schema.names
    except (pa.ArrowException, OSError):
        return False


def _open(path, label_column: str, client_column: str, feature_columns) -> tuple[pq.ParquetDataset, list[str]]:
    """The data set at ``path`` with its label and client columns checked, and its feature columns."""
    if path is None or not os.path.exists(path):
        raise ScenarioError("data.path", path, "an existing Parquet file or directory")
    try:
        dataset = pq.ParquetDataset(path)
        schemas = [set(pq.read_schema(f, filesystem=dataset.filesystem).names) for f in dataset.files]
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None
    for file, columns in zip(dataset.files[1:], schemas[1:]):  # a directory: the data set takes the first file's
        if columns != schemas[0]:
            differ = ", ".join(sorted(columns ^ schemas[0]))
            raise ScenarioError("data.path", path, f"Parquet files with the same columns ({os.path.relpath(file, path)} "
                                                   f"and {os.path.relpath(dataset.files[0], path)} differ in {differ})")
    names = dataset.schema.names
    for key, column in (("data.label_column", label_column), ("data.client_column", client_column)):
        if column not in names:
            raise ScenarioError(key, column, "one of the columns in the file: " + ", ".join(names))
    if label_column == client_column:
        raise ScenarioError("data.label_column", label_column, f"a column other than data.client_column "
                                                               f"({client_column!r}, which names each row's client)")
    if feature_columns is None:
        return dataset, [c for c in names if c not in (label_column, client_column, SPLIT_COLUMN)]
    missing = [c for c in feature_columns if c not in names]
    if missing:
        raise ScenarioError("data.feature_columns", list(feature_columns),
                            f"columns of the file ({', '.join(missing)} missing; the file has {', '.join(names)})")
    for column, what in ((label_column, "the label column"), (SPLIT_COLUMN, "the train/test split")):
        if column in feature_columns:
            raise ScenarioError("data.feature_columns", list(feature_columns),
                                f"columns other than {what} ({column!r})")
    return dataset, list(feature_columns)


def _read(dataset: pq.ParquetDataset, path: str, columns: list[str] | None = None) -> pa.Table:
    """The data set's ``columns`` (all: None); at least one row."""
    try:
        table = dataset.read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None
    if table.num_rows == 0:
        raise ScenarioError("data.path", path, "a Parquet file or directory with at least one row")
    return table


def _unreadable(path: str, exc: Exception) -> ScenarioError:
    return ScenarioError("data.path", path, f"a readable Parquet file or directory ({' '.join(str(exc).split())})")


def _split_flags(arr: pa.Array, path: str) -> np.ndarray:
    """0 for train, 1 for test, from a 'train'/'test' string column or a 0/1 integer column."""
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        flags = pc.index_in(arr, value_set=pa.array(["train", "test"], type=arr.type))
    elif pa.types.is_integer(arr.type):
        flags = pc.index_in(arr, value_set=pa.array([0, 1], type=arr.type))
    else:
        flags = None
    if flags is None or flags.null_count:
        raise ScenarioError("data.path", path, "a file whose 'split' column holds only 'train' or 'test'")
    return flags.to_numpy(zero_copy_only=False).astype(np.int8)
