"""Asynchronous execution under virtual time (FedAsync, FedBuff, and later asynchronous FFGG).

``execution.concurrency`` tasks are in flight. The earliest completion is popped
from the event queue; its update, computed from the model version it was
dispatched with, is applied with staleness = current version − that version
(FedAsync: alone; FedBuff: once ``buffer_size`` updates are buffered); a new
client available at that virtual time is dispatched. Real computation runs
ahead in parallel on the actors: dispatched tasks are sent in small groups
(actors queue them) and only the order of application is serial.

While every slot is taken, each completion frees one slot and a new client fills it. The
clients and task draws of the next completions' dispatches are drawn ahead in one pass
(:class:`Planned`), each from the state the one-at-a-time loop would have then, and used
only while the completions come in the order they were planned for, so results are the
same as drawing them one by one.

The planned dispatches' virtual durations are known too (unless the algorithm's
``timing_reads_payload``), so the loop can tell how many of the next completions come before any task
it is about to dispatch: those are handled as one window (:meth:`AsyncUpdates._window`): their
updates and server steps first (FedAsync's plain steps together, their mean aggregates at once),
then their dispatches. Every step of the one-at-a-time loop happens on the same values and every
row comes in the same order, so the results are the same bytes; the gain is that each kind of
work runs many times in a row.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np
import torch

from raysim.algorithms import ClientUpdates
from raysim.engine.clock import Event, EventQueue
from raysim.engine.events import TASK_COLUMNS
from raysim.engine.host import Task
from raysim.engine.run_state import pack_updates, unpack_updates
from raysim.errors import DivergenceError


def staleness_weight(cfg, staleness: int) -> float:
    """s(τ): ``constant`` 1; ``polynomial`` (1+τ)^−a; ``hinge`` 1 if τ ≤ b else 1/(a(τ−b)+1)."""
    if cfg.kind == "polynomial":
        return (1.0 + staleness) ** -cfg.a
    if cfg.kind == "hinge":
        return 1.0 if staleness <= cfg.b else 1.0 / (cfg.a * (staleness - cfg.b) + 1.0)
    return 1.0


LOOKAHEAD = 64  # at most this many dispatches drawn ahead at once


@dataclass(slots=True)
class Planned:
    """A dispatch drawn ahead: the completion it follows (time, client, counter), the sampling
    counter it takes, the client sampled, its task's draws (:meth:`SystemModel.task_draws`) and,
    unless the algorithm's ``timing_reads_payload``, the task's timing: when it will be
    known to have ended (seconds after dispatch) and whether it fails."""

    after: tuple
    counter: int
    client: int
    draws: np.ndarray
    known_at: float | None = None
    failed: bool = False


@dataclass(slots=True)
class InFlight:
    """A dispatched task: the model version it started from and where its result will come from."""

    version: int
    payload: dict  # the payload of ``version``
    start: float
    failed: bool
    call: int = -1  # index of the runtime call carrying it (-1: not sent yet)
    index: int = 0  # position in that call's results

    @property
    def unsent(self) -> bool:
        """Dispatched, will not fail, and not yet sent to a host."""
        return self.call < 0 and not self.failed


@dataclass(slots=True)
class Call:
    """A runtime call: its task as sent (client states included), the payloads of the task's
    model versions, its pending result and how many of its results are still to be used."""

    task: Task
    payloads: dict
    pending: object
    remaining: int
    updates: ClientUpdates | None = None  # its results, once in (one row per client of the task)
    nonfinite: np.ndarray | None = None  # per result: a non-finite loss or update


class AsyncUpdates:
    """FedAsync / FedBuff server loop; one :meth:`step` handles one completion event, or a window of them."""

    def __init__(self, scheduler):
        self.s = scheduler
        self.ex = scheduler.cfg.execution
        self.queue = EventQueue()
        self.unsent: list[Event] = []
        self.calls: dict[int, Call] = {}
        self.next_call = 0
        self.busy = np.zeros(scheduler.dataset.num_clients, dtype=bool)  # clients with a task in flight
        self.buffer: list = []  # FedBuff: (ClientUpdates of one client, staleness weight)
        self.next_actor = 0
        self.step_began = time.perf_counter()
        self.started = False
        self.ahead: deque = deque()  # Planned dispatches, in the order of the completions they follow
        self.lookahead, self.used = 8, 0  # the next plan's length; entries of the current one used
        self.rows: list = []  # event rows not yet handed to the scheduler (TASK_COLUMNS, in order)
        self.numbers: list = []  # per row: {name: number} of the scheduler's client_diagnostics (if it has any)
        # FedAsync whose server step is the algorithm's update alone: a window's steps are taken together
        # (not with personalized evaluation: its tasks run on the actors, and a lost one would end the run
        # with updates logged as applied whose steps were not taken)
        ev = scheduler.cfg.eval
        self.steps_together = (self.ex.aggregation == "fedasync" and scheduler.server.pipeline.takes_steps_together
                               and not scheduler.algorithm.stateful and not scheduler.server.pipeline.keeps_client_state
                               and not (ev.personalized_steps or ev.personalized_epochs))
        self.deferred: list | None = None  # a window's steps, while they wait: (updates, weights, (clock, bytes))
        self.deferred_from = 0  # the model version they start from

    def versions_in_use(self):
        return {e.data.version for e in self.unsent}

    def snapshot(self) -> dict:
        """The loop's part of the run state, plain content: whether it has started; the tasks in
        flight (``in_flight``: the unsent ones first, in dispatch order, then the others in
        completion order; each with its completion time, client, counter, model version, virtual
        start, failed flag, and call and position in it); the tasks of the calls whose results
        are still needed (``calls``, by call number; re-sent on restore); ``next_call``; the
        FedBuff buffer (packed ClientUpdates and staleness weights); the ``busy`` clients; and
        the ``payloads`` of every model version those tasks start from."""
        events = self.unsent + [e for e in self.queue.events() if not e.data.unsent]
        payloads = {e.data.version: e.data.payload for e in events}
        for call in self.calls.values():
            payloads.update(call.payloads)
        return {
            "started": self.started,
            "in_flight": [{"time": float(e.time), "client_id": e.client_id, "counter": e.counter,
                           "version": e.data.version, "start": float(e.data.start), "failed": e.data.failed,
                           "call": e.data.call, "index": e.data.index} for e in events],
            "calls": {number: dict(vars(call.task)) for number, call in self.calls.items()},
            "next_call": self.next_call,
            "buffer": [(pack_updates(update), weight) for update, weight in self.buffer],
            "busy": torch.from_numpy(self.busy.copy()),
            "payloads": payloads,
        }

    def restore(self, state: dict) -> None:
        """Continue from :meth:`snapshot`: rebuild the event queue, broadcast the payloads again
        and re-send the calls whose results are still needed (they compute the same results)."""
        s, payloads = self.s, state["payloads"]
        s.payloads.publish(payloads)
        self.started, self.next_call = state["started"], state["next_call"]
        self.buffer = [(unpack_updates(packed), weight) for packed, weight in state["buffer"]]
        self.busy = state["busy"].numpy().copy()
        self.queue, self.unsent, self.calls = EventQueue(), [], {}
        self.ahead, self.used = deque(), 0
        remaining = Counter()
        for r in state["in_flight"]:
            info = InFlight(r["version"], payloads[r["version"]], r["start"], r["failed"], r["call"], r["index"])
            event = Event(r["time"], r["client_id"], r["counter"], info)
            self.queue.push(event)
            remaining[info.call] += 1
            if info.unsent:
                self.unsent.append(event)
        for number, sent in state["calls"].items():
            task = Task(**sent)
            self._submit(number, task, {v: payloads[v] for v in task.versions}, remaining[number])

    def step(self) -> None:
        """Handle the next completion, or the next window of them (:meth:`_window`)."""
        if not self.started:
            self.started = True
            self._dispatch()
        try:
            window = self._window()
            if window:
                self._handle_window(window)
            else:
                self._handle_next()
        finally:
            self._flush_rows()

    def _handle_next(self) -> None:
        """The one-at-a-time loop: the earliest completion, then a stop or its slot's dispatch."""
        s = self.s
        event = self.queue.pop()
        self._complete(event)
        if not s.progress.done and self._should_stop():
            self._stop()
        if not s.progress.done:
            self._dispatch(event)

    def _complete(self, event: Event) -> None:
        """Free the event's client, move the clock to it and log, drop or apply its update."""
        s = self.s
        self.busy[event.client_id] = False
        s.progress.move_to(event.time)
        info: InFlight = event.data
        if info.failed:
            self._log(event, None, "failed", 0)
            return
        update, nonfinite = self._result(event)
        staleness = s.progress.version - info.version
        if self.ex.max_staleness is not None and staleness > self.ex.max_staleness:
            self._log(event, update, "stale", staleness)
        else:
            self._apply(event, update, staleness, nonfinite)

    def _window(self) -> list:
        """The next completions, with their planned dispatches, that can be handled together:
        every slot is taken (each completion's slot goes to its planned dispatch), each comes
        before every task the window dispatches, none of them is unsent (a send of a partial
        group would change how tasks are grouped), and none can end the run or pass the
        scheduler's ``stop_version`` (no step in it reaches ``max_updates``,
        ``max_virtual_time``, or an evaluation that ``target_accuracy`` may stop at). Fewer
        than two: [] (the one-at-a-time loop handles the next one)."""
        s, ex = self.s, self.ex
        if len(self.queue) < ex.concurrency or s.algorithm.timing_reads_payload:
            return []
        limit = LOOKAHEAD
        if ex.max_updates is not None:
            limit = min(limit, ex.max_updates - s.progress.applied - 1)
        if s.stop_version is not None:
            limit = min(limit, s.stop_version - s.progress.version)  # a completion takes at most one server step
        every = s.cfg.eval.every
        if ex.target_accuracy is not None and every > 0:
            limit = min(limit, every - s.progress.version % every - 1)
        if limit < 2:
            return []
        events = self.queue.first(limit)
        if not self._plan_follows(events[0]):
            self.ahead, self.used = self._plan(events, len(self.queue) - 1), 0
        window, earliest_new = [], None
        for event, planned in zip(events, self.ahead):
            if (planned.after != _key(event) or event.data.unsent
                    or (earliest_new is not None and not _key(event) < earliest_new)
                    or (ex.max_virtual_time is not None and event.time >= ex.max_virtual_time)):
                break
            window.append((event, planned))
            new = (event.time + planned.known_at, planned.client, planned.counter + 1)
            earliest_new = new if earliest_new is None or new < earliest_new else earliest_new
        return window if len(window) >= 2 else []

    def _handle_window(self, window: list) -> None:
        """Handle the window's completions in order, then make their planned dispatches, each from
        the model version and clock its completion left. With ``steps_together``, the completions'
        server steps wait until the window's updates are in and are then taken in a row
        (:meth:`_take_deferred`); the staleness and event rows count them as taken already."""
        s = self.s
        payloads, starts = {s.progress.version: s.payload()}, []
        if self.steps_together:
            self.deferred, self.deferred_from = [], s.progress.version
        try:
            for event, _ in window:
                self.queue.pop()  # the window holds the first completions, in order
                self._complete(event)
                starts.append((event.time, s.progress.version))
                if not self.steps_together:
                    payloads[s.progress.version] = s.payload()
        finally:  # also when a call failed: the steps before it are taken and logged first
            if self.deferred is not None:
                payloads.update(self._take_deferred())
        for (_, planned), (start, version) in zip(window, starts):
            self.ahead.popleft()
            self.used += 1
            s.progress.draw()
            self.busy[planned.client] = True
            s.payloads.handle(version, payloads[version])
            self._push(Event(start + planned.known_at, planned.client, s.progress.counter,
                             InFlight(version, payloads[version], start, planned.failed)))
            if len(self.unsent) >= s.task_size:
                self._send()

    def _take_deferred(self) -> dict:
        """Take the window's deferred server steps from model version ``deferred_from`` (their
        aggregates at once, :meth:`ServerPipeline.steps`), each with its evaluation and
        rounds row as :meth:`_server_step` would; returns the payloads of the new versions. As
        there, a row's wall time runs from the previous row, so the window's first row holds the
        window's work before its steps."""
        s, steps, self.deferred = self.s, self.deferred, None
        if not steps:
            return {}
        p = s.progress
        now = (p.clock, p.bytes_down, p.bytes_up)
        states = s.server.steps([(updates, weights) for updates, weights, _ in steps], self.deferred_from)
        payloads = {}
        for i, ((updates, _, at), state) in enumerate(zip(steps, states)):
            s.server.adopt(state)
            p.rewind(self.deferred_from + i, *at)
            p.step()
            self._log_step(updates, s.evaluation.if_due(p.version))
            payloads[p.version] = s.payload()
        p.rewind(p.version, *now)
        return payloads

    # ------------------------------------------------------------------ server side

    def _apply(self, event: Event, update: ClientUpdates, staleness: int, nonfinite: bool) -> None:
        s = self.s
        if s.judges_each_update and nonfinite:
            if self.deferred is not None:  # the window's steps before this update come first, as taken then
                self._take_deferred()
            s.progress.end()
            self._log(event, update, "diverged", staleness)
            raise DivergenceError(
                f"update {s.progress.applied + 1} (virtual time {s.progress.clock:g}): client {event.client_id} "
                f"diverged "
                f"(train_loss={update.train_loss[0]}, non-finite update); "
                f"try a smaller algorithm.lr (now {s.cfg.algorithm.lr})")
        s.keep_states(update)
        self.buffer.append((update, staleness_weight(self.ex.staleness, staleness)))
        s.progress.apply()
        self._log(event, update, "applied", staleness)
        size = 1 if self.ex.aggregation == "fedasync" else self.ex.buffer_size
        if len(self.buffer) >= size:
            self._server_step()

    def _server_step(self) -> None:
        s = self.s
        updates = ClientUpdates.concat([u for u, _ in self.buffer])
        weights = np.array([w for _, w in self.buffer]) / len(self.buffer)
        if len(self.buffer) > 1:  # in the client-id order concat put the updates in
            weights = weights[np.argsort(np.concatenate([u.client_ids for u, _ in self.buffer]), kind="stable")]
        if self.deferred is not None:  # a window's step: taken with the window's others (_take_deferred)
            p = s.progress
            self.deferred.append((updates, weights, (p.clock, p.bytes_down, p.bytes_up)))  # where the step was
            s.progress.step()
            self.buffer = []
            return
        try:
            s.server.step(updates, weights, s.progress.version)
        except DivergenceError:
            s.progress.end()
            raise
        s.progress.step()
        self.buffer = []
        done = self._should_stop()
        eval_row = s.evaluation.if_due(s.progress.version, final=done)
        if done or self._should_stop():  # the evaluation may have reached target_accuracy
            s.progress.end()
        self._log_step(updates, eval_row)

    def _log_step(self, updates: ClientUpdates, eval_row: dict) -> None:
        """The rounds row of the server step just taken; its wall time runs from the previous row."""
        self.s.log_round(updates, len(updates.client_ids), int(updates.samples.sum()),
                         time.perf_counter() - self.step_began, eval_row)
        self.step_began = time.perf_counter()  # after the row's diagnostics, which count in its eval_seconds

    def _should_stop(self) -> bool:
        s, ex = self.s, self.ex
        return ((ex.max_updates is not None and s.progress.applied >= ex.max_updates)
                or (ex.max_virtual_time is not None and s.progress.clock >= ex.max_virtual_time)
                or (ex.target_accuracy is not None and s.evaluation.last["test_accuracy"] >= ex.target_accuracy))

    def _stop(self) -> None:
        """Stop between server steps: apply a partly filled buffer, or evaluate in a last row."""
        s = self.s
        if self.buffer:
            self._server_step()
        else:
            eval_row = s.evaluation.if_due(s.progress.version, final=True)
            s.log_round(None, 0, 0, math.nan, eval_row)
        s.progress.end()

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, after: Event | None = None) -> None:
        """Fill the free concurrency slots with clients available now (``after``: the completion
        just handled, whose slot a planned dispatch may fill)."""
        s = self.s
        free = self.ex.concurrency - len(self.queue)
        if free <= 0:
            return
        planned = self._planned(after) if free == 1 and after is not None else None
        if planned is None:
            clients = s.sample(free, exclude=self.busy, excluded_count=len(self.queue))  # one event per busy client
            draws = None
        else:
            clients, draws = np.array([planned.client]), planned.draws[None]
            s.progress.draw()
        self.busy[clients] = True
        counter = s.progress.counter
        if planned is not None and planned.known_at is not None:
            known_at, failed = [planned.known_at], [planned.failed]
        else:
            timing = s.timing(clients, np.full(len(clients), counter), draws)
            known_at, failed = timing.known_at_s.tolist(), timing.failed.tolist()
        s.payload_handle()
        payload, p = s.payload(), s.progress
        for c, known, fails in zip(clients.tolist(), known_at, failed):
            self._push(Event(p.clock + known, c, counter, InFlight(p.version, payload, p.clock, fails)))
        if len(self.unsent) >= self.s.task_size:
            self._send()

    def _push(self, event: Event) -> None:
        """Put a dispatched task in flight."""
        self.queue.push(event)
        if not event.data.failed:
            self.unsent.append(event)

    def _plan_follows(self, after: Event) -> bool:
        """Whether the plan's next dispatch was made to follow ``after`` at the current sampling
        counter (the counter guards against any draw of a counter in between)."""
        ahead = self.ahead[0] if self.ahead else None
        return ahead is not None and ahead.after == _key(after) and ahead.counter == self.s.progress.counter

    def _planned(self, after: Event) -> Planned | None:
        """The dispatch planned to follow ``after`` with the current sampling counter, planning
        anew when the plan is used up or was made for another order of completions (None if no
        client is available at once: :meth:`Scheduler.sample` then waits for one)."""
        if self._plan_follows(after):
            self.used += 1
            return self.ahead.popleft()
        if self.ahead:  # made for another order of completions: plan no further than it held
            self.lookahead = max(1, self.used)
        elif self.used:  # used up
            self.lookahead = min(LOOKAHEAD, 2 * self.lookahead)
        self.ahead, self.used = self._plan([after] + self.queue.first(self.lookahead - 1), len(self.queue)), 1
        return self.ahead.popleft() if self.ahead else None

    def _plan(self, completions: list, in_flight: int) -> deque:
        """Dispatches for ``completions`` (the next ones, in order), drawn as the one-at-a-time loop
        would draw them if the completions come in this order: each frees its client, then the
        next sampling counter picks a client among those available at its time and not busy
        (``in_flight`` tasks busy at each such draw). Their timings too, unless the algorithm's
        ``timing_reads_payload`` (the plan is made before those versions exist)."""
        s = self.s
        busy, flipped = self.busy, []  # put back as it was
        follows, counters, clients = [], [], []
        try:
            for event in completions:
                if busy[event.client_id]:
                    busy[event.client_id] = False
                    flipped.append(event.client_id)
                counter = s.progress.counter + len(clients)  # one sampling counter per dispatch
                client = s.system.sample_available(event.time, counter, 1, busy, in_flight)
                if not len(client):
                    break
                busy[client] = True
                flipped.append(int(client[0]))
                follows.append(_key(event))
                counters.append(counter)
                clients.append(int(client[0]))
        finally:
            np.logical_xor.at(busy, flipped, True)  # each flip undone (a client may flip twice)
        if not clients:
            return deque()
        # a task's counter is the one after its sampling counter (as in _dispatch)
        task_counters = np.array(counters, dtype=np.int64) + 1
        draws = s.system.task_draws(clients, task_counters)
        planned = deque(map(Planned, follows, counters, clients, draws))
        if not s.algorithm.timing_reads_payload:
            timing = s.timing(np.array(clients), task_counters, draws)
            for entry, known_at, failed in zip(planned, timing.known_at_s.tolist(), timing.failed.tolist()):
                entry.known_at, entry.failed = known_at, failed
        return planned

    def _send(self) -> None:
        """Send the unsent tasks in groups of ``clients_per_task`` clients (trained together,
        vectorized, each from its own model version), one call per group, round-robin over
        the actors: actors queue the calls and stay busy. Groups are cut by the order of
        dispatch alone, so results do not depend on the number of actors."""
        s = self.s
        size = s.task_size
        for first in range(0, len(self.unsent), size):
            group = self.unsent[first:first + size]
            task = Task("train", tuple(e.client_id for e in group), tuple(e.counter for e in group),
                        tuple(e.data.version for e in group))
            self._submit(self.next_call, s.with_states([task])[0], {e.data.version: e.data.payload for e in group},
                         len(group))
            for index, event in enumerate(group):
                event.data.call, event.data.index = self.next_call, index
            self.next_call += 1
        self.unsent = []

    def _submit(self, number: int, task: Task, payloads: dict, remaining: int) -> None:
        """Send ``task`` as call ``number`` to the next actor."""
        s = self.s
        pending = s.runtime.submit(self.next_actor, s.payloads.handles(set(task.versions)), [task])
        self.next_actor = (self.next_actor + 1) % s.runtime.num_actors
        self.calls[number] = Call(task, payloads, pending, remaining)

    def _result(self, event: Event) -> tuple[ClientUpdates, bool]:
        """The event's update and whether it has a non-finite value (checked once per call)."""
        info: InFlight = event.data
        if info.call < 0:
            self._send()
        call = self.calls[info.call]
        if call.updates is None:
            call.updates = self.s.runtime.gather([call.pending])[0][0]
            call.nonfinite = call.updates.nonfinite()
        call.remaining -= 1
        if call.remaining == 0:
            del self.calls[info.call]
        return call.updates.row(info.index), bool(call.nonfinite[info.index])

    def _log(self, event: Event, update: ClientUpdates | None, status: str, staleness: int) -> None:
        """One event row (TASK_COLUMNS), kept until :meth:`_flush_rows`."""
        s, info = self.s, event.data
        computed = update is not None
        down, up = s.task_bytes(info.payload)  # the client received its model; it sent back unless it failed
        up = 0 if status == "failed" else up
        s.progress.traffic(down, up)
        self.rows.append((s.progress.version + 1, event.client_id, update.actor[0] if computed else -1,
                          s.train_sizes[event.client_id], update.train_loss[0] if computed else math.nan,
                          update.compute_seconds[0] if computed else 0.0, info.start, event.time, info.version,
                          staleness, down, up, status))
        if s.client_diagnostics:
            self.numbers.append({k: v[0] for k, v in s.client_numbers(update).items()} if computed else {})

    def _flush_rows(self) -> None:
        """Hand the event rows kept so far to the scheduler, as columns."""
        if self.rows:
            numbers = {name: [row.get(name, math.nan) for row in self.numbers]
                       for name in self.s.client_diagnostics}
            self.s.log_events(numbers, **dict(zip(TASK_COLUMNS, zip(*self.rows))))
            self.rows, self.numbers = [], []


def _key(event: Event) -> tuple:
    """The event's place in the queue's order: (time, client id, counter)."""
    return event.time, event.client_id, event.counter
