"""Cutting a round's clients into tasks and spreading the tasks over hosts."""

from __future__ import annotations

import heapq

import numpy as np

from raysim.engine.host import Task

MAX_AUTO_CLIENTS_PER_TASK = 25


def clients_per_task(cfg) -> int:
    """Task size: ``runtime.clients_per_task``, or for 'auto' a quarter of a round (at most 25),
    so that a round spreads over several actors while each task stays large enough to vectorize."""
    value = cfg.runtime.clients_per_task
    if value != "auto":
        return value
    return max(1, min(MAX_AUTO_CLIENTS_PER_TASK, -(-cfg.execution.clients_per_round // 4)))


def make_tasks(op: str, client_ids: np.ndarray, train_sizes: np.ndarray, counter: int, size: int) -> list:
    """Group clients of similar size (less padding in vectorized work) into tasks.

    The grouping depends only on the clients and the task ``size``, never on
    the number of hosts, so every client's computation is the same wherever it runs.
    """
    order = np.lexsort((client_ids, train_sizes[client_ids]))
    ids = client_ids[order]
    return [Task(op, tuple(int(c) for c in ids[i:i + size]), counter) for i in range(0, len(ids), size)]


def run_tasks(runtime, handle, tasks: list, train_sizes: np.ndarray) -> list:
    """Run tasks on the runtime's hosts (longest first onto the least-loaded host); results in task order."""
    cost = [len(t.client_ids) * int(train_sizes[list(t.client_ids)].max()) for t in tasks]
    loads = [(0, a) for a in range(runtime.num_actors)]
    assigned = [[] for _ in range(runtime.num_actors)]
    for i in sorted(range(len(tasks)), key=lambda i: (-cost[i], i)):
        load, actor = heapq.heappop(loads)
        assigned[actor].append(i)
        heapq.heappush(loads, (load + cost[i], actor))
    busy = [a for a in range(runtime.num_actors) if assigned[a]]
    pending = [runtime.submit(a, handle, [tasks[i] for i in assigned[a]]) for a in busy]
    results = [None] * len(tasks)
    for a, outs in zip(busy, runtime.gather(pending)):
        for i, out in zip(assigned[a], outs):
            results[i] = out
    return results
