"""What a run is doing before its first server step (building the data set and the model, starting
Ray and the client actors): the ``raysim.startup`` log. On a terminal the command line shows each
stage as one transient status line, replaced by the next and erased before the progress bar or an
error line, so that the seconds before the bar are not silent and bad input still ends in one line."""

from __future__ import annotations

import logging
import sys

STARTUP = logging.getLogger("raysim.startup")
ERASE = "\r\x1b[K"  # back to the start of the line, and clear it


class _StatusLine(logging.Handler):
    """Each record replaces the status line on the terminal ``stream``."""

    def __init__(self, stream):
        super().__init__()
        self.stream, self.shown = stream, False

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write(ERASE + record.getMessage())
        self.stream.flush()
        self.shown = True

    def erase(self) -> None:
        if self.shown:
            self.stream.write(ERASE)
            self.stream.flush()
            self.shown = False


_line: _StatusLine | None = None


def show_startup() -> None:
    """Show the start-up stages as a status line when stderr is a terminal (a log gets none)."""
    global _line
    if _line is None and sys.stderr.isatty():
        _line = _StatusLine(sys.stderr)
        STARTUP.addHandler(_line)
        STARTUP.setLevel(logging.INFO)
        STARTUP.propagate = False


def erase_startup() -> None:
    """Erase the status line, if one is shown (before the progress bar or an error line)."""
    if _line is not None:
        _line.erase()
