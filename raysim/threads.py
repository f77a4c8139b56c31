"""Thread counts fixed for determinism: a float sum split over threads rounds differently with
their number, so code whose bits must not depend on the machine's core count runs on a set number
of them."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from threadpoolctl import ThreadpoolController

_BLAS = ThreadpoolController()  # numpy's BLAS (torch keeps its own threads: torch_threads)


@contextmanager
def torch_threads(n: int):
    """Run a block with exactly ``n`` torch threads (determinism), then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_blas_thread():
    """A context in which numpy's BLAS runs on one thread (the setting is the process's: threads
    that enter it concurrently must be inside an outer one, or the first to leave lifts it for all)."""
    return _BLAS.limit(limits=1, user_api="blas")
