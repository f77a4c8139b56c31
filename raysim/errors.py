"""Errors a user can cause, each with one clear line of text."""

import re

_COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # terminal colour codes, as torch and Ray put in their messages
SHOWN_VALUE = 300  # characters of a bad value an error line shows
SHOWN_LINE = 2000  # characters of one line of an error message the command prints


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message without terminal colours (its type's name if it has none)."""
    return _lines(exc)[0]


def last_line(exc: BaseException) -> str:
    """The last line of ``exc``'s message without terminal colours (its type's name if it has none)."""
    return _lines(exc)[-1]


def shortened(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters with an ellipsis and its length when it is longer:
    a bad value of megabytes still makes an error line one can read."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def raised(exc: BaseException) -> str:
    """What ``exc`` is, in one line: its type and the first line of its message, e.g. ``ValueError: no rows``."""
    return type(exc).__name__ + (f": {first_line(exc)}" if str(exc).strip() else "")


def _lines(exc: BaseException) -> list:
    return _COLOURS.sub("", str(exc)).strip().splitlines() or [type(exc).__name__]


class ScenarioError(ValueError):
    """A scenario key holds a value that is not allowed.

    The message names the key path, the bad value and what is allowed, e.g.
    ``data.kind = 'mnist': expected one of digits, gaussian_mixture``.
    """

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key} = {shortened(repr(value), SHOWN_VALUE)}: expected {allowed}")

    def __reduce__(self):  # pickled as its parts (as Ray sends it), not as the message
        return type(self), (self.key, self.value, self.allowed)


class RunError(RuntimeError):
    """The run could not go on; the metrics written so far stay readable."""


class RunStopped(Exception):
    """Raised by a run's ``on_round`` hook to end the run early at logged round ``round`` (e.g. a
    Tune scheduler stopped the trial): the run ends with a checkpoint and ``status: stopped``."""

    def __init__(self, round: int):
        self.round = round
        super().__init__(f"stopped at round {round}")


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
        self.path, self.reason = path, reason
        super().__init__(f"cannot write {path}: {reason}")

    def __reduce__(self):
        return type(self), (self.path, self.reason)
