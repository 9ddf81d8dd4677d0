"""The caller's handle on the compile server (lazytriton.compile.server).

Started when a kernel is wrapped, so that it is warm by the first call that compiles; a process that
never calls a kernel only pays for one idle process. A job is a candidate's TTIR text with the
caller's Triton state (lazytriton.compile.ir_text.front_end); the server forks a child for it at
once: which job is sent when is decided by the caller (compile.schedule).

A child that dies (a crash in the compiler) is reported for its candidate alone; a server that dies
fails its running jobs and is restarted on next use; one not ready START_S after its start is killed
and none started again (the caller compiles alone): nothing ever hangs.

Settings: ``LAZYTRITON_COMPILE_WORKERS`` (default: the cores this process may use, at most 32; 0
compiles in-process on threads).
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future

from ..settings import compile_workers
from .server import BOOTSTRAP, READY, WorkerUnavailable, read_frame, shadows, write_frame

log = logging.getLogger("lazytriton.compile.pool")

__all__ = ["CompileFailed", "CompilePool", "WorkerCrashed", "WorkerUnavailable", "get_pool", "start"]

START_S = 120.0  # a server still not ready this long after its start is stopped (ready in 0.3-0.9 s on an H200)


class WorkerCrashed(RuntimeError):
    """The process compiling a candidate died."""


class CompileFailed(Exception):
    """triton.compile raised in the worker (the message is its reason)."""


def default_workers() -> int:
    n = compile_workers()
    if n is not None:
        return n
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, 32))


class CompilePool:
    """A handle on the compile server process; jobs return Futures."""

    def __init__(self, workers: int):
        self.workers = workers
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        # Frames for the running server, written by a thread of their own: a write blocks while
        # the server's stdin pipe is full, and the server drains it only while its results are
        # read, so the thread that reads them (which sends the next jobs) must never write.
        self._outbox: queue.SimpleQueue | None = None
        self._pending: dict[int, tuple[subprocess.Popen, Future]] = {}  # job id -> (its server, its future)
        self._ids = itertools.count()
        self._stderr = None  # the running server's stderr, a file: its tail names a crash
        self.timeline: dict = {}  # its start-up on our perf_counter: started_at, imports_done_at, ready_at, hashed_at
        self.stopped = False  # one was not ready START_S after its start: this process compiles alone
        self._on_ready: list = []  # when_ready's callables for the server starting now

    def start(self) -> None:
        """Starts the server if it is not running (returns at once: it warms up on its own)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        # The server must never see a GPU; Triton's settings and sys.path are inherited (so no `site`:
        # -S, its .pth files took 65 ms on an H200), and it imports this very lazytriton (not a source tree).
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds lazytriton/
        path = [here] + [p for p in sys.path if p and not shadows(p, here)]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(path))
        stderr = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, "-S", "-c", BOOTSTRAP, str(self.workers)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=here, close_fds=True,
                                start_new_session=True)
        self._proc, self._stderr, self.timeline, self._on_ready = proc, stderr, {"started_at": time.perf_counter()}, []
        self._outbox = queue.SimpleQueue()
        threading.Thread(target=self._write_frames, args=(proc, self._outbox), name="lazytriton-compile-pool-writer",
                         daemon=True).start()
        threading.Thread(target=self._read_results, args=(proc, stderr), name="lazytriton-compile-pool",
                         daemon=True).start()
        timer = threading.Timer(START_S, self._not_ready, args=(proc,))
        timer.daemon = True
        timer.start()
        log.debug("started the compile server (pid %d, %d workers)", proc.pid, self.workers)
        return proc

    def _not_ready(self, proc: subprocess.Popen) -> None:
        with self._lock:
            if self._proc is not proc or "ready_at" in self.timeline or proc.poll() is not None:
                return
            self.stopped = True
        log.warning("lazytriton: the compile server was not ready %g s after its start: stopping it; this process "
                    "compiles alone from now on%s", START_S, self._tail())
        with contextlib.suppress(OSError):  # with its children (its session); its reader then lets the waiting go
            os.killpg(proc.pid, signal.SIGKILL)

    def ready(self) -> bool:
        """Whether the server is up and warm (it has sent its ready frame)."""
        with self._lock:
            return self._proc is not None and self._proc.poll() is None and "ready_at" in self.timeline

    def starting(self) -> bool:
        """Whether a server is running but not ready yet."""
        with self._lock:
            return self._proc is not None and self._proc.poll() is None and "ready_at" not in self.timeline

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Starts the server if needed and waits until it is ready (tests, benchmarks)."""
        self.start()
        self.when_ready((up := threading.Event()).set)  # ready, or dead
        return up.wait(timeout) and self.ready()

    def when_ready(self, fn) -> None:
        """Calls fn() once the running server is ready or has died (on the thread
        that reads its results), now if no server is starting."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and "ready_at" not in self.timeline:
                self._on_ready.append(fn)
                return
        fn()

    def submit(self, job: dict) -> Future:
        """A Future of (CompiledBinary, seconds); its exception is CompileFailed,
        WorkerUnavailable or WorkerCrashed. The server forks a child for it at
        once. Never blocks; raises WorkerUnavailable for a job that does not
        pickle, OSError when no server can start."""
        try:
            data = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # an option value that does not pickle
            raise WorkerUnavailable(f"the job does not pickle ({exc})") from None
        with self._lock:
            proc = self._ensure_started()
            fut: Future = Future()
            job_id = next(self._ids)
            self._pending[job_id] = (proc, fut)
            self._outbox.put((job_id, data))
        return fut

    def _write_frames(self, proc: subprocess.Popen, outbox: queue.SimpleQueue) -> None:
        while True:
            item = outbox.get()
            if item is None:
                return
            try:
                write_frame(proc.stdin, item)
            except (BrokenPipeError, OSError, ValueError) as exc:
                with self._lock:
                    gone = self._pending.pop(item[0], None)
                if gone is not None:
                    gone[1].set_exception(WorkerCrashed(f"the compile server is gone ({exc}){self._tail()}"))

    def _tail(self, stderr=None) -> str:
        f = stderr or self._stderr
        try:
            f.seek(0)
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except (OSError, ValueError, AttributeError):
            return ""
        return ("; its last output:\n  " + "\n  ".join(lines[-10:])) if lines else ""

    def _read_results(self, proc: subprocess.Popen, stderr) -> None:
        while True:
            try:
                job_id, status, value, seconds = read_frame(proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError):
                break
            if job_id == READY:
                with self._lock:
                    if self._proc is proc:
                        self.timeline.update(value)
                self._fire_ready(proc)
                continue
            with self._lock:
                _, fut = self._pending.pop(job_id, (None, None))
            if fut is None:
                continue
            if status == "ok":
                fut.set_result((value, seconds))
            else:
                fut.set_exception({"unavailable": WorkerUnavailable, "crashed": WorkerCrashed}.get(
                    status, CompileFailed)(value))
        code = proc.wait()
        with self._lock:
            # Only this server's jobs: a restarted server's are not lost with it.
            pending = [self._pending.pop(i)[1] for i, (p, _) in list(self._pending.items()) if p is proc]
            if self._proc is proc:
                self._proc = None
                self._outbox.put(None)  # its writer stops (a restarted server gets its own)
                self._outbox = None
        self._fire_ready(proc)  # those waiting for it go elsewhere
        if pending:
            why = WorkerCrashed(f"the compile server exited (code {code}) while compiling{self._tail(stderr)}")
            for f in pending:
                f.set_exception(why)

    def _fire_ready(self, proc) -> None:
        with self._lock:
            waiting, self._on_ready = (self._on_ready, []) if self._proc in (proc, None) else ([], self._on_ready)
        for fn in waiting:
            try:
                fn()
            except Exception:  # noqa: BLE001  (one caller's callback must not stop this thread)
                log.exception("lazytriton: a callback waiting for the compile server failed")

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


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def get_pool() -> CompilePool | None:
    """The process's compile pool, or None when disabled (LAZYTRITON_COMPILE_WORKERS=0) or stopped."""
    global _pool
    with _pool_lock:
        if _pool is None:
            n = default_workers()
            if n == 0:
                return None
            _pool = CompilePool(n)
            atexit.register(_pool.close)
        return None if _pool.stopped else _pool


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
    """The running compile server's start-up on this process's perf_counter clock (started_at,
    imports_done_at, ready_at, hashed_at: Triton's installation hash), for benchmarks; {} if none."""
    if _pool is None:
        return {}
    with _pool._lock:
        return dict(_pool.timeline)
