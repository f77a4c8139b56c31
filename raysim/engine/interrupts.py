"""Holding Ctrl-C and SIGTERM back while a block runs, so that it is never left half done — unless
the user insists.

The run's driver advances the scheduler and writes the rows it returned inside
:func:`deferred_signals`: a first SIGINT or SIGTERM that arrives meanwhile is remembered (the run
says it stops after the step), and once the block is over the handler that was in place is called
with it (raising KeyboardInterrupt, or whatever the process installed for SIGTERM). The run then
stops between two server steps, in a state a checkpoint can hold. A second signal during the block
does not wait for a step that may never end (a model whose forward hangs, a huge number of local
steps): the handler is called at once, inside the block, and :func:`cut_short` says so, so that the
run keeps its last checkpoint rather than taking one of a half-done step. Outside the main thread
(where Python cannot set handlers) the block runs unguarded.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_cut: list = []  # a block that a second signal cut short (see cut_short)


def cut_short() -> bool:
    """Whether a second signal stopped a :func:`deferred_signals` block before it ended."""
    return bool(_cut)


@contextmanager
def deferred_signals(announce: bool = False):
    """Run a block with SIGINT and SIGTERM held back; deliver the first one that came when it ends,
    or at once when a second one comes (``announce``: say so on stderr when the first comes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def hold(signum, frame):
        received.append(signum)
        if len(received) == 1:
            if announce:
                print("stopping after the current step (Ctrl-C again to stop now)", file=sys.stderr, flush=True)
            return
        _cut.append(signum)
        restore()
        deliver()  # raises: the block is cut short

    def restore():
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def deliver():
        handler = previous[received[0]]
        if callable(handler):
            handler(received[0], None)
        elif handler == signal.SIG_DFL:  # the default action: end the process by that signal
            signal.raise_signal(received[0])

    previous = {sig: signal.signal(sig, hold) for sig in SIGNALS}
    try:
        yield
    finally:
        restore()
    if received:
        deliver()
