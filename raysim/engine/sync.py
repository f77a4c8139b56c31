"""Synchronous rounds under virtual time: sample available clients, draw their durations, let
the round policy (wait for all, deadline, over-selection) decide which updates count (under
secure aggregation: none, if fewer survive than its threshold), compute only those (all that do
not fail, first, when an upload's size depends on the update), aggregate in client-id order, and
advance the clock by the round's duration."""

from __future__ import annotations

import math
import time

import numpy as np

from raysim.algorithms import ClientUpdates
from raysim.engine.dispatch import make_tasks, run_tasks
from raysim.errors import DivergenceError
from raysim.pipeline.client import ENCODED_BYTES


def round_policy(durations: np.ndarray, failed: np.ndarray, fail_at: np.ndarray, client_ids: np.ndarray,
                 k: int, deadline: float | None):
    """Which sampled tasks count, and when the round ends.

    Returns (kept, late, dropped masks, round duration). Failed tasks are known
    at their failure time. With a ``deadline``, tasks finishing after it are
    late; of the others, the ``k`` earliest count and the rest (over-selection's
    surplus) are dropped. The round ends at the last kept update; at the
    deadline when some update was late; at the last failure when fewer than
    ``k`` updates came and the server had to learn of every failure.
    """
    ok = ~failed
    late = ok & (durations > deadline) if deadline is not None else np.zeros(len(durations), dtype=bool)
    order = np.lexsort((client_ids, durations))
    kept = np.zeros(len(durations), dtype=bool)
    kept[[i for i in order if ok[i] and not late[i]][:k]] = True
    dropped = ok & ~late & ~kept
    if late.any():
        duration = float(deadline)
    elif kept.sum() < k:  # the server waited until every task had finished or failed
        duration = float(max(durations[kept].max(initial=0.0), fail_at[failed].max(initial=0.0)))
    else:
        duration = float(durations[kept].max(initial=0.0))
    return kept, late, dropped, duration


class SyncRounds:
    """Runs ``execution.rounds`` synchronous rounds."""

    def __init__(self, scheduler):
        self.s = scheduler

    def versions_in_use(self):
        return ()

    def snapshot(self) -> dict:
        """The loop's part of the run state: nothing, rounds keep no state between them."""
        return {}

    def restore(self, state: dict) -> None:
        """Continue from :meth:`snapshot` (nothing to restore)."""

    def step(self) -> None:
        s, p, ex = self.s, self.s.progress, self.s.cfg.execution
        began = time.perf_counter()
        clients = s.select(s.round_size(p.counter))
        # Poisson sampling and importance sampling: every client drawn counts
        k = len(clients) if ex.sampling == "poisson" or ex.selection.kind == "importance" else ex.clients_per_round
        counter = p.counter
        timing = s.timing(clients, np.full(len(clients), counter))
        sizes = s.task_bytes(s.payload())  # of the model version the round starts from
        computed = None
        if s.server.pipeline.sizes_by_content:
            computed, sizes, timing = self._sized_round(clients, counter, timing, sizes)
        kept, late, dropped, duration = round_policy(timing.duration_s, timing.failed, timing.fail_at_s,
                                                     clients, k, ex.deadline)
        kept, aborted, duration = self._secure_round(clients, kept, duration)
        handles = s.payload_handle()
        version = p.version
        updates = None
        start = p.clock
        if kept.any() and computed is not None:
            updates = ClientUpdates.concat([computed.row(i) for i in np.searchsorted(computed.client_ids,
                                                                                     clients[kept])])
        elif kept.any():
            tasks = s.with_states(make_tasks("train", clients[kept], s.train_sizes, counter, s.task_size, version))
            updates = ClientUpdates.concat(run_tasks(s.runtime, handles, tasks, s.train_sizes,
                                                     self._upcoming(start + duration)))
        if updates is not None:
            diverged = updates.first_nonfinite() if s.judges_each_update else None
            try:
                if diverged is not None:
                    raise DivergenceError(
                        f"round {version + 1}: client {updates.client_ids[diverged]} diverged "
                        f"(train_loss={updates.train_loss[diverged]}, non-finite update); "
                        f"try a smaller algorithm.lr (now {s.cfg.algorithm.lr})")
                s.keep_states(updates)
                s.server.step(updates, s.aggregation_weights(updates), version)
            except DivergenceError:
                p.end()
                self._log_events(clients, kept, late, dropped, aborted, timing, sizes, updates, start, version,
                                 "diverged")
                raise
            p.apply(len(updates.client_ids))
        self._observe(clients, updates, timing, late)
        p.pass_time(duration)
        p.step()
        self._log_events(clients, kept, late, dropped, aborted, timing, sizes, updates, start, version, "applied")
        final = p.version == ex.rounds
        if final:
            p.end()
        eval_row = s.evaluation.if_due(p.version, final=final)
        n_kept = int(kept.sum())
        s.log_round(updates, n_kept, int(updates.samples.sum()) if updates is not None else 0,
                    time.perf_counter() - began, eval_row, late=int(late.sum()), failed=int(timing.failed.sum()),
                    dropped=int(dropped.sum()), aborted=int(aborted.sum()))

    def _observe(self, clients: np.ndarray, updates, timing, late: np.ndarray) -> None:
        """Tell the selection policy the losses and durations of the round's updates, and the
        durations of its late clients."""
        if updates is None:
            reported, losses = np.empty(0, dtype=np.int64), np.empty(0)
        else:
            reported, losses = np.searchsorted(clients, updates.client_ids), updates.train_loss
        self.s.observe_round(clients[reported], losses, timing.duration_s[reported], clients[late],
                             timing.duration_s[late])

    def _sized_round(self, clients: np.ndarray, counter: int, timing, sizes: tuple):
        """(updates, (bytes down, bytes up per client), timing) of a round whose uploads' sizes
        depend on the updates (QSGD with Elias coding): every task that does not fail is computed
        first and timed with its exact upload; a failed one is timed with the fixed-width size,
        as it was drawn. The updates the round does not keep are never used (nor their states)."""
        s = self.s
        ok = ~timing.failed
        up = np.full(len(clients), sizes[1], dtype=np.int64)
        if not ok.any():
            return None, sizes, timing
        tasks = s.with_states(make_tasks("train", clients[ok], s.train_sizes, counter, s.task_size,
                                       s.progress.version))
        computed = ClientUpdates.concat(run_tasks(s.runtime, s.payload_handle(), tasks, s.train_sizes, []))
        up[ok] = computed.diagnostics.pop(ENCODED_BYTES).numpy()
        return computed, (sizes[0], up), s.timing(clients, np.full(len(clients), counter), bytes_up=up)

    def _secure_round(self, clients: np.ndarray, kept: np.ndarray, duration: float):
        """(kept, aborted masks, round duration) under secure aggregation: with fewer survivors than
        its threshold the round's sum cannot be unmasked and every kept update is aborted; else the
        server's time to remove the masks of survivors and dropped clients ends the round."""
        secure = self.s.server.pipeline.secure
        aborted = np.zeros(len(clients), dtype=bool)
        survivors = int(kept.sum())
        if secure is None or not survivors:
            return kept, aborted, duration
        if survivors < secure.threshold:
            return aborted, kept, duration
        values = self.s.algorithm.upload_size(self.s.payload())
        return kept, aborted, duration + secure.server_seconds(survivors, len(clients) - survivors, values)

    def _upcoming(self, clock: float) -> list:
        """The next round's training tasks as far as they are known before this round's results:
        the clients sampled at the clock this round ends, all of them kept. Only with data built on
        demand (hosts build those clients' rows while they wait), and never past the last round."""
        s, p, ex = self.s, self.s.progress, self.s.cfg.execution
        if not s.builds_rows or p.version + 1 >= ex.rounds:
            return []
        clients = s.sample_at(clock, p.counter, s.round_size(p.counter))
        return make_tasks("train", clients, s.train_sizes, p.counter, s.task_size, p.version + 1)

    def _log_events(self, clients, kept, late, dropped, aborted, timing, sizes, updates, start, version,
                    kept_status) -> None:
        s = self.s
        n = len(clients)
        loss = np.full(n, math.nan)
        actor = np.full(n, -1)
        compute = np.zeros(n)
        numbers = {}
        if updates is not None:
            pos = np.searchsorted(clients, updates.client_ids)
            loss[pos], actor[pos], compute[pos] = updates.train_loss, updates.actor, updates.compute_seconds
            numbers = s.client_columns(updates, pos, n)
        status = np.select([kept, late, dropped, aborted], [kept_status, "late", "dropped", "aborted"], "failed")
        down, up = sizes  # every client received the model; all but the failed sent their update back
        bytes_down, bytes_up = np.full(n, down), np.where(timing.failed, 0, up)
        s.progress.traffic(bytes_down.sum(), bytes_up.sum())
        s.log_events(numbers, round=np.full(n, version + 1), client_id=clients, actor=actor,
                     samples=s.train_sizes[clients], train_loss=loss, compute_seconds=compute,
                     virtual_start=np.full(n, start), virtual_end=start + timing.known_at_s,
                     model_version=np.full(n, version), staleness=np.zeros(n), bytes_down=bytes_down,
                     bytes_up=bytes_up, status=status)

