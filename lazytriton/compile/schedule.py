"""The process's one compile queue: which candidate's front end runs next, and which back end starts
next and where. Every ordering decision is here.

A candidate is a `Ticket`. One thread runs front ends (Triton's, in this process: they hold the GIL,
so more threads would not run them sooner): a call's candidates before those compiled ahead of time
(a call resolving meanwhile gets the GIL back sooner: `resolving`); within each, the long poles
first (`compile_cost` at least POLE times the costliest not ended: a first step waits for its
longest compile), then the others in the order asked for (a program's first sites tune while the
poles compile). A front end's job (its TTIR text and this process's Triton state, compile.ir_text)
waits among the ready jobs in the same order; it starts as soon as a slot is free: in the compile
server (compile.pool), a call's jobs on up to every worker and those made ahead (niced there) on the
workers left, any but a pole niced a little more; on a thread of this process only when there is
no server (disabled, refused, dead): one still starting is waited for. A call that reaches a
candidate still queued ahead of time (`promote`) moves it among the call's; those asked for `soon`
(a JAX program's sites, at its lowering: it runs them all, in an order not known) are there, in one
place (`TOGETHER`): the longest first across them.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import heapq
import itertools
import logging
import math
import os
import sys
import threading
import time
from typing import Callable

from . import pool as compile_pool
from .ir_text import release

log = logging.getLogger("lazytriton.compile")

__all__ = ["BACKGROUND", "TOGETHER", "URGENT", "Ticket", "compile_cost", "history", "in_order_cost", "next_order",
           "promote", "submit"]

URGENT = 0  # a call waits for it
BACKGROUND = 1  # compiled ahead: no call waits for it yet
# A long pole: a ticket whose cost is at least POLE times that of the costliest ticket of its priority
# not ended. Poles go first, costliest first (a first step waits for its longest compile); the others
# in the order asked for (a program's first sites tune while the poles compile). A worker's nice
# increment: compiles made ahead yield the cores to a call's, and within each the others yield them to
# the poles (an H200's 16-site program, 16 workers on 16 cores: the GELU tile took 5-26% longer than alone).
POLE = 2 / 3
_NICE, _SHORT_NICE = {URGENT: 0, BACKGROUND: 10}, 5
TOGETHER = -1  # the place of compiles asked for `soon`: one program's, run in an order not known


def _pole(t: "Ticket") -> bool:
    return t.cost >= POLE * max(_live[t.priority], default=0.0)


class _Line:
    """Tickets in one state ("front": waiting for their front end; "ready": for a slot), in the
    queue's order: the first pole if any, else the first in the order asked for (by priority
    first, either way). An entry whose ticket has left the state or changed priority is stale and
    dropped when it surfaces."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.by_cost: list = []  # (priority, -cost, order, seq, ticket)
        self.by_order: list = []  # (priority, stream order, -cost, rank, seq, ticket)

    def push(self, t: "Ticket") -> None:
        seq = next(_seq)
        heapq.heappush(self.by_cost, (t.priority, -t.cost, t.order, seq, t))
        heapq.heappush(self.by_order, (t.priority, t.order[:1], -t.cost, t.order[1:], seq, t))

    def _top(self, heap: list) -> "Ticket | None":
        while heap and (heap[0][-1].state != self.state or heap[0][0] != heap[0][-1].priority):
            heapq.heappop(heap)
        return heap[0][-1] if heap else None

    def first(self) -> "Ticket | None":
        nxt = self._top(self.by_order)
        pole = self._top(self.by_cost)
        return pole if pole is not None and pole.priority <= nxt.priority and _pole(pole) else nxt

    def clear(self) -> None:
        self.by_cost.clear()
        self.by_order.clear()


class Ticket:
    """One candidate's compile. `work()` runs its front end (on the queue's
    thread) and returns the job: compile.ir_text.front_end's output and the
    target. `future` gets (CompiledBinary, the back end's seconds, "worker" or "thread"), or the error."""

    __slots__ = ("work", "priority", "order", "cost", "state", "job", "here", "future", "times")

    def __init__(self, work: Callable[[], dict], priority: int, label: str = "", order: tuple = (),
                 cost: float = 0.0, here: bool = False) -> None:
        self.work = work
        self.priority = priority
        self.order = order  # among tickets of one priority: (its stream's next_order(), its rank there)
        self.cost = cost  # compile_cost
        self.here = here  # its back end runs in this process (no compile server)
        self.state = "new"  # then "front", "ready", "running", "done" (or "cancelled")
        self.job: dict | None = None
        self.future: cf.Future = cf.Future()
        # When it was queued, promoted, its front end started and ended, its back end ended
        # (time.perf_counter()), and the back end's own seconds: where a first step's seconds go.
        self.times = {"label": label, "priority": priority, "queued": time.perf_counter()}
        _history.append(self.times)

    def cancel(self) -> bool:
        """Drops it if nothing of it started yet (its stream stopped reading)."""
        with _cv:
            if self.state not in ("new", "front"):
                return False
            if self.state == "front":
                _forget(self)
            self.state = "cancelled"
            self.work = None
        self.future.cancel()
        return True


_cv = threading.Condition()  # every ticket's state and priority, both heaps, the slots
_fronts = _Line("front")  # front ends to run
_ready = _Line("ready")  # jobs waiting for a slot
_seq = itertools.count()
_running = {URGENT: 0, BACKGROUND: 0}  # back ends under way (server and here), by the priority they started with
_live = {URGENT: collections.Counter(), BACKGROUND: collections.Counter()}  # costs of tickets not ended, by priority
_thread: threading.Thread | None = None
_threads: cf.ThreadPoolExecutor | None = None  # back ends in this process
_waiting_for_server = False
_history: collections.deque = collections.deque(maxlen=4096)
_orders = itertools.count()
_calls, _SWITCH_S = [0, 0.0], 0.0005  # resolving(): calls now, the interval before them; the interval meanwhile


def submit(ticket: Ticket) -> None:
    """Queues a candidate: its front end, then its back end."""
    global _thread
    with _cv:
        if ticket.state != "new":
            return
        ticket.state = "front"
        _live[ticket.priority][ticket.cost] += 1
        _fronts.push(ticket)
        if _thread is None:
            _thread = threading.Thread(target=_front_ends, name="lazytriton-front-end", daemon=True)
            _thread.start()
        _cv.notify()


def promote(ticket: Ticket) -> None:
    """A call now waits for this candidate: what is left of it goes ahead of
    every compile made ahead of time (a back end already running stays as it is)."""
    with _cv:
        if ticket.priority != URGENT:  # else asked for as a call's (`soon`): its place stays
            if ticket.state in ("front", "running", "ready"):
                _forget(ticket)
                _live[URGENT][ticket.cost] += 1
            ticket.priority = URGENT
            ticket.times["promoted"] = time.perf_counter()
            if ticket.state == "front":  # a second entry, ahead; the first is now stale
                _fronts.push(ticket)
            elif ticket.state == "ready":
                _ready.push(ticket)
    _dispatch()


def _front_ends() -> None:
    while True:
        ticket = job = work = None  # this thread waits with nothing of a kernel held (its error's frames)
        with _cv:
            while (ticket := _fronts.first()) is None:
                _cv.wait()
            ticket.state, work = "running", ticket.work
        ticket.times["front_end"] = time.perf_counter()
        try:
            job = work()
        except BaseException as exc:  # noqa: BLE001  (the candidate's error; this thread goes on)
            ticket.times["front_end_done"] = time.perf_counter()
            _finish(ticket, exc, None, counted=False)
            continue
        ticket.times["front_end_done"] = time.perf_counter()
        with _cv:
            ticket.state, ticket.job = "ready", job
            _ready.push(ticket)
        _dispatch()


def _dispatch() -> None:
    """Starts ready jobs while slots are free: the one place back ends start."""
    global _waiting_for_server
    pool = compile_pool.get_pool()
    while True:
        with _cv:
            ticket = _ready.first()
            if ticket is None:
                return
            # Here: no server, or a job whose state cannot travel (compile.ir_text.process_state).
            here = pool is None or ticket.here or bool(ticket.job["ir"].get("local"))
            server = not here and pool.ready()
            # A server still starting is waited for (ready 0.3 s into a fresh process's first call, H200): on
            # threads here back ends share the GIL (an 8-config matmul: 0.91 s waiting, 1.22 s two on threads).
            wait = not here and not server and pool.starting()
            if wait:
                wait, _waiting_for_server = not _waiting_for_server, True
                break
            # A call's jobs start beside compiles made ahead (niced there) rather than after them.
            if (_running[URGENT] if ticket.priority == URGENT and server else sum(_running.values())) >= (
                    pool.workers if server else os.cpu_count() or 1):
                return
            ticket.state = "running"
            _running[ticket.priority] += 1
            ticket.times["ran_as"] = ticket.priority  # what it counts against until it ends
            job = dict(ticket.job, nice=_NICE[ticket.priority] + _SHORT_NICE * (not _pole(ticket)))
            if not server:  # counted (under _cv) before the next ticket is looked at
                _back_end_here(ticket, job)
                continue
        try:
            # The front end's own module stays here until the worker answers: it compiles here
            # if the worker cannot read the job (its text does not read back as printed).
            pool.submit(job).add_done_callback(lambda f, t=ticket: _settled(t, f))
        except (compile_pool.WorkerUnavailable, OSError) as exc:
            log.info("%s: compiling it in this process (%s)", ticket.times["label"], exc)
            _back_end_here(ticket, job)
    if wait:
        pool.when_ready(_server_ready)


def _server_ready() -> None:
    global _waiting_for_server
    with _cv:
        _waiting_for_server = False
    _dispatch()


def _back_end_here(ticket: Ticket, job: dict) -> None:
    global _threads
    from .ir_text import compile_text

    def run():
        t0 = time.perf_counter()
        return compile_text(job["ir"], job["target"]), time.perf_counter() - t0, "thread"

    with _cv:
        ticket.times["here"] = True
        if _threads is None:
            _threads = cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="lazytriton-compile")
    _threads.submit(run).add_done_callback(lambda f: _settled(ticket, f))


def _settled(ticket: Ticket, fut: cf.Future) -> None:
    exc = fut.exception()
    if isinstance(exc, compile_pool.WorkerUnavailable):  # the worker could not read it: here, then
        log.info("%s: %s; compiling it in this process", ticket.times["label"], exc)
        _back_end_here(ticket, dict(ticket.job))
        return
    _finish(ticket, exc, None if exc else (*fut.result()[:2], "thread" if ticket.times.get("here") else "worker"))
    _dispatch()


def _finish(ticket: Ticket, exc: BaseException | None, result, counted: bool = True) -> None:
    with _cv:
        if counted:
            _running[ticket.times["ran_as"]] -= 1
        _forget(ticket)
        job, ticket.state, ticket.work, ticket.job = ticket.job, "done", None, None  # what it held of the kernel goes
    if job is not None:
        release(job["ir"])
    ticket.times["job_done"] = time.perf_counter()
    if exc is not None:
        ticket.future.set_exception(exc)
        return
    ticket.times["job_s"] = result[1]
    ticket.future.set_result(result)


def _forget(t: Ticket) -> None:
    """Its cost leaves the live ones (it ended, or moves to another priority)."""
    live = _live[t.priority]
    live[t.cost] -= 1
    if live[t.cost] <= 0:
        del live[t.cost]


def _after_fork() -> None:  # a forked child has none of this process's threads: it starts its own
    global _cv, _thread, _threads, _waiting_for_server
    _cv = threading.Condition()
    _fronts.clear()
    _ready.clear()
    _thread = _threads = None
    _running[URGENT] = _running[BACKGROUND] = 0
    _live[URGENT].clear()
    _live[BACKGROUND].clear()
    _waiting_for_server = False


os.register_at_fork(after_in_child=_after_fork)


def compile_cost(constexprs: dict, num_warps: int | None, code: int = 1) -> float:
    """A guess at a candidate's compile time, to start the longest compiles first: the
    last one then ends soonest (longest-processing-time first), where a program's first
    step waits for it. What a thread unrolls is its share of the tile it holds: the two
    largest block sizes (the int constexprs above 1: rows and columns of an output or
    accumulator tile; flags stay out) over the warps. A further block (a reduction's,
    looped over rather than held) counts by its square root. Times `code`, the operations
    applied to it (model.spec.code_size): a 256x128 tile took 1.9 s with a GELU epilogue,
    0.42 s with none. On the field benchmark's four matmuls (compile times measured on an
    H200) it ranks the three slowest of each first, GELU's above the others', and every
    matmul before elementwise kernels. Only the order matters: a wrong guess costs time."""
    sizes = sorted(min(v, 4096) for v in constexprs.values() if type(v) is int and v > 1)  # a length is no tile
    held = math.prod(sizes[-2:])
    return float(held * math.sqrt(math.prod(sizes[:-2])) / max(1, num_warps or 4) * max(1, code))


def in_order_cost(rank: int, n: int) -> float:
    """The cost that queues a stream's candidates in the order given (the queue runs a
    stream's costliest first): online tuning's, whose first call waits for the first one ready."""
    return float(n - rank)


def next_order() -> int:
    """A place in the queue, taken when compiles are asked for: a program's
    call sites compiled ahead are queued in the order it asked (its lowering
    order), whichever background thread then gets to each first."""
    return next(_orders)


@contextlib.contextmanager
def resolving():
    """A call resolves: threads switch every 0.5 ms, not 5, so each step of its trials gets the GIL
    back soon from the front ends running beside it (3 cached candidates, recording driver: 40 ms
    alone, 260-480 ms beside front ends, 80-140 ms with this; holding those front ends instead left an
    H200's field run's next kernels waiting for their compiles)."""
    with _cv:
        _calls[0] += 1
        if _calls[0] == 1:
            _calls[1] = sys.getswitchinterval()
            sys.setswitchinterval(_SWITCH_S)
    try:
        yield
    finally:
        with _cv:
            _calls[0] -= 1
            if not _calls[0] and sys.getswitchinterval() == _SWITCH_S:  # unless the program set its own since
                sys.setswitchinterval(_calls[1])


def history() -> list[dict]:
    """The process's last compiles through this queue, each with its label,
    priority and perf_counter times (queued, promoted, front_end,
    front_end_done, job_done), the back end's own seconds (job_s) and whether
    it ran here: for benchmarks."""
    return [dict(t) for t in _history]
