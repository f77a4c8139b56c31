"""The virtual clock's event queue: completions popped in virtual-time order, ties broken by
(client id, dispatch counter) so the order never depends on the host."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any


@dataclass(order=True)
class Event:
    """A client task that ends (or fails) at virtual time ``time``."""

    time: float
    client_id: int
    counter: int
    data: Any = field(compare=False, default=None)


class EventQueue:
    """A min-heap of events."""

    def __init__(self):
        self._heap: list[Event] = []

    def push(self, event: Event) -> None:
        heapq.heappush(self._heap, event)

    def pop(self) -> Event:
        return heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._heap)
