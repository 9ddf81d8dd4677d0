"""The compile server: the process that compiles candidate configs for
lazytriton.compile.pool, one forked child per job.

The server imports Triton, computes Triton's installation hash and compiles
one tiny kernel (the first compile in a process pays for backend set-up), then
forks a child for each job as it comes: the caller (compile.schedule) decides
which job is sent when, so this process keeps no queue. When it forks it runs
no other thread, so forking it is safe, and it never touches CUDA (it runs
with ``CUDA_VISIBLE_DEVICES=""``).

A child takes the caller's Triton state (``ir_text.apply_state``: its knobs
and the environment they read, as they were when the job was made), compiles
the candidate's TTIR text with ``triton.compile`` (``compile.ir_text``: the
caller ran the front end) and returns the CompiledBinary (Triton's own cache
is filled as a side effect). It never imports user code. A job runs at the
nice increment the caller gave it (``job["nice"]``): made ahead of time, or
short beside a longer one, it yields the cores.

Protocol: length-prefixed pickles. The caller writes ``(job id, pickled
job)``; the server answers ``(job id, status, value, seconds)`` with status
``ok`` (value: the CompiledBinary), ``unavailable`` (compile it in the
caller's process), ``error`` (Triton refused it: its whole message) or
``crashed`` (the child died). Once warm it sends ``(READY, "ready", {when},
0.0)``. The server exits when its stdin closes, killing its children.
"""
from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import sys
import time
from typing import Any

# The server's command line (``python -c BOOTSTRAP N``). Its first act after
# importing Triton is to fork a child that computes Triton's installation hash
# (``triton_key()``: sha256 of the 400-500 MB libtriton.so, about 0.3 s alone) and
# writes it to a pipe, so that the hash overlaps importing lazytriton and the
# warm-up compile instead of following them. A thread would contend with them for
# the GIL at every 1 MB chunk: on the device that stretched the hash to 0.75 s.
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
        return compile_text(job["ir"], job["target"])
    except DoesNotReadBack as exc:  # the caller compiles the front end's own module
        raise WorkerUnavailable(str(exc)) from None


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
    """One tiny compile: the first compile in a process sets up the backend
    (ptxas version, libdevice, pass pipelines); forked children inherit it."""
    import tempfile

    import triton
    import triton.language as tl
    from triton.compiler import ASTSource
    from triton.runtime import cache as triton_cache

    from .. import cache  # noqa: F401  (what the children use)
    from . import ir_text, targets  # noqa: F401

    @triton.jit
    def _lt_warm_up(x, n, B: tl.constexpr):
        o = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)

    # Into a throwaway cache (a hit in Triton's cache would skip the set-up), so
    # its cache key does not matter: it is made with a stand-in for Triton's
    # installation hash while the real one is computed in BOOTSTRAP's child.
    real_key = triton_cache.triton_key
    saved = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["TRITON_CACHE_DIR"] = d  # Triton's knobs read the environment at each use
        triton_cache.triton_key = lambda: "lazytriton-compile-server-warm-up"
        try:
            try:
                target = targets.default_target()
            except ValueError:  # a warm-up only: the caller reports the bad setting
                target = targets.target_for(90)
            triton.compile(ASTSource(_lt_warm_up, {"x": "*fp32", "n": "i32", "B": "constexpr"}, {(2,): 128}),
                           target=target)
        finally:
            triton_cache.triton_key = real_key
            if saved is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = saved


def _take_installation_hash(key_fd: int, pid: int | None) -> None:
    """Makes Triton's ``triton_key()`` return the hash the child `pid` computed, as Triton's
    own compile warm-up pool does in its workers (``triton/_compile_warmup_pool.py``),
    so that this process and its children never compute it again. Where the child
    failed, it is computed here (or its error raised)."""
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
    """The server's loop; `key_fd` reads Triton's installation hash from the
    child BOOTSTRAP forked to compute it (`key_pid`). `workers` is the caller's
    bound on jobs at once (compile.schedule keeps to it)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must not corrupt the result stream
    t0 = time.perf_counter()
    try:
        _warm_up()
    except Exception as exc:  # the children will report real errors
        print(f"lazytriton compile server: warm-up failed: {reason(exc)}", file=sys.stderr)
    t1 = time.perf_counter()
    try:
        _take_installation_hash(key_fd, key_pid)
    except Exception as exc:  # each child then computes it, or reports its error
        print(f"lazytriton compile server: Triton's installation hash: {reason(exc)}", file=sys.stderr)
    waited_s = time.perf_counter() - t1
    # When it became ready, on the caller's clock (perf_counter is CLOCK_MONOTONIC): where a
    # cold first call's wait for the server goes.
    write_frame(stdout, (READY, "ready", {"imports_done_at": t0, "ready_at": time.perf_counter(),
                                          "waited_for_hash_s": waited_s}, 0.0))
    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ, None)
    running: dict[int, tuple[int, int, bytearray]] = {}  # read fd -> (job id, pid, data)
    stdin_open = True
    inbox = bytearray()
    while stdin_open or running:
        for ready, _ in sel.select():
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
