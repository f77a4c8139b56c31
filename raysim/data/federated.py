"""A federated dataset: one Arrow table holding every client's train and test rows.

Columns, in order: ``client_id`` (int32), ``split`` (int8, 0 = train, 1 = test),
``x`` (fixed_size_list<float32>[D]) and ``y`` (int64). Rows are sorted by client and,
inside a client, train rows come before test rows. The schema metadata (JSON values)
holds ``num_clients``, ``num_classes`` and ``feature_shape``, so the table alone is
enough to rebuild the dataset after it travels through Ray's object store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

TRAIN, TEST = 0, 1
MAX_CLIENTS = 2 ** 31 - 1  # client_id is int32
COLUMNS = ("client_id", "split", "x", "y")
_META_KEYS = ("num_clients", "num_classes", "feature_shape")


@dataclass(frozen=True)
class ClientRows:
    """Some clients' rows, client after client: ``features`` float32 ``[R, D]``, ``labels`` int64
    ``[R]`` and ``offsets`` int64 ``[C, 3]``, the (train start, test start, test end) row of each
    client in the order asked for."""

    features: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray


def split_rows(offsets: np.ndarray, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) row of each client's ``split`` ('all', 'train' or 'test') under ``offsets``."""
    first, last = {"all": (0, 2), "train": (0, 1), "test": (1, 2)}[split]
    return offsets[:, first], offsets[:, last]


def gather_rows(features: np.ndarray, labels: np.ndarray, offsets: np.ndarray, split: str = "all") -> ClientRows:
    """The ``split`` rows of the clients whose ``offsets`` (rows of ``features``/``labels``) are
    given, copied client after client into a :class:`ClientRows`."""
    index, packed = row_index(offsets, split)
    return ClientRows(features[index], labels[index], packed)


def row_index(offsets: np.ndarray, split: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """(the row numbers of the ``split`` rows of the clients under ``offsets``, client after client;
    those rows' offsets once gathered, as :func:`packed_offsets` gives them)."""
    lo, hi = split_rows(offsets, split)
    packed = packed_offsets(offsets, lo, hi)
    return np.repeat(lo - packed[:, 0], hi - lo) + np.arange(int(packed[-1, 2]) if len(packed) else 0), packed


def packed_offsets(offsets: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The offsets ``[C, 3]`` of rows ``lo[c]:hi[c]`` of each client (under ``offsets``) once they
    are copied client after client into one array."""
    ends = np.cumsum(hi - lo)
    starts = ends - (hi - lo)
    return np.stack([starts, starts + np.clip(offsets[:, 1] - lo, 0, hi - lo), ends], axis=1).astype(np.int64)


def client_order(train: list, test: list) -> np.ndarray:
    """Row indices in a table's order (see :meth:`FederatedDataset.from_sorted`): client by client,
    the rows ``train[c]``, then ``test[c]``."""
    return np.concatenate([part for pair in zip(train, test) for part in pair])


def _single_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one Array, copying only when it has several chunks."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


@dataclass(frozen=True)
class FederatedDataset:
    """Every client's train and test rows in one Arrow table (see the module doc).

    Derived numpy arrays are computed once and cached; those returned by
    ``features()`` and ``labels()`` are read-only zero-copy views of the Arrow buffers.
    """

    on_demand = False  # rows built per client where they are needed (GeneratedDataset)
    table: pa.Table
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if tuple(self.table.column_names) != COLUMNS:
            raise ValueError(f"a federated table needs columns {COLUMNS}, got {self.table.column_names}")
        meta = self.table.schema.metadata or {}
        missing = [k for k in _META_KEYS if k.encode() not in meta]
        if missing:
            raise ValueError(f"a federated table needs schema metadata {missing}")
        self._cache["meta"] = {k: json.loads(meta[k.encode()]) for k in _META_KEYS}

    def __reduce__(self):
        # Ship only the table: the cached numpy views are rebuilt on the receiving side.
        return (FederatedDataset, (self.table,))

    @classmethod
    def from_sorted(cls, x: np.ndarray, y: np.ndarray, train_sizes, test_sizes,
                    num_classes: int, feature_shape: tuple[int, ...]) -> FederatedDataset:
        """Build from rows already in table order (client by client, train before test).

        ``train_sizes[c]`` / ``test_sizes[c]`` give the row counts of client ``c``; every
        client needs at least one train row. ``x`` is reshaped to ``[N, prod(feature_shape)]``.
        """
        train_sizes = np.asarray(train_sizes, dtype=np.int64)
        test_sizes = np.asarray(test_sizes, dtype=np.int64)
        num_clients = len(train_sizes)
        if num_clients == 0 or len(test_sizes) != num_clients:
            raise ValueError("need at least one client and one test size per client")
        if (train_sizes < 1).any() or (test_sizes < 0).any():
            raise ValueError("every client needs at least one train row")
        feature_shape = tuple(int(d) for d in feature_shape)
        dim = int(np.prod(feature_shape))
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, dim)
        y = np.ascontiguousarray(y, dtype=np.int64).reshape(-1)
        n = int(train_sizes.sum() + test_sizes.sum())
        if len(x) != n or len(y) != n:
            raise ValueError(f"sizes add up to {n} rows but x has {len(x)} and y has {len(y)}")
        if n and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"labels must lie in [0, {num_classes})")
        client_id = np.repeat(np.arange(num_clients, dtype=np.int32), train_sizes + test_sizes)
        split = np.repeat(np.tile(np.array([TRAIN, TEST], dtype=np.int8), num_clients),
                          np.stack([train_sizes, test_sizes], axis=1).reshape(-1))
        meta = {"num_clients": num_clients, "num_classes": int(num_classes),
                "feature_shape": list(feature_shape)}
        schema = pa.schema(
            [("client_id", pa.int32()), ("split", pa.int8()),
             ("x", pa.list_(pa.float32(), dim)), ("y", pa.int64())],
            metadata={k.encode(): json.dumps(v).encode() for k, v in meta.items()},
        )
        columns = [pa.array(client_id), pa.array(split),
                   pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), dim), pa.array(y)]
        return cls(pa.Table.from_arrays(columns, schema=schema))

    @classmethod
    def from_clients(cls, train_x: list[np.ndarray], train_y: list[np.ndarray],
                     test_x: list[np.ndarray], test_y: list[np.ndarray],
                     num_classes: int, feature_shape: tuple[int, ...]) -> FederatedDataset:
        """Build from one train/test array pair per client (client ``c`` is list index ``c``)."""
        if not 0 < len(train_x) == len(train_y) == len(test_x) == len(test_y):
            raise ValueError("train_x, train_y, test_x and test_y need one entry per client")
        dim = int(np.prod(feature_shape))
        xs = [np.reshape(a, (-1, dim)) for pair in zip(train_x, test_x) for a in pair]
        ys = [np.reshape(a, -1) for pair in zip(train_y, test_y) for a in pair]
        if [len(a) for a in xs] != [len(a) for a in ys]:
            raise ValueError("each client's x and y need the same number of rows")
        x = np.concatenate(xs, dtype=np.float32, casting="unsafe")
        y = np.concatenate(ys, dtype=np.int64, casting="unsafe")
        return cls.from_sorted(x, y, [len(a) for a in ys[0::2]], [len(a) for a in ys[1::2]],
                               num_classes, feature_shape)

    def _cached(self, name, compute):
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    def _column(self, name: str) -> np.ndarray:
        return _single_array(self.table.column(name)).to_numpy(zero_copy_only=True)

    @property
    def num_clients(self) -> int:
        return self._cache["meta"]["num_clients"]

    @property
    def num_classes(self) -> int:
        return self._cache["meta"]["num_classes"]

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self._cache["meta"]["feature_shape"])

    @property
    def num_features(self) -> int:
        """D, the length of one flattened feature vector."""
        return int(np.prod(self.feature_shape))

    def offsets(self) -> np.ndarray:
        """int64 ``[num_clients, 3]``: (train_start, test_start, test_end) row of each client."""
        return self._cached("offsets", self._compute_offsets)

    def _compute_offsets(self) -> np.ndarray:
        key = self._column("client_id").astype(np.int64) * 2 + self._column("split")
        n, c = len(key), self.num_clients
        if n and (np.any(key[1:] < key[:-1]) or key[0] < 0 or key[-1] >= 2 * c):
            raise ValueError("table rows are not sorted by client_id then split, "
                             f"or a client_id lies outside 0..{c - 1}")
        bounds = np.searchsorted(key, np.arange(2 * c + 1))
        offsets = np.stack([bounds[0:-1:2], bounds[1::2], bounds[2::2]], axis=1).astype(np.int64)
        if np.any(offsets[:, 1] <= offsets[:, 0]):
            raise ValueError("every client needs at least one train row")
        return offsets

    def features(self) -> np.ndarray:
        """float32 ``[N, D]``, a read-only zero-copy view of the ``x`` column."""
        return self._cached("features", self._compute_features)

    def _compute_features(self) -> np.ndarray:
        arr = _single_array(self.table.column("x"))
        dim = self.num_features
        flat = arr.values.to_numpy(zero_copy_only=True)  # ignores arr.offset: slice by hand
        return flat[arr.offset * dim:(arr.offset + len(arr)) * dim].reshape(-1, dim)

    def labels(self) -> np.ndarray:
        """int64 ``[N]``, a read-only zero-copy view of the ``y`` column."""
        return self._cached("labels", lambda: self._column("y"))

    def materialize(self) -> FederatedDataset:
        """Every client's rows in one table: this data set (as :meth:`GeneratedDataset.materialize`)."""
        return self

    def rows_of(self, client_ids, split: str = "all", keep: bool = True) -> ClientRows:
        """The ``split`` rows ('all', 'train' or 'test') of the given clients, copied (``keep``: as
        :meth:`GeneratedDataset.rows_of`'s; a table has no cache to keep them in)."""
        return gather_rows(self.features(), self.labels(), self.offsets()[np.asarray(client_ids, dtype=np.int64)],
                           split)

    def train_sizes(self) -> np.ndarray:
        """int64 ``[num_clients]``: train rows per client."""
        offsets = self.offsets()
        return offsets[:, 1] - offsets[:, 0]

    def test_sizes(self) -> np.ndarray:
        """int64 ``[num_clients]``: test rows per client."""
        offsets = self.offsets()
        return offsets[:, 2] - offsets[:, 1]
