"""Holding Ctrl-C and SIGTERM back while a block runs, so that it is never left half done.

The run's driver advances the scheduler and writes the rows it returned inside
:func:`deferred_signals`: a SIGINT or SIGTERM that arrives meanwhile is remembered, and once the
block is over the handler that was in place is called with it (raising KeyboardInterrupt, or
whatever the process installed for SIGTERM). The run then stops between two server steps, in a
state a checkpoint can hold. Outside the main thread (where Python cannot set handlers) the block
runs unguarded.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred_signals():
    """Run a block with SIGINT and SIGTERM held back; deliver the first one that came when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        handler = previous[received[0]]
        if callable(handler):
            handler(received[0], None)
        elif handler == signal.SIG_DFL:  # the default action: end the process by that signal
            signal.raise_signal(received[0])
