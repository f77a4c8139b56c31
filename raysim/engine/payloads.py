"""The payloads clients receive, one per model version, and their broadcast handles."""

from __future__ import annotations

MAX_HANDLES = 64  # broadcast model versions kept before the unused ones are forgotten (or twice those in use)


class PayloadCache:
    """The payload of the latest model version (built once per version by ``build()``, the server's
    current payload) and the runtime's broadcast handle of each version still referenced.
    ``in_use()``: the versions that tasks not yet sent still refer to (their handles are kept when
    others are forgotten)."""

    def __init__(self, build, runtime, in_use):
        self.build, self.runtime, self.in_use = build, runtime, in_use
        self.clear()

    def clear(self) -> None:
        """Forget every payload and handle (a restored run broadcasts again)."""
        self._handles: dict = {}
        self._limit = MAX_HANDLES  # handles kept before the unused ones are forgotten
        self._latest: tuple = (-1, None)  # (version, payload) of the latest payload built

    def payload(self, version: int) -> dict:
        """What clients receive of model ``version``, the server's current one (built once per version)."""
        if self._latest[0] != version:
            self._latest = (version, self.build())
        return self._latest[1]

    def handle(self, version: int, payload: dict) -> dict:
        """{version: handle} of model ``version``, whose payload is ``payload``, broadcast once."""
        if version not in self._handles:
            if len(self._handles) >= self._limit:  # forget versions no unsent task refers to
                in_use = self.in_use()
                self._handles = {v: h for v, h in self._handles.items() if v in in_use}
                self._limit = max(MAX_HANDLES, 2 * len(self._handles))  # at most twice those in use
            self._handles[version] = self.runtime.broadcast(payload)
        return {version: self._handles[version]}

    def publish(self, payloads: dict) -> None:
        """Broadcast the payloads of earlier model versions ({version: payload}) that restored tasks start from."""
        self._handles.update({v: self.runtime.broadcast(p) for v, p in payloads.items()})

    def versions(self) -> set:
        """The model versions whose handles are kept."""
        return set(self._handles)

    def handles(self, versions) -> dict:
        """Handles of the given (still referenced) model versions."""
        return {v: self._handles[v] for v in versions}
