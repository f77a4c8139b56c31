"""Errors a user can cause, each with one clear line of text."""


class ScenarioError(ValueError):
    """A scenario key holds a value that is not allowed.

    The message names the key path, the bad value and what is allowed, e.g.
    ``data.kind = 'mnist': expected one of digits, gaussian_mixture``.
    """

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key} = {value!r}: expected {allowed}")


class RunError(RuntimeError):
    """The run could not go on; the metrics written so far stay readable."""


class DivergenceError(RunError):
    """Training produced a non-finite loss or update."""


class NoClientAvailable(RunError):
    """No client is, or will ever be, available to sample."""


class SchedulerLost(RunError):
    """The SchedulerActor died (its process was killed or its node lost); the run restarts it from
    the last checkpoint."""


class OutputError(RunError):
    """A file of the output directory could not be written (disk full, no permission, read-only):
    ``cannot write <path>: <reason>``; what was written before stays readable."""

    def __init__(self, path: str, reason: str):
        self.path = path
        super().__init__(f"cannot write {path}: {reason}")
