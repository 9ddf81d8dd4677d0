"""The compile server: the process that compiles candidate configs for lazytriton.compile.pool, one
forked child per job.

The server imports Triton and compiles one tiny kernel (the first compile in a process pays for
backend set-up), then forks a child for each job as it comes: the caller (compile.schedule) decides
which job is sent when, so this process keeps no queue. When it forks it runs no other thread, so
forking it is safe, and it never touches CUDA (it runs with ``CUDA_VISIBLE_DEVICES=""``).

A child takes the caller's Triton state (``ir_text.apply_state``: its knobs and the environment they
read, as they were when the job was made), compiles the candidate's TTIR text with
``triton.compile`` (``compile.ir_text``: the caller ran the front end) and returns the
CompiledBinary (Triton's own cache is filled as a side effect, once Triton's installation hash is
known: `_unhashed`). It never imports user code. A job runs at the nice increment the caller gave it
(``job["nice"]``): made ahead of time, or short beside a longer one, it yields the cores.

Protocol: length-prefixed pickles. The caller writes ``(job id, pickled job)``; the server answers
``(job id, status, value, seconds)`` with status ``ok`` (value: the CompiledBinary), ``unavailable``
(compile it in the caller's process), ``error`` (Triton refused it: its whole message) or
``crashed`` (the child died). Once warm it sends ``(READY, "ready", {when}, 0.0)``, and ``(READY,
"hashed", {when}, 0.0)`` once it has Triton's installation hash. The server exits when its stdin
closes, killing its children.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import signal
import struct
import sys
import tempfile
import time
from typing import Any

from triton import knobs

# The server's command line (``python -c BOOTSTRAP N``). Its first act after importing Triton is
# to fork a child that computes Triton's installation hash (``triton_key()``: sha256 of the
# 400-500 MB libtriton.so, 0.5 s on an H200) into a pipe, read between jobs (a thread would
# contend with the warm-up for the GIL at every 1 MB chunk: 0.75 s on the device).
BOOTSTRAP = """\
import os, sys
from triton.runtime import cache
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        out = b"ok " + cache.triton_key().encode()
    except BaseException as exc:
        out = b"error " + repr(exc).encode()
    with os.fdopen(w, "wb") as f:
        f.write(out)
    os._exit(0)
os.close(w)
import importlib.util  # lazytriton's compile path without its package's __init__ (0.05 s of imports)
sys.modules["lazytriton"] = importlib.util.module_from_spec(importlib.util.find_spec("lazytriton"))
from lazytriton.compile.server import serve
serve(int(sys.argv[1]), r, pid)
"""

_HEADER = struct.Struct("<Q")
READY = -1  # the job id of the frame the server sends once, when it is ready to fork


class WorkerUnavailable(Exception):
    """The worker could not read this job: compile it in the caller's process."""


# -- framing: length-prefixed pickles ------------------------------------------------

def write_frame(stream, obj: Any) -> None:
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


def read_frame(stream) -> Any:
    (n,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    return pickle.loads(_read_exact(stream, n))


# -- what both sides agree on ----------------------------------------------------------

def shadows(entry: str, here: str) -> bool:
    """Whether sys.path entry `entry` holds another lazytriton than the one at `here`."""
    try:
        return os.path.isdir(os.path.join(entry, "lazytriton")) and not os.path.samefile(entry, here)
    except OSError:
        return False


# -- compiling one job (in a forked child) -----------------------------------------------

def _compile(job: dict):
    from .ir_text import DoesNotReadBack, TextSource, apply_state, compile_text

    try:
        if "unreadable" in job:
            raise ValueError(job["unreadable"])
        TextSource(job["ir"])
        state = job["ir"]["state"]
        job["ir"]["options"]
    except Exception as exc:  # a job this lazytriton cannot read: the caller compiles it itself
        raise WorkerUnavailable(f"unreadable job: {type(exc).__name__}: {exc}") from None
    apply_state(state)  # this forked child serves this job alone
    try:
        # The real key (this child computes it) where the cache reaches the binary (`_unhashed`).
        real = _hashed or knobs.cache.manager_class is not None or knobs.compilation.use_ir_loc
        with contextlib.nullcontext() if real else _unhashed():
            return compile_text(job["ir"], job["target"])
    except DoesNotReadBack as exc:  # the caller compiles the front end's own module
        raise WorkerUnavailable(str(exc)) from None


_hashed = False  # the server has Triton's installation hash (its children forked since inherit it)


@contextlib.contextmanager
def _unhashed():
    """A compile before Triton's installation hash is known (computed by BOOTSTRAP's child: 0.5 s on an
    H200): keyed by a stand-in, it reads and fills a Triton cache of its own, never the caller's. The
    binary is the real key's: the key names cache entries, but for a cache manager of the caller's (a
    remote one) and use_ir_loc (the IR file's path in the cache enters the line info): keyed for real."""
    from triton.runtime import cache as triton_cache

    real_key, env, knob = triton_cache.triton_key, os.environ.get("TRITON_CACHE_DIR"), dict(vars(knobs.cache))
    with tempfile.TemporaryDirectory() as d:
        knobs.cache.dir = d  # set in code: it wins over the caller's value, set in code or not
        triton_cache.triton_key = lambda: "lazytriton-compile-server-unhashed"
        try:
            yield
        finally:  # as it was (the warm-up: the server's own state)
            triton_cache.triton_key = real_key
            vars(knobs.cache).clear()
            vars(knobs.cache).update(knob)
            os.environ.pop("TRITON_CACHE_DIR", None)
            if env is not None:
                os.environ["TRITON_CACHE_DIR"] = env


def reason(exc: BaseException) -> str:
    """Triton's whole message (a CompilationError's source line, caret and
    cause; ptxas's log), after the exception's type."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _child(data: bytes, wfd: int) -> None:
    """Runs in a forked child: read the job, compile, write one frame to wfd, exit."""
    code = 0
    t0 = time.perf_counter()
    try:
        job = pickle.loads(data)
    except Exception as exc:  # unpickled here, not in the server: a bad job fails alone
        job = {"unreadable": f"{type(exc).__name__}: {exc}"}
    if job.get("crash_for_test"):  # tests: a worker that dies as a compiler crash would kill it
        os.kill(os.getpid(), signal.SIGKILL)
    if job.get("nice"):  # the caller's choice (compile.schedule): the cores go first to what a call waits for
        try:
            os.nice(int(job["nice"]))
        except OSError:
            pass
    try:
        try:
            result = ("ok", _compile(job))
        except WorkerUnavailable as exc:
            result = ("unavailable", str(exc))
        except Exception as exc:  # OutOfResources, PTXASError, CompilationError, ...
            result = ("error", reason(exc))
        with os.fdopen(wfd, "wb") as out:
            write_frame(out, (*result, time.perf_counter() - t0))
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _warm_up() -> None:
    """One tiny compile, as every job compiles: the first in a process sets up the back end
    (ptxas's version, LLVM's targets, the pass pipelines); forked children inherit it."""
    from .. import cache  # noqa: F401  (what the children use)
    from . import ir_text, targets

    try:
        target = targets.default_target()
    except ValueError:  # a warm-up only: the caller reports the bad setting
        target = targets.target_for(90)
    with _unhashed():  # a hit in Triton's cache would skip the set-up
        ir_text.compile_text(ir_text.empty_kernel_job(), target)


def _take_installation_hash(key_fd: int, pid: int | None) -> None:
    """Makes Triton's ``triton_key()`` return the hash the child `pid` computed (as Triton's own
    ``_compile_warmup_pool.py`` does), for this process and its children; computed here where the
    child failed (or its error raised)."""
    from triton.runtime import cache as triton_cache

    with os.fdopen(key_fd, "rb") as f:
        data = f.read()
    if pid is not None:
        os.waitpid(pid, 0)
    status, _, value = data.partition(b" ")
    if status == b"ok" and value:
        key = value.decode()
        triton_cache.triton_key = lambda: key
    else:
        print(f"lazytriton compile server: Triton's installation hash failed in its child "
              f"({value.decode(errors='replace') or 'no answer'}): computing it here", file=sys.stderr)
        triton_cache.triton_key()


def serve(workers: int, key_fd: int, key_pid: int) -> None:
    """The server's loop; `key_fd` reads Triton's installation hash from the child BOOTSTRAP
    forked to compute it (`key_pid`). `workers`: the caller's bound on jobs at once."""
    global _hashed
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the result stream
    t0 = time.perf_counter()
    try:
        _warm_up()
    except Exception as exc:  # the children will report real errors
        print(f"lazytriton compile server: warm-up failed: {reason(exc)}", file=sys.stderr)
    # Ready before Triton's installation hash (`_unhashed`). When, on the caller's clock
    # (perf_counter is CLOCK_MONOTONIC): where a cold first call's wait for the server goes.
    write_frame(stdout, (READY, "ready", {"imports_done_at": t0, "ready_at": time.perf_counter()}, 0.0))
    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ, None)
    sel.register(key_fd, selectors.EVENT_READ, "hash")
    running: dict[int, tuple[int, int, bytearray]] = {}  # read fd -> (job id, pid, data)
    stdin_open = True
    inbox = bytearray()
    while stdin_open or running:
        for ready, _ in sel.select():
            if ready.data == "hash":  # BOOTSTRAP's child is done: the children forked from now on have it
                sel.unregister(key_fd)
                try:
                    _take_installation_hash(key_fd, key_pid)
                    _hashed = True
                except Exception as exc:  # the children keep to private Triton caches (`_unhashed`)
                    print(f"lazytriton compile server: Triton's installation hash: {reason(exc)}", file=sys.stderr)
                write_frame(stdout, (READY, "hashed", {"hashed_at": time.perf_counter()}, 0.0))
                continue
            if ready.data is None:  # jobs from the caller (unbuffered: a read may hold several frames)
                chunk = os.read(stdin.fileno(), 1 << 20)
                if not chunk:  # the caller is gone: stop
                    stdin_open = False
                    sel.unregister(stdin)
                    for _, pid, _ in running.values():
                        os.kill(pid, signal.SIGKILL)
                    continue
                inbox += chunk
                while len(inbox) >= _HEADER.size:
                    (n,) = _HEADER.unpack(bytes(inbox[:_HEADER.size]))
                    if len(inbox) < _HEADER.size + n:
                        break
                    job_id, data = pickle.loads(bytes(inbox[_HEADER.size:_HEADER.size + n]))
                    del inbox[:_HEADER.size + n]
                    rfd, wfd = os.pipe()
                    pid = os.fork()
                    if pid == 0:
                        os.close(rfd)
                        _child(data, wfd)
                    os.close(wfd)
                    running[rfd] = (job_id, pid, bytearray())
                    sel.register(rfd, selectors.EVENT_READ, rfd)
                continue
            rfd = ready.data
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
            write_frame(stdout, (job_id, *result))
