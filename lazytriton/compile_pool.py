"""Compiling candidate configs in worker processes, so that they compile in parallel.

Triton's front end (the AST walk that emits TTIR) holds the GIL, so candidates
compiled on threads mostly serialise. As PyTorch Inductor does, lazytriton
keeps one compile server process (``python -m lazytriton.compile_pool``) that
imports Triton and compiles one tiny kernel once (the first compile in a
process pays for backend set-up), then forks a child per candidate, at most
one per core at a time. The server has no threads, so forking it is safe, and
it never touches CUDA (it runs with ``CUDA_VISIBLE_DEVICES=""``): the caller's
CUDA context is never forked, and a process that never calls a kernel only
pays for one idle process.

A child compiles ``triton.compile(ASTSource(fn, ...), target=...)`` (a Gluon
kernel: ``GluonASTSource``) for a kernel it imports by module and qualified name, and returns the
CompiledBinary (Triton's own cache is filled as a side effect). It checks that
the function it imported has the caller's ``cache_key``, so a source file
edited since the caller imported it is never compiled in its place. Kernels
that cannot be imported by name (defined in ``__main__``, inside a function)
are compiled in the caller's process instead (``worker_job`` returns None).

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
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("lazytriton.compile_pool")

_HEADER = struct.Struct("<Q")


class WorkerUnavailable(Exception):
    """The worker could not compile this kernel by name (import failed, or its
    source differs from the caller's): compile it in the caller's process."""


class WorkerCrashed(RuntimeError):
    """The process compiling a candidate died."""


def default_workers() -> int:
    env = os.environ.get("LAZYTRITON_COMPILE_WORKERS")
    if env is not None and env.strip() != "":
        return max(0, int(env))
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, 32))


# -- framing: length-prefixed pickles ------------------------------------------------

def _write_frame(stream, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact(stream, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(stream) -> Any:
    (n,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    return pickle.loads(_read_exact(stream, n))


# -- what a job is -------------------------------------------------------------------

def kernel_address(fn) -> tuple[str, str] | None:
    """(module, qualified name) a worker can import `fn` (a JITFunction) by, or None."""
    py = getattr(fn, "fn", None)
    module = getattr(py, "__module__", None)
    qualname = getattr(py, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<locals>" in qualname:
        return None
    mod = sys.modules.get(module)
    if mod is None or getattr(mod, "__spec__", None) is None:  # e.g. exec'd code, a script run as __main__
        return None
    return module, qualname


def worker_job(spec, target, bound) -> dict | None:
    """What a worker needs to compile one bound candidate, or None when the
    kernel cannot be compiled by name in another process."""
    addr = kernel_address(spec.fn)
    if addr is None:
        return None
    job = {"module": addr[0], "qualname": addr[1], "cache_key": spec.fn.cache_key, "gluon": spec.gluon,
           "signature": bound.signature, "constexprs": bound.constexprs, "attrs": bound.attrs,
           "options": dict(bound.options.__dict__), "target": target, "sys_path": list(sys.path),
           "env": _triton_env()}
    try:
        pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # a constexpr value that does not pickle
        log.debug("kernel %s: compiled in-process (%s)", spec.name, exc)
        return None
    return job


def _is_triton_setting(name: str) -> bool:
    from .keys import _EXTRA_ENV_VARS

    return name.startswith("TRITON_") or name in _EXTRA_ENV_VARS


def _triton_env() -> dict:
    """The caller's Triton settings now (TRITON_*, PTXAS_OPTIONS, ...): a worker
    compiles under these, not under those the server started with (Triton's
    compiler reads some knobs itself, e.g. TRITON_INSTRUMENTATION_MODE)."""
    return {k: v for k, v in os.environ.items() if _is_triton_setting(k)}


def _shadows(entry: str, here: str) -> bool:
    """Whether sys.path entry `entry` holds another lazytriton than the one at `here`."""
    try:
        return os.path.isdir(os.path.join(entry, "lazytriton")) and not os.path.samefile(entry, here)
    except OSError:
        return False


# -- the caller's side -------------------------------------------------------------------

class CompilePool:
    """A handle on the compile server process; jobs return Futures."""

    def __init__(self, workers: int):
        self.workers = workers
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pending: dict[int, tuple[subprocess.Popen, Future]] = {}  # job id -> (its server, its future)
        self._ids = itertools.count()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._started_at = 0.0

    def start(self) -> None:
        """Starts the server if it is not running (returns at once: it warms up on its own)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        # The server must never see a GPU; Triton's settings and sys.path are inherited,
        # and it imports this very lazytriton (not a source tree in its working directory).
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = [here] + [p for p in sys.path if p and not _shadows(p, here)]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(path))
        proc = subprocess.Popen([sys.executable, "-m", "lazytriton.compile_pool", str(self.workers)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=here, close_fds=True, start_new_session=True)
        self._proc, self._started_at = proc, time.perf_counter()
        threading.Thread(target=self._read_results, args=(proc,), name="lazytriton-compile-pool",
                         daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(proc,), name="lazytriton-compile-pool-stderr",
                         daemon=True).start()
        log.debug("started the compile server (pid %d, %d workers)", proc.pid, self.workers)
        return proc

    def submit(self, job: dict) -> Future:
        """A Future of (CompiledBinary, seconds); its exception is CompileFailed,
        WorkerUnavailable or WorkerCrashed."""
        fut: Future = Future()
        with self._lock:
            proc = self._ensure_started()
            job_id = next(self._ids)
            self._pending[job_id] = (proc, fut)
            try:
                _write_frame(proc.stdin, (job_id, job))
            except (BrokenPipeError, OSError, ValueError) as exc:
                self._pending.pop(job_id, None)
                fut.set_exception(WorkerCrashed(f"the compile server is gone ({exc}){self._tail()}"))
        return fut

    def _tail(self) -> str:
        lines = [ln for ln in self._stderr_tail if ln.strip()]
        return ("; its last output:\n  " + "\n  ".join(lines[-10:])) if lines else ""

    def _read_results(self, proc: subprocess.Popen) -> None:
        while True:
            try:
                job_id, status, value, seconds = _read_frame(proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError):
                break
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
            else:
                fut.set_exception(CompileFailed(value))
        code = proc.wait()
        with self._lock:
            # Only this server's jobs: a restarted server's are not lost with it.
            mine = [i for i, (p, _) in self._pending.items() if p is proc]
            pending = [self._pending.pop(i)[1] for i in mine]
            if self._proc is proc:
                self._proc = None
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
        pool.start()


# -- the server: python -m lazytriton.compile_pool N -----------------------------------------

def _import_kernel(module: str, qualname: str, cache_key: str, gluon: bool = False):
    import importlib

    from triton.runtime.jit import JITFunction

    from .spec import is_gluon

    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise WorkerUnavailable(f"cannot import {module}.{qualname} in the worker: {type(exc).__name__}: {exc}")
    seen = 0
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn") and seen < 8:  # autotune/heuristics wrappers
        obj, seen = obj.fn, seen + 1
    if not isinstance(obj, JITFunction):
        raise WorkerUnavailable(f"{module}.{qualname} is not a Triton kernel in the worker")
    if is_gluon(obj) != gluon:
        raise WorkerUnavailable(f"{module}.{qualname} is {'not ' if gluon else ''}a Gluon kernel in the worker, unlike "
                                "the caller's")
    if obj.cache_key != cache_key:
        raise WorkerUnavailable(f"{module}.{qualname} differs from the caller's (source edited since it was imported?)")
    return obj


def _compile(job: dict):
    import triton

    from .cache import CompiledBinary
    from .compiler import ast_source

    if job["sys_path"] != sys.path:  # where the caller finds its kernels' modules
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.path[:] = [here] + [p for p in job["sys_path"] if not _shadows(p or ".", here)]
    env = job.get("env")
    if env is not None:  # this forked child serves this job alone: take the caller's Triton settings
        for k in [k for k in os.environ if _is_triton_setting(k) and k not in env]:
            del os.environ[k]
        os.environ.update(env)
    fn = _import_kernel(job["module"], job["qualname"], job["cache_key"], job.get("gluon", False))
    src = ast_source(fn, job["signature"], job["constexprs"], job["attrs"])  # Gluon kernels: GluonASTSource
    return CompiledBinary.from_triton(triton.compile(src, target=job["target"], options=job["options"]))


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return f"{type(exc).__name__}: {first[:300]}"


def _child(job: dict, wfd: int) -> None:
    """Runs in a forked child: compile, write one frame to wfd, exit."""
    code = 0
    t0 = time.perf_counter()
    if job.get("crash_for_test"):  # tests: a worker that dies as a compiler crash would kill it
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        try:
            result = ("ok", _compile(job))
        except WorkerUnavailable as exc:
            result = ("unavailable", str(exc))
        except Exception as exc:  # OutOfResources, PTXASError, CompilationError, ...
            result = ("error", _reason(exc))
        with os.fdopen(wfd, "wb") as out:
            _write_frame(out, (*result, time.perf_counter() - t0))
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _warm_up() -> None:
    """One tiny compile: the first compile in a process sets up the backend
    (ptxas version, libdevice, pass pipelines); forked children inherit it."""
    import tempfile

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import cache, compiler  # noqa: F401  (what the children use)

    @triton.jit
    def _lt_warm_up(x, n, B: tl.constexpr):
        o = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)

    # Into a throwaway cache: a hit in Triton's cache would skip the set-up.
    saved = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["TRITON_CACHE_DIR"] = d  # Triton's knobs read the environment at each use
        try:
            arch = int(os.environ.get("LAZYTRITON_DEFAULT_ARCH", "90"))
            triton.compile(ASTSource(_lt_warm_up, {"x": "*fp32", "n": "i32", "B": "constexpr"}, {(2,): 128}),
                           target=GPUTarget("cuda", arch, 32))
        finally:
            if saved is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = saved


def _serve(workers: int) -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the result stream
    try:
        _warm_up()
    except Exception as exc:  # the children will report real errors
        print(f"lazytriton compile server: warm-up failed: {_reason(exc)}", file=sys.stderr)
    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ, None)
    queue: collections.deque = collections.deque()
    running: dict[int, tuple[int, int, bytearray]] = {}  # read fd -> (job id, pid, data)
    stdin_open = True
    inbox = bytearray()

    def reply(job_id, status, value, seconds):
        _write_frame(stdout, (job_id, status, value, seconds))

    while stdin_open or queue or running:
        while queue and len(running) < workers:
            job_id, job = queue.popleft()
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(rfd)
                _child(job, wfd)
            os.close(wfd)
            running[rfd] = (job_id, pid, bytearray())
            sel.register(rfd, selectors.EVENT_READ, rfd)
        for key, _ in sel.select():
            if key.data is None:  # jobs from the caller (unbuffered: a read may hold several frames)
                chunk = os.read(stdin.fileno(), 1 << 20)
                if not chunk:  # the caller is gone: stop
                    stdin_open = False
                    sel.unregister(stdin)
                    for _, pid, _ in running.values():
                        os.kill(pid, signal.SIGKILL)
                    queue.clear()
                    continue
                inbox += chunk
                while len(inbox) >= _HEADER.size:
                    (n,) = _HEADER.unpack(bytes(inbox[:_HEADER.size]))
                    if len(inbox) < _HEADER.size + n:
                        break
                    queue.append(pickle.loads(bytes(inbox[_HEADER.size:_HEADER.size + n])))
                    del inbox[:_HEADER.size + n]
                continue
            rfd = key.data
            job_id, pid, data = running[rfd]
            chunk = os.read(rfd, 1 << 20)
            if chunk:
                data += chunk
                continue
            sel.unregister(rfd)
            os.close(rfd)
            del running[rfd]
            _, status = os.waitpid(pid, 0)
            if not stdin_open:
                continue
            try:
                (n,) = _HEADER.unpack(bytes(data[:_HEADER.size]))
                result = pickle.loads(bytes(data[_HEADER.size:_HEADER.size + n]))
            except Exception:
                if os.WIFSIGNALED(status):
                    how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
                else:
                    how = f"exited with code {os.waitstatus_to_exitcode(status)}"
                result = ("crashed", f"the compile worker process {how} (a crash in Triton's compiler?)", 0.0)
            reply(job_id, *result)


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
