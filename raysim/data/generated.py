"""Generated data sets built client by client, where and when a client's rows are needed.

A generator's law makes client ``k``'s rows a pure function of (seed, k), so nothing has to exist
for a client that is never sampled: a :class:`GeneratedDataset` is a small Arrow table (each
client's train and test sizes, and the law's name, seed and parameters as schema metadata). It
travels through Ray's object store like a federated table, and every host builds the rows of the
clients it trains, keeping the most recently built ones in a bounded cache. Its rows are the
bytes :meth:`GeneratedDataset.materialize` puts in a :class:`FederatedDataset`, so a run gives the
same results whether its data set is built up front or on demand (``data.on_demand``).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from raysim.data.cache import ClientCache
from raysim.data.federated import ClientRows, FederatedDataset, packed_offsets, split_rows
from raysim.data.generators import GaussianMixtureLaw, LeafSyntheticLaw, SyntheticImagesLaw
from raysim.data.saddle import SaddleLaw
from raysim.streams import STREAMS_AT_ONCE

CACHE_MB = 128  # data.cache_mb's default: built rows a host keeps, per process
BUILT_AT_ONCE = 256  # clients whose rows (train and test) rows_of holds at once while it copies a split
ON_DEMAND_ABOVE = 1 << 30  # data.on_demand: auto builds rows on demand when the whole table would exceed this


# The generators that build one client at a time, by data.kind: a law class has ``name``,
# ``num_classes``, ``feature_shape``, ``from_config(data_cfg, seed)``, ``Law(seed, **params)``,
# ``sizes(num_clients)``, ``client_streams(clients)`` (each client's stream, built at once) and
# ``rows(k, n_train, n_test, rng)`` (client k's rows, drawn from its stream).
LAWS = {law.name: law for law in (GaussianMixtureLaw, LeafSyntheticLaw, SaddleLaw, SyntheticImagesLaw)}


class GeneratedDataset:
    """A generated data set whose rows are built per client on demand (see the module doc).

    The table has one row per client (``train_size``, ``test_size``, int32); its schema metadata
    holds ``kind`` (``generated``), ``generator``, ``seed``, ``params`` (JSON) and ``cache_bytes``.
    """

    on_demand = True

    def __init__(self, table: pa.Table, law=None):
        """``law``: the law the table's metadata names, when the caller has it already built."""
        meta = table.schema.metadata
        self.table = table
        self.law = law or LAWS[meta[b"generator"].decode()](int(meta[b"seed"]), **json.loads(meta[b"params"]))
        self._train = table.column("train_size").to_numpy().astype(np.int64)
        self._test = table.column("test_size").to_numpy().astype(np.int64)
        self._train.setflags(write=False)
        self._test.setflags(write=False)
        self._cache = ClientCache(int(meta[b"cache_bytes"]))  # client id -> (features, labels)

    def __reduce__(self):
        return (GeneratedDataset, (self.table,))

    @classmethod
    def create(cls, law, num_clients: int, cache_mb: float = CACHE_MB) -> GeneratedDataset:
        """The data set of ``num_clients`` clients under ``law`` (only their sizes are computed)."""
        train, test = law.sizes(num_clients)
        meta = {"kind": "generated", "generator": law.name, "seed": str(law.seed), "params": json.dumps(law.params),
                "cache_bytes": str(int(cache_mb * 2 ** 20))}
        schema = pa.schema([("train_size", pa.int32()), ("test_size", pa.int32())],
                           metadata={k.encode(): v.encode() for k, v in meta.items()})
        return cls(pa.Table.from_arrays([pa.array(train, pa.int32()), pa.array(test, pa.int32())], schema=schema),
                   law)

    @property
    def num_clients(self) -> int:
        return len(self._train)

    @property
    def num_classes(self) -> int:
        return self.law.num_classes

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return self.law.feature_shape

    @property
    def num_features(self) -> int:
        return int(np.prod(self.feature_shape))

    def train_sizes(self) -> np.ndarray:
        """int64 ``[num_clients]``: train rows per client."""
        return self._train

    def test_sizes(self) -> np.ndarray:
        """int64 ``[num_clients]``: test rows per client."""
        return self._test

    def clients(self, client_ids, keep: bool = True) -> list:
        """Each client's rows (train then test): float32 features ``[n, D]`` and int64 labels, from
        the cache or built now (the streams of those not cached at once; with ``keep``, cached,
        evicting the least recently used clients)."""
        return self._cache.fetch(client_ids, self._build, keep)

    def _build(self, clients: list):
        """(k, rows of k) for each of ``clients``, their streams built a batch at a time."""
        for start in range(0, len(clients), STREAMS_AT_ONCE):
            batch = clients[start:start + STREAMS_AT_ONCE]
            for k, rng in zip(batch, self.law.client_streams(batch)):
                yield k, self.law.rows(k, int(self._train[k]), int(self._test[k]), rng)

    def rows_of(self, client_ids, split: str = "all", keep: bool = True) -> ClientRows:
        """The ``split`` rows ('all', 'train' or 'test') of the given clients, built as needed (and
        kept in the cache unless ``keep`` is false: a caller that holds its copy, as evaluation does)."""
        ids = np.asarray(client_ids, dtype=np.int64)
        train, test = self._train[ids], self._test[ids]
        local = np.stack([np.zeros_like(train), train, train + test], axis=1)
        lo, hi = split_rows(local, split)
        packed = packed_offsets(local, lo, hi)
        total = int(packed[-1, 2]) if len(ids) else 0
        features, labels = np.empty((total, self.num_features), np.float32), np.empty(total, np.int64)
        for first in range(0, len(ids), BUILT_AT_ONCE):  # only the split asked for is kept of each client
            part = slice(first, first + BUILT_AT_ONCE)
            for (x, y), a, b, (start, _, end) in zip(self.clients(ids[part], keep), lo[part], hi[part], packed[part]):
                features[start:end], labels[start:end] = x[a:b], y[a:b]
        return ClientRows(features, labels, packed)

    def materialize(self) -> FederatedDataset:
        """Every client's rows in one :class:`FederatedDataset` (built in threads: each client has
        its own stream and rows, so the bytes are those of a serial loop)."""
        sizes = self._train + self._test
        ends = np.cumsum(sizes)
        x = np.empty((int(ends[-1]), self.num_features), dtype=np.float32)
        y = np.empty(int(ends[-1]), dtype=np.int64)

        def fill(clients: np.ndarray) -> None:
            for k, built in self._build(clients.tolist()):
                rows = slice(int(ends[k] - sizes[k]), int(ends[k]))
                x[rows], y[rows] = built

        workers = min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(fill, np.array_split(np.arange(self.num_clients), 4 * workers)))
        return FederatedDataset.from_sorted(x, y, self._train, self._test, self.num_classes, self.feature_shape)


def gaussian_mixture(num_clients: int, seed: int) -> FederatedDataset:
    """Every row of the Gaussian-mixture benchmark (:class:`GaussianMixtureLaw`) in one table."""
    return GeneratedDataset.create(GaussianMixtureLaw(seed), num_clients).materialize()


def leaf_synthetic(num_clients: int, alpha: float, beta: float, seed: int,
                   test_fraction: float, iid: bool = False) -> FederatedDataset:
    """Every row of FedProx's Synthetic(alpha, beta) (:class:`LeafSyntheticLaw`) in one table."""
    return GeneratedDataset.create(LeafSyntheticLaw(seed, alpha, beta, test_fraction, iid), num_clients).materialize()


def saddle(num_clients: int, samples_per_client: int, dim: int, test_fraction: float, seed: int) -> FederatedDataset:
    """Every row of the saddle data (:class:`SaddleLaw`) in one table."""
    return GeneratedDataset.create(SaddleLaw(seed, samples_per_client, dim, test_fraction), num_clients).materialize()
