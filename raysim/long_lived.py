"""Loading a process's long-lived objects (libraries, data set, model) without the cyclic
garbage collector.

Importing torch creates millions of objects that live as long as the process; the
collections the allocation itself triggers walk them again and again (about 20% of the
import), and so do later collections and the one at interpreter exit (half a second
with torch). :func:`long_lived` turns the collector off while they load, then moves
them to the permanent generation (``gc.freeze``), which no collection visits — after one
collection, so that what loading left as cyclic garbage is freed rather than frozen: importing
torch leaves the importing frames in reference cycles, and with them their locals (in
``prepare``, the driver's whole copy of the data set).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def long_lived():
    """Run a block with the cyclic GC off; then collect once, freeze every object still alive
    and turn the GC back on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        if was_enabled:
            gc.enable()
