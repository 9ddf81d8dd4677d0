"""Compiling candidate configs in worker processes, so that they compile in parallel.

The caller's side: a handle on the compile server (lazytriton.compile.server),
started when a kernel is wrapped so that it is warm by the first call that
compiles; a process that never calls a kernel only pays for one idle process.
Jobs are Futures. A job is a candidate's portable recipe (lazytriton.compile.
recipe: the kernel's sources and the values they read; the worker runs
Triton's front end) or, for a kernel that has none, its TTIR text
(lazytriton.compile.ir_text: the caller runs the front end), so any kernel
compiles there, wherever it is defined, and no worker imports the user's code.

A child that dies (a crash in the compiler) is reported for its candidate
alone, naming the kernel and config; a server that dies fails every pending
candidate with an error and is restarted on next use: nothing ever hangs.

Settings: ``LAZYTRITON_COMPILE_WORKERS`` (default: the cores this process may
use, at most 32; 0 compiles in-process on threads).
"""
from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

from ..settings import compile_workers
from .recipe import RecipeRefused
from .server import BOOTSTRAP, PROMOTE, READY, WorkerUnavailable, is_triton_setting, read_frame, shadows, write_frame

log = logging.getLogger("lazytriton.compile.pool")

__all__ = ["CompileFailed", "CompilePool", "JobFuture", "RecipeRefused", "WorkerCrashed", "WorkerUnavailable", "get_pool",
           "portable_job", "start", "worker_job"]


class WorkerCrashed(RuntimeError):
    """The process compiling a candidate died."""


class JobFuture(Future):
    """A job's result; `job_id` names it to the server (CompilePool.promote)."""

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id


def default_workers() -> int:
    n = compile_workers()
    if n is not None:
        return n
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, 32))


# -- what a job is -------------------------------------------------------------------

def worker_job(ir: dict, target) -> dict | None:
    """What a worker needs to compile one candidate whose front end ran here
    (`ir`: compile.ir_text.front_end's output), or None when it does not pickle."""
    return _job("ir", ir, target)


def portable_job(source: dict, target) -> dict | None:
    """What a worker needs to run one candidate's front end and back end
    (`source`: compile.recipe.job_source's output), or None when it does not pickle."""
    return _job("source", source, target)


def _job(kind: str, payload: dict, target) -> dict | None:
    job = {kind: payload, "target": target, "env": _triton_env()}
    try:
        pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # an option value that does not pickle
        log.debug("kernel %s: compiled in-process (%s)", payload.get("name"), exc)
        return None
    return job


def _triton_env() -> dict:
    """The caller's Triton settings now (TRITON_*, PTXAS_OPTIONS, ...): a worker
    compiles under these, not under those the server started with (Triton's
    compiler reads some knobs itself, e.g. TRITON_INSTRUMENTATION_MODE)."""
    return {k: v for k, v in os.environ.items() if is_triton_setting(k)}


# -- the caller's side -------------------------------------------------------------------

class CompilePool:
    """A handle on the compile server process; jobs return Futures."""

    def __init__(self, workers: int):
        self.workers = workers
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        # Frames for the running server, written by a thread of their own: a write blocks
        # while the server's stdin pipe is full, and the server drains it only while its
        # results are read, so no thread that a result wakes may ever write.
        self._outbox: queue.SimpleQueue | None = None
        self._pending: dict[int, tuple[subprocess.Popen, Future]] = {}  # job id -> (its server, its future)
        self._ids = itertools.count()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        # The running server's start-up on this process's perf_counter clock: started_at,
        # then from its ready frame imports_done_at, ready_at, waited_for_hash_s.
        self.timeline: dict = {}
        self._on_ready: list = []  # when_ready's callables for the server starting now

    def start(self) -> None:
        """Starts the server if it is not running (returns at once: it warms up on its own)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        # The server must never see a GPU; Triton's settings and sys.path are inherited,
        # and it imports this very lazytriton (not a source tree in its working directory).
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds lazytriton/
        path = [here] + [p for p in sys.path if p and not shadows(p, here)]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(path))
        proc = subprocess.Popen([sys.executable, "-c", BOOTSTRAP, str(self.workers)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=here, close_fds=True, start_new_session=True)
        self._proc, self.timeline, self._on_ready = proc, {"started_at": time.perf_counter()}, []
        self._outbox = queue.SimpleQueue()
        threading.Thread(target=self._write_frames, args=(proc, self._outbox), name="lazytriton-compile-pool-writer",
                         daemon=True).start()
        threading.Thread(target=self._read_results, args=(proc,), name="lazytriton-compile-pool",
                         daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(proc,), name="lazytriton-compile-pool-stderr",
                         daemon=True).start()
        log.debug("started the compile server (pid %d, %d workers)", proc.pid, self.workers)
        return proc

    def ready(self) -> bool:
        """Whether the server is up and warm (it has sent its ready frame)."""
        with self._lock:
            return self._proc is not None and self._proc.poll() is None and "ready_at" in self.timeline

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Starts the server if needed and waits until it is ready (tests, benchmarks)."""
        self.start()
        deadline = time.perf_counter() + timeout
        while not self.ready():
            if time.perf_counter() > deadline:
                return False
            time.sleep(0.01)
        return True

    def when_ready(self, fn) -> None:
        """Calls fn() once the running server is ready: now if it is, else on the thread
        that reads its results when its ready frame comes; never if it dies first or
        none is running."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                return
            if "ready_at" not in self.timeline:
                self._on_ready.append(fn)
                return
        fn()

    def submit(self, job: dict, priority: int = 0, cost: float = 0.0) -> JobFuture:
        """A Future of (CompiledBinary, seconds); its exception is CompileFailed,
        WorkerUnavailable or WorkerCrashed. Queued jobs start by `priority` (0
        first), then by `cost` (highest first: schedule.compile_cost), then in
        the order they were submitted. Never blocks."""
        with self._lock:
            proc = self._ensure_started()
            fut = JobFuture(next(self._ids))
            self._pending[fut.job_id] = (proc, fut)
            self._outbox.put((fut.job_id, dict(job, priority=priority, cost=cost)))
        return fut

    def promote(self, fut: JobFuture) -> None:
        """Starts that job before lower-priority ones still queued (a call now waits for it)."""
        with self._lock:
            if fut.job_id in self._pending and self._outbox is not None:
                self._outbox.put((PROMOTE, [fut.job_id]))

    def _write_frames(self, proc: subprocess.Popen, outbox: queue.SimpleQueue) -> None:
        while True:
            item = outbox.get()
            if item is None:
                return
            try:
                write_frame(proc.stdin, item)
            except (BrokenPipeError, OSError, ValueError) as exc:
                if item[0] == PROMOTE:
                    continue
                with self._lock:
                    gone = self._pending.pop(item[0], None)
                if gone is not None:
                    gone[1].set_exception(WorkerCrashed(f"the compile server is gone ({exc}){self._tail()}"))

    def _tail(self) -> str:
        lines = [ln for ln in self._stderr_tail if ln.strip()]
        return ("; its last output:\n  " + "\n  ".join(lines[-10:])) if lines else ""

    def _read_results(self, proc: subprocess.Popen) -> None:
        while True:
            try:
                job_id, status, value, seconds = read_frame(proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError):
                break
            if job_id == READY:
                waiting = []
                with self._lock:
                    if self._proc is proc:
                        self.timeline.update(value)
                        waiting, self._on_ready = self._on_ready, []
                for fn in waiting:
                    try:
                        fn()
                    except Exception:  # noqa: BLE001  (one caller's callback must not stop this thread)
                        log.exception("lazytriton: a callback waiting for the compile server failed")
                log.debug("the compile server is ready, %.3fs after it started (%.3fs of it waiting for Triton's "
                          "installation hash)", value["ready_at"] - self.timeline.get("started_at", 0.0),
                          value["waited_for_hash_s"])
                continue
            with self._lock:
                _, fut = self._pending.pop(job_id, (None, None))
            if fut is None:
                continue
            if status == "ok":
                fut.set_result((value, seconds))
            elif status == "unavailable":
                fut.set_exception(WorkerUnavailable(value))
            elif status == "crashed":
                fut.set_exception(WorkerCrashed(value))
            elif status == "refused":
                fut.set_exception(RecipeRefused(value))
            else:
                fut.set_exception(CompileFailed(value))
        code = proc.wait()
        with self._lock:
            # Only this server's jobs: a restarted server's are not lost with it.
            mine = [i for i, (p, _) in self._pending.items() if p is proc]
            pending = [self._pending.pop(i)[1] for i in mine]
            if self._proc is proc:
                self._proc = None
                self._on_ready = []
                self._outbox.put(None)  # its writer stops (a restarted server gets its own)
                self._outbox = None
        if pending:
            why = WorkerCrashed(f"the compile server exited (code {code}) while compiling{self._tail()}")
            for f in pending:
                f.set_exception(why)

    def _read_stderr(self, proc: subprocess.Popen) -> None:
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            self._stderr_tail.append(line)
            log.debug("compile server: %s", line)

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            if self._outbox is not None:
                self._outbox.put(None)
                self._outbox = None
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()  # the server exits on EOF and takes its children along
                proc.wait(timeout=5)
            except Exception:
                proc.kill()


class CompileFailed(Exception):
    """triton.compile raised in the worker (the message is its reason)."""


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def get_pool() -> CompilePool | None:
    """The process's compile pool, or None when disabled (LAZYTRITON_COMPILE_WORKERS=0)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            n = default_workers()
            if n == 0:
                return None
            _pool = CompilePool(n)
            atexit.register(_pool.close)
        return _pool


def start() -> None:
    """Starts the compile server in the background, so that it is warm by the
    first call that compiles (called when a kernel is wrapped)."""
    pool = get_pool()
    if pool is not None:
        try:
            pool.start()
        except OSError as exc:  # the first compile says so and compiles in its process
            log.debug("the compile server could not start: %s", exc)


def server_timeline() -> dict:
    """The running compile server's start-up on this process's perf_counter
    clock (started_at, imports_done_at, ready_at; waited_for_hash_s), for
    benchmarks; {} when none was started."""
    pool = _pool
    if pool is None:
        return {}
    with pool._lock:
        return dict(pool.timeline)
