"""What a run is doing before its first server step (building the data set and the model, starting
Ray and the client actors): the ``raysim.startup`` log, which the command line prints on stderr so
that the seconds before the progress bar are not silent."""

from __future__ import annotations

import logging
import sys

STARTUP = logging.getLogger("raysim.startup")


def show_startup() -> None:
    """Print the start-up stages on stderr, one line each (the API leaves them to the caller's logging)."""
    if not STARTUP.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        STARTUP.addHandler(handler)
    STARTUP.setLevel(logging.INFO)
    STARTUP.propagate = False
