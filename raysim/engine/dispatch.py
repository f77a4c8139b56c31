"""Cutting clients into tasks and spreading tasks over hosts."""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator

import numpy as np

from raysim.engine.host import Task

def make_tasks(op: str, client_ids: np.ndarray, train_sizes: np.ndarray, counter: int, size: int,
               version: int) -> list:
    """Group clients of similar size (less padding in vectorized work) into tasks.

    The grouping depends only on the clients and the task ``size``, never on
    the number of hosts, so every client's computation is the same wherever it runs.
    """
    return list(iter_tasks(op, client_ids, train_sizes, counter, size, version))


def iter_tasks(op: str, client_ids: np.ndarray, train_sizes: np.ndarray, counter: int, size: int,
               version: int) -> Iterator[Task]:
    """The tasks of :func:`make_tasks`, one at a time: only the clients' order is held (8 bytes a client)."""
    client_ids = np.asarray(client_ids, dtype=np.int64)
    order = np.lexsort((client_ids, train_sizes[client_ids]))
    ids = client_ids[order]
    for i in range(0, len(ids), size):
        group = tuple(int(c) for c in ids[i:i + size])
        yield Task(op, group, (counter,) * len(group), (version,) * len(group))


def task_chunks(tasks: Iterable[Task], client_rows: np.ndarray, max_rows: int) -> Iterator[list]:
    """Consecutive ``tasks`` in lists whose clients hold at most ``max_rows`` rows together
    (``client_rows``: rows per client id); a task that holds more alone is a list of its own."""
    chunk, rows = [], 0
    for task in tasks:
        held = int(client_rows[list(task.client_ids)].sum())
        if chunk and rows + held > max_rows:
            yield chunk
            chunk, rows = [], 0
        chunk.append(task)
        rows += held
    if chunk:
        yield chunk


def assign(tasks: list, train_sizes: np.ndarray, num_actors: int) -> list:
    """Task indices per actor: longest first onto the least-loaded actor."""
    cost = [len(t.client_ids) * int(train_sizes[list(t.client_ids)].max()) for t in tasks]
    loads = [(0, a) for a in range(num_actors)]
    assigned = [[] for _ in range(num_actors)]
    for i in sorted(range(len(tasks)), key=lambda i: (-cost[i], i)):
        load, actor = heapq.heappop(loads)
        assigned[actor].append(i)
        heapq.heappush(loads, (load + cost[i], actor))
    return assigned


def run_tasks(runtime, handles: dict, tasks: list, train_sizes: np.ndarray, upcoming: list = ()) -> list:
    """Run tasks (one call per busy host) and wait for them; results in task order. ``upcoming``:
    the tasks expected next, placed as they will be, so that each host can build its next clients'
    on-demand rows while it waits (see :meth:`ClientHost.run`)."""
    assigned = assign(tasks, train_sizes, runtime.num_actors)
    later = assign(upcoming, train_sizes, runtime.num_actors) if upcoming else [[]] * runtime.num_actors
    prepare = [tuple(c for i in idx for c in upcoming[i].client_ids) for idx in later]
    pending = [runtime.submit(a, {v: handles[v] for i in idx for v in tasks[i].versions}, [tasks[i] for i in idx],
                              prepare[a])
               for a, idx in enumerate(assigned) if idx]
    results = [None] * len(tasks)
    for idx, outs in zip([idx for idx in assigned if idx], runtime.gather(pending)):
        for i, out in zip(idx, outs):
            results[i] = out
    return results
