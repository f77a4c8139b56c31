"""The bounded cache of clients' data built on demand: each process keeps the clients it used last."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable


class ClientCache:
    """Built data (a tuple of arrays or tensors) per client id, least recently used evicted first
    once their bytes would exceed ``max_bytes``; a client larger than the budget is never kept."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict = OrderedDict()  # client id -> data, least recent first
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        """The cached client ids, least recently used first."""
        return iter(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the cached data."""
        return self._bytes

    def fetch(self, client_ids, build: Callable[[list], Iterable], keep: bool = True) -> list:
        """The data of each of ``client_ids``, from the cache or from ``build(missing ids)`` (which
        yields ``(id, data)`` for each, in order); with ``keep`` the built ones are cached."""
        ids = [int(k) for k in client_ids]
        found = {}
        for k in ids:  # taken before anything new is cached: caching may evict them
            if k in self._entries:
                self._entries.move_to_end(k)
                found[k] = self._entries[k]
        for k, data in build([k for k in dict.fromkeys(ids) if k not in found]):
            found[k] = data
            if keep:
                self._keep(k, data)
        return [found[k] for k in ids]

    def _keep(self, k: int, data: tuple) -> None:
        size = sum(part.nbytes for part in data)
        if size <= self.max_bytes:
            while self._bytes + size > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= sum(part.nbytes for part in evicted)
            self._entries[k], self._bytes = data, self._bytes + size
