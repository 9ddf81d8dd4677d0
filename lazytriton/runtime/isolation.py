"""A candidate's first launch, isolated: a binary never launched before runs once in a
helper process with a CUDA context of its own, on copies of the call's buffers, before
the caller launches it. A candidate that faults (an illegal address, say) kills the
helper's context, not the caller's; one that hangs past the bound is abandoned (the
helper is killed). Either is marked failed with its reason and persisted as failed per
binary (lazytriton.cache.verdicts), so no later process launches it again; one that
ran clean is persisted as proven, so the isolation costs once per binary.

The helper (runtime/isolation_helper.py) is spawned (a fresh interpreter, never a fork
of this CUDA-initialised process) and imports lazytriton's C++ core alone: no torch, no
JAX. It stays for IDLE_S seconds after its last job, then exits, giving its context's
device memory back; a fault ends it at once, and the next job starts another.

How each buffer reaches it: through CUDA IPC where the allocation allows it
(cuIpcGetMemHandle on the allocation's base, plus the buffer's offset in it: memory
from cudaMalloc / cuMemAlloc, which torch's and CuPy's default allocators use); else
a copy of it, made in one block of this process's own cuMemAlloc memory, goes by IPC
(pools of stream-ordered allocation, virtual-memory-managed memory: XLA's allocators);
else (no room on the device for the copies, no IPC) its bytes are staged through host
memory (a file in /dev/shm the helper maps). Either way the helper copies the bytes
into memory of its own and closes the caller's before anything launches: the caller's
memory is never written, not even by a wild store.

`LAZYTRITON_ISOLATION=0` turns it off; `LAZYTRITON_ISOLATION_TIMEOUT` bounds a
candidate's one launch (seconds, default 10).
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .. import _core
from ..cache import verdicts
from ..settings import isolation_timeout
from . import fixed

log = logging.getLogger("lazytriton.runtime.isolation")

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "isolation_helper.py")
IDLE_S = 10.0  # a helper with no job for this long exits (its context's memory goes back)
FIRST_JOB_S = 120.0  # the same before its first job: it starts beside the compiles
START_S = 60.0  # a helper's start: the interpreter, the core, the device's context
SETUP_S = 300.0  # one job's copies and module load, before the launch the bound applies to

_HEADER = struct.Struct("<I")
_stats = {"helpers": 0, "jobs": 0, "ok": 0, "faults": 0, "hangs": 0, "unchecked": 0, "ipc_buffers": 0,
          "copied_buffers": 0, "staged_buffers": 0, "isolated_s": 0.0, "start_s": 0.0}


def stats() -> dict:
    """What isolation did in this process: helpers started, jobs, their verdicts, buffers sent
    through IPC (ipc_buffers), as exportable device copies (copied_buffers) or staged through
    host memory (staged_buffers), seconds spent in jobs (waiting for a helper's start included)
    and the last helper's start (spawn to ready: its interpreter, the core, its CUDA context), for tests
    and benchmarks."""
    return dict(_stats)


@dataclass
class Verdict:
    status: str  # "ok", "fault", "hang" or "unchecked" (could not be tried: the caller's trial decides)
    reason: str = ""
    via: tuple = ()  # per buffer: "ipc", "copy" (a device copy by IPC), "host" (staged) or "empty"
    seconds: float = 0.0


class _HelperGone(Exception):
    """The helper's pipe closed: it exited (idle, a fault) or died."""


class Helper:
    """One helper process on one device."""

    def __init__(self, device: int):
        self.device = device
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-I", HELPER, _core.__file__, str(device), str(IDLE_S),
                                      str(FIRST_JOB_S)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     close_fds=True, start_new_session=True)
        self.started_at = self.last_used = time.monotonic()
        self.ready = False
        self.jobs = 0
        self.pid = self.proc.pid
        _stats["helpers"] += 1

    def alive(self) -> bool:
        # A helper about to leave on its own (idle) is taken for gone: a job sent now could meet its exit.
        idle = time.monotonic() - self.last_used
        return self.proc.poll() is None and idle < (IDLE_S if self.jobs else FIRST_JOB_S) - 2.0

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout, self._stderr):
            with contextlib.suppress(OSError):
                f.close()

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            return self._stderr.read()[-2000:].decode(errors="replace").strip()
        return ""

    def send(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(_HEADER.pack(len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise _HelperGone(str(exc)) from None

    def receive(self, timeout: float) -> Optional[dict]:
        """The next frame, or None when `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()

        def read(n: int) -> Optional[bytes]:
            chunks = []
            while n:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    return None
                chunk = os.read(fd, n)
                if not chunk:
                    raise _HelperGone("its output closed")
                chunks.append(chunk)
                n -= len(chunk)
            return b"".join(chunks)

        head = read(_HEADER.size)
        if head is None:
            return None
        body = read(_HEADER.unpack(head)[0])  # a frame once begun comes whole
        return None if body is None else pickle.loads(body)

    def wait_ready(self) -> None:
        if self.ready:
            return
        msg = self.receive(max(0.0, START_S - (time.monotonic() - self.started_at)))
        if msg is None:
            raise _HelperGone(f"it did not start within {START_S:.0f} s")
        if msg.get("status") != "ready":
            raise _HelperGone(msg.get("reason") or f"it answered {msg!r}")
        self.ready = True
        _stats["start_s"] = msg.get("at", time.monotonic()) - self.started_at  # CLOCK_MONOTONIC: the host's


_helpers: dict[int, Helper] = {}
_lock = threading.Lock()  # one job at a time per process
# device -> (until when, why): a helper that could not start (no memory for its context, say) is not
# started again for RETRY_S seconds; jobs meanwhile are answered "unchecked" at once.
_unavailable: dict[int, tuple[float, str]] = {}
RETRY_S = 30.0


def prestart(device: int) -> None:
    """Starts the device's helper if none is running, without waiting for it: its start overlaps
    the candidates' compiles."""
    with _lock:
        _helper(device)


def _helper(device: int) -> Helper:
    h = _helpers.get(device)
    if h is not None and not h.ready:
        return h  # still starting, or it has said why it could not: wait_ready reads it
    if h is None or not h.alive():
        if h is not None:
            h.kill()
        h = _helpers[device] = Helper(device)
    return h


def _drop(device: int) -> None:
    h = _helpers.pop(device, None)
    if h is not None:
        h.kill()


def helper_pids() -> list[int]:
    """The process ids of the helpers running now (for benchmarks: their memory)."""
    return [h.pid for h in _helpers.values() if h.proc.poll() is None]


@atexit.register
def shutdown() -> None:
    """Ends every helper (each would end on its own after IDLE_S anyway)."""
    for device in list(_helpers):
        _drop(device)


class _Staging:
    """The bytes of buffers that cannot be exported, in one file the helper maps."""

    def __init__(self):
        self.path: Optional[str] = None
        self.parts: list[tuple[int, int]] = []  # (address, nbytes)
        self.size = 0

    def add(self, address: int, nbytes: int) -> int:
        at = self.size
        self.parts.append((address, nbytes))
        self.size += nbytes
        return at

    def write(self, stream: int) -> Optional[str]:
        if not self.parts:
            return None
        where = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, self.path = tempfile.mkstemp(prefix="lazytriton-isolation-", dir=where)
        try:
            os.ftruncate(fd, self.size)
            if self.size:
                with mmap.mmap(fd, self.size) as mm:
                    view, at = memoryview(mm), 0
                    for address, nbytes in self.parts:
                        _core.copy_to_host(stream, address, nbytes, view[at:at + nbytes])
                        at += nbytes
                    view.release()
        finally:
            os.close(fd)
        return self.path

    def remove(self) -> None:
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def buffer_sources(buffers: list[tuple[int, int]], stream: int, staging: _Staging) -> tuple[list, tuple, Any]:
    """Where the helper takes each buffer (address, nbytes) from: ("ipc", handle, offset, nbytes,
    address) where its allocation can be exported, or where an exportable device copy of it could
    be made (_core.DeviceCopies, returned: it must live until the helper has copied), else
    ("host", at, nbytes, address) in the staging file (empty ones: their address alone); and per
    buffer the way chosen ("ipc", "copy", "host" or "empty")."""
    out: list = [None] * len(buffers)
    via: list = [None] * len(buffers)
    unexported = []
    for i, (address, nbytes) in enumerate(buffers):
        if not nbytes:  # an empty buffer: its address alone (nothing to read; XLA's may be no allocation)
            out[i], via[i] = ("host", staging.add(address, 0), 0, address), "empty"
            continue
        handle, offset, why = _core.ipc_export(address)
        if handle is not None:
            out[i], via[i] = ("ipc", handle, offset, nbytes, address), "ipc"
        else:
            log.debug("buffer at 0x%x: not exportable (%s)", address, why)
            unexported.append(i)
    copies = None
    if unexported:
        try:
            copies = _core.DeviceCopies(stream, [buffers[i] for i in unexported])
            for i, at in zip(unexported, copies.addresses):
                handle, offset, why = _core.ipc_export(at)
                if handle is None:
                    raise _core.RuntimeFailure(f"its device copy cannot be exported either ({why})")
                out[i], via[i] = ("ipc", handle, offset, buffers[i][1], buffers[i][0]), "copy"
        except _core.RuntimeFailure as exc:
            log.debug("staging %d buffer(s) through host memory: %s", len(unexported), exc)
            copies = None
            for i in unexported:
                address, nbytes = buffers[i]
                out[i], via[i] = ("host", staging.add(address, nbytes), nbytes, address), "host"
    return out, tuple(via), copies


def run_job(device: int, stream: int, job: dict, buffers: list[tuple[int, int]], what: str) -> Verdict:
    """Runs one candidate's first launch in the device's helper. `job`: cubin, metadata, is_param,
    grid, sources; `buffers`: the call's (address, nbytes), in the sources' buffer order, their
    contents final (the caller synchronized its stream). `what` names the candidate in logs."""
    t0 = time.perf_counter()
    staging = _Staging()
    with _lock:
        try:
            sources, via, copies = buffer_sources(buffers, stream, staging)
            job = {**job, "buffers": sources, "staged": staging.write(stream)}
            _stats["jobs"] += 1
            _stats["ipc_buffers"] += via.count("ipc")
            _stats["copied_buffers"] += via.count("copy")
            _stats["staged_buffers"] += via.count("host")
            verdict = _ask(device, job, what)
        finally:
            copies = None  # freed once the helper has answered (it copied them before launching)
            staging.remove()
    verdict.via, verdict.seconds = via, time.perf_counter() - t0
    _stats["isolated_s"] += verdict.seconds
    _stats[{"ok": "ok", "fault": "faults", "hang": "hangs"}.get(verdict.status, "unchecked")] += 1
    return verdict


def _ask(device: int, job: dict, what: str) -> Verdict:
    until, why = _unavailable.get(device, (0.0, ""))
    if time.monotonic() < until:
        return Verdict("unchecked", why)
    for attempt in (1, 2):  # a helper that left between two jobs is started again, once
        h = _helper(device)
        launched = False
        try:
            h.wait_ready()
            h.send(job)
            h.jobs += 1
            msg = h.receive(SETUP_S)
            if msg is None:
                _drop(device)
                return Verdict("unchecked", f"the helper did not set the launch up within {SETUP_S:.0f} s")
            if msg["status"] == "launched":
                launched = True
                bound = isolation_timeout()
                msg = h.receive(bound)
                if msg is None:  # still running: abandoned with its process
                    _drop(device)
                    return Verdict("hang", f"did not finish within {bound:g} s (LAZYTRITON_ISOLATION_TIMEOUT)")
            h.last_used = time.monotonic()
        except _HelperGone as exc:
            code = h.proc.poll()
            tail = h.stderr_tail()
            _drop(device)
            if launched:  # it died running the candidate: the candidate's doing
                return Verdict("fault", f"the helper process died running it (exit status {code}"
                               f"{': ' + tail.splitlines()[-1] if tail else ''})")
            if attempt == 1 and h.ready:
                continue
            why = f"the isolation helper is unavailable ({exc}{'; ' + tail.splitlines()[-1] if tail else ''})"
            _unavailable[device] = (time.monotonic() + RETRY_S, why)
            return Verdict("unchecked", why)
        if msg["status"] == "fault":
            _drop(device)  # its context is dead: it has exited
            return Verdict("fault", msg.get("error", "an unknown error"))
        if msg["status"] == "ok":
            return Verdict("ok")
        return Verdict("unchecked", msg.get("reason", f"the helper answered {msg!r}"))
    raise AssertionError("unreachable")


@dataclass
class Isolation:
    """A resolution's isolation: which of its candidates are proven (per binary), running the
    others' first launch in the helper, persisting each verdict."""
    cache: Any
    kernel_name: str
    device: int
    device_name: str
    compile_key: Callable[[Any], str]  # a candidate's key in the cache

    def proven(self, c) -> bool:
        doc = verdicts.lookup(self.cache, verdicts.binary_id(c.binary.cubin))
        return doc is not None and doc["verdict"] == verdicts.OK

    def first_launch(self, c, names: list, values: tuple, arrays: dict, table: list, grid: Any,
                     stream: int, prepare: Callable[[], None]) -> bool:
        """Whether the candidate may launch here: proven before, or it ran clean (or could not be
        tried) in the helper just now. `prepare` queues on `stream` what the caller's trial would
        see (the snapshot restored, reset_to_zero buffers zeroed); the buffers' bytes are taken
        after it has run. A candidate that faulted or hung gets its error and is persisted failed."""
        if self.proven(c):
            return True
        where = f"kernel {self.kernel_name}"
        binary = c.binary
        # The parameter sources as the caller's trial reads them (runtime.fixed), on buffer indices.
        addresses = {n: arrays[n][0] for n in names if n in arrays}
        entry, _ = fixed.entry(where, _core.Kernel(binary.cubin, binary.metadata), c.bound.is_param(names),
                               {}, grid, table, names, values, addresses)
        sizes = [(arrays[n][0], _nbytes(*arrays[n])) for n in addresses]
        prepare()
        _core.synchronize(stream)  # the bytes the helper copies are those the trial would read
        job = {"cubin": binary.cubin, "metadata": binary.metadata, "is_param": list(entry.is_param),
               "grid": entry.grid, "sources": list(entry.sources)}
        v = run_job(self.device, stream, job, sizes, c.label)
        c.extra["isolated"] = v.status
        c.extra["isolated_s"] = v.seconds
        if v.status == "unchecked":
            log.warning("%s: %s: its first launch could not be isolated (%s); trying it here", where, c.label,
                        v.reason)
            return True
        bid = verdicts.binary_id(binary.cubin)
        doc = verdicts.record(self.cache, bid, self.compile_key(c), self.kernel_name, c.label,
                              v.status, v.reason, self.device_name)
        if v.status == "ok":
            log.info("%s: %s ran clean in its isolated first launch (%.3f s; buffers by %s)", where, c.label,
                     v.seconds, ", ".join(v.via) or "none")
            return True
        c.error = failed_error(doc)
        log.warning("%s: %s %s", where, c.label, c.error)
        return False


def failed_error(doc: dict) -> str:
    """A candidate's error for a failed verdict: what it did, and that it is never launched again."""
    return (f"{verdicts.in_words(doc)}; persisted as failed for its binary, so no process launches it "
            "again (LAZYTRITON_RETUNE=1 tries it again, isolated); this process's CUDA context is unaffected")


def _nbytes(address: int, nbytes: Optional[int]) -> int:
    """A buffer's bytes to copy: its own, or up to the end of its allocation when unknown."""
    if nbytes is not None:
        return nbytes
    try:
        return _core.allocation_extent(address)
    except _core.RuntimeFailure:
        return 0
