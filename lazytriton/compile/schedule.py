"""The order in which this process's candidates reach the compile server: a
call that waits for its candidates first, compiles made ahead of time (no call
waits for them yet) after, each group in the order it was asked for.

One thread hands every candidate of the process on, one after another: a
kernel with a portable recipe (compile.recipe) goes to the server at once (its
front end runs in the worker), one without runs Triton's front end here first,
which holds the GIL, so more threads would not run those sooner; and one queue
lets a program's first call jump the compiles made ahead for the call sites
after it. When a call reaches a candidate that is still compiling ahead of
time, `promote` moves it to the front, wherever it is: waiting for this
thread, or for a worker in the compile server (CompilePool.promote). Without
that, a program whose 16 call sites were all compiled ahead at once would tune
its first kernel only once the last one had compiled.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import threading
import time
from typing import Callable

log = logging.getLogger("lazytriton.compile")

__all__ = ["BACKGROUND", "URGENT", "Ticket", "compile_cost", "history", "next_order", "promote", "resubmit",
           "submit"]

URGENT = 0  # a call waits for it
BACKGROUND = 1  # compiled ahead: no call waits for it yet


_lock = threading.Lock()  # tickets' priority, state and job; the queue


class Ticket:
    """One candidate's compile on its way. `work(ticket)` runs its front end on
    the queue's thread and hands the job on with `hand_to`."""

    __slots__ = ("work", "priority", "order", "cost", "state", "job", "pool", "times", "retry")

    def __init__(self, work: Callable[["Ticket"], None], priority: int, label: str = "", order: tuple = (),
                 cost: float = 0.0) -> None:
        self.work = work
        self.priority = priority
        self.order = order  # among tickets of one priority: (its stream's next_order(), its rank there)
        self.cost = cost  # compile_cost: in the compile server's queue, the costliest of a priority first
        self.state = "queued"  # then "running", then "done"
        self.job = None  # the compile server's JobFuture
        self.pool = None
        self.retry: Ticket | None = None  # its work queued again (resubmit): promote follows it
        # When it was queued, promoted, its front end started and ended, its job ended
        # (time.perf_counter()): where a first step's seconds go (history()).
        self.times = {"label": label, "priority": priority, "queued": time.perf_counter()}
        _history.append(self.times)

    def hand_to(self, pool, job: dict):
        """Submits the job to the compile pool at this ticket's priority now
        (a promote that came during the front end counts); its JobFuture."""
        with _lock:
            self.pool, self.job = pool, pool.submit(job, priority=self.priority, cost=self.cost)
        self.job.add_done_callback(self._job_done)
        return self.job

    def _job_done(self, job) -> None:
        self.times["job_done"] = time.perf_counter()
        if not job.cancelled() and job.exception() is None:
            # The worker's own seconds: the job started about job_done - job_s (the rest since
            # it was handed on is its wait in the server's queue).
            self.times["job_s"] = job.result()[1]


class _FrontEnds:
    def __init__(self) -> None:
        self._cv = threading.Condition(_lock)
        self._heap: list = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def submit(self, ticket: Ticket) -> None:
        with self._cv:
            heapq.heappush(self._heap, (ticket.priority, ticket.order, next(self._seq), ticket))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lazytriton-front-end", daemon=True)
                self._thread.start()
            self._cv.notify()

    def promote(self, ticket: Ticket) -> None:
        with self._cv:
            while ticket.retry is not None:
                ticket = ticket.retry
            if ticket.priority == URGENT:
                return
            ticket.priority = URGENT  # read again when it is handed to the server
            ticket.times["promoted"] = time.perf_counter()
            if ticket.state == "queued":  # a second entry, ahead; the first is skipped when popped
                heapq.heappush(self._heap, (URGENT, ticket.order, next(self._seq), ticket))
                self._cv.notify()
                return
            job, pool = ticket.job, ticket.pool
        if job is not None and pool is not None:
            pool.promote(job)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap:
                    self._cv.wait()
                *_, ticket = heapq.heappop(self._heap)
                if ticket.state != "queued":
                    continue
                ticket.state = "running"
            ticket.times["front_end"] = time.perf_counter()
            try:
                ticket.work(ticket)
            except BaseException:  # work settles its own future; this thread must go on
                log.exception("lazytriton: a front-end job failed unexpectedly")
            finally:
                ticket.times["front_end_done"] = time.perf_counter()
                with self._cv:
                    ticket.state = "done"

    def _after_fork(self) -> None:  # a forked child has no such thread: it starts its own
        global _lock
        _lock = threading.Lock()
        self._cv = threading.Condition(_lock)
        self._heap = []
        self._thread = None


_history: collections.deque = collections.deque(maxlen=4096)
_orders = itertools.count()
_queue = _FrontEnds()
os.register_at_fork(after_in_child=_queue._after_fork)


def compile_cost(constexprs: dict, num_warps: int | None) -> float:
    """A guess at a candidate's compile time, to start the longest compiles first: the
    last one then ends soonest (longest-processing-time first), where a program's first
    step waits for it. What a thread unrolls is its share of the tile it holds: the two
    largest block sizes (the int constexprs above 1: rows and columns of an output or
    accumulator tile; flags stay out) over the warps. A further block (a reduction's,
    looped over rather than held) counts by its square root. On the field benchmark's
    four matmuls (8 configs each, compile times measured alone on an H200) it ranks the
    three slowest of each first, and every matmul before elementwise kernels; the
    product of every block size and the stages, over the warps, ranked a 64x256 tile
    on 4 warps (1.50 s) with 64x128 ones (0.79 s). Only the order matters: a wrong
    guess costs time, never a result."""
    sizes = sorted(min(v, 4096) for v in constexprs.values() if type(v) is int and v > 1)  # a length is no tile
    held = math.prod(sizes[-2:])
    return float(held * math.sqrt(math.prod(sizes[:-2])) / max(1, num_warps or 4))


def next_order() -> int:
    """A place in the queue, taken when compiles are asked for: a program's
    call sites compiled ahead are queued in the order it asked (its lowering
    order), whichever background thread then gets to each first."""
    return next(_orders)


def submit(ticket: Ticket) -> None:
    """Queues a candidate's front end (runs `ticket.work` on the front-end thread)."""
    _queue.submit(ticket)


def resubmit(ticket: Ticket) -> Ticket:
    """Queues a ticket's work again, at its priority now (the compile server
    refused its job: its front end runs here after all); the new ticket."""
    with _lock:
        again = Ticket(ticket.work, ticket.priority, ticket.times.get("label", ""), ticket.order, ticket.cost)
        ticket.retry = again
    _queue.submit(again)
    return again


def promote(ticket: Ticket) -> None:
    """A call now waits for this candidate: its front end and its back end go
    ahead of every compile made ahead of time."""
    _queue.promote(ticket)


def history() -> list[dict]:
    """The process's last compiles through this queue, each with its label,
    priority and perf_counter times (queued, promoted, front_end,
    front_end_done, job_done) and the worker's seconds on it (job_s): for
    benchmarks."""
    return [dict(t) for t in _history]
