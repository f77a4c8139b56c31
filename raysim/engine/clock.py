"""The virtual clock's event queue: completions popped in virtual-time order, ties broken by
(client id, dispatch counter) so the order never depends on the host."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Event:
    """A client task that ends (or fails) at virtual time ``time``."""

    time: float
    client_id: int
    counter: int
    data: Any = None


class EventQueue:
    """A min-heap of events keyed by (time, client id, counter)."""

    def __init__(self):
        self._heap: list = []

    def push(self, event: Event) -> None:
        heapq.heappush(self._heap, (event.time, event.client_id, event.counter, event))

    def pop(self) -> Event:
        return heapq.heappop(self._heap)[3]

    def first(self, n: int) -> list:
        """The first ``n`` queued events (fewer if fewer are queued) in the order they will be popped;
        the queue is left as it is."""
        heap = self._heap.copy()
        return [heapq.heappop(heap)[3] for _ in range(min(n, len(heap)))]

    def events(self) -> list:
        """The queued events in the order they will be popped (the queue is left as it is)."""
        return [entry[3] for entry in sorted(self._heap, key=lambda entry: entry[:3])]

    def __len__(self) -> int:
        return len(self._heap)
