"""How far a run has come: the server version, the virtual clock, the sampling counter, the
applied updates and whether it is done. The execution loops (synchronous rounds, asynchronous
updates) move a run forward only through the methods of its :class:`Progress`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Progress:
    """A run's progress (see the module docstring)."""

    version: int = 0  # server model version: increases with every server step
    clock: float = 0.0  # virtual seconds
    counter: int = 0  # dispatches and sampling draws so far: seeds each task's RNG together with the client id
    applied: int = 0  # client updates applied
    done: bool = False
    bytes_down: int = 0  # bytes the clients received so far (model payloads)
    bytes_up: int = 0  # bytes the clients sent so far (updates)

    def draw(self) -> int:
        """Count one sampling draw (or planned dispatch); returns the new counter."""
        self.counter += 1
        return self.counter

    def wait_until(self, time: float) -> None:
        """Move the clock on to ``time`` (never back)."""
        self.clock = max(self.clock, time)

    def move_to(self, time: float) -> None:
        """Set the clock to the completion at ``time`` (the asynchronous event order never goes back)."""
        self.clock = time

    def pass_time(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` (a synchronous round's duration)."""
        self.clock += seconds

    def step(self) -> None:
        """Count one server step."""
        self.version += 1

    def apply(self, updates: int = 1) -> None:
        """Count ``updates`` client updates applied."""
        self.applied += updates

    def traffic(self, down: int, up: int) -> None:
        """Count ``down`` bytes received and ``up`` bytes sent by clients."""
        self.bytes_down += int(down)
        self.bytes_up += int(up)

    def end(self) -> None:
        """The run is done."""
        self.done = True

    def rewind(self, version: int, clock: float, bytes_down: int, bytes_up: int) -> None:
        """Go back to ``version`` at ``clock`` with the bytes counted then: a window's deferred server
        steps are taken again from where they started, each at its own time."""
        self.version, self.clock, self.bytes_down, self.bytes_up = version, clock, bytes_down, bytes_up
