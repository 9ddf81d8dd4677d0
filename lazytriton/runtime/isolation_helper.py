"""The isolation helper process (lazytriton.runtime.isolation starts it; nothing imports it).

    python -I isolation_helper.py CORE DEVICE IDLE_S FIRST_JOB_S

It loads lazytriton's C++ core (`CORE`: the path of `lazytriton._core`) and nothing else of
lazytriton, torch or JAX, makes DEVICE's primary context current (a context of its own: this
is another process), says {"status": "ready", "pid", "at": its time.monotonic()} (or
{"status": "unavailable", "reason"}) and answers jobs, one at a time, each a frame on stdin:

    {"cubin", "metadata", "is_param", "grid", "sources", "buffers", "staged"}

`sources` are the kernel's parameter sources (lazytriton.runtime.fixed.param_sources: buffer
indices, descriptors on buffers, scalars' bits); `buffers` say where each call buffer's bytes
come from: ("ipc", handle, offset, nbytes, address) or ("host", at, nbytes, address), `at`
an offset into the file `staged` names. The helper copies every buffer into memory of its own
(the caller's memory is closed again before anything launches), loads the binary, answers
{"status": "launched"}, launches it once through the one launch path (`_core.launch_and_wait`:
launch_fixed -> Kernel::launch) and waits, then answers one of

    {"status": "ok"}                      ran clean
    {"status": "fault", "error": NAME}    the driver's error (CUDA_ERROR_ILLEGAL_ADDRESS, ...)
    {"status": "unchecked", "reason": R}  could not try it (no memory for the copies, a binary
                                          its context refuses to load): the caller decides

A fault leaves this process's context dead: the helper exits after answering, and the
caller starts another for its next job. A hang is the caller's to bound: it kills the
helper. No job for IDLE_S seconds after a job (FIRST_JOB_S before the first: it is started
beside the compiles), or stdin closed: the helper exits (its context's device memory goes
with it).

Frames: a 4-byte little-endian length, then a pickle (the caller and this process are the
same installation and the same user; lazytriton.compile.server frames its jobs alike).
"""
import importlib.util
import mmap
import os
import pickle
import select
import struct
import sys
import time

_HEADER = struct.Struct("<I")


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int):
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return pickle.loads(_read_exact(fd, n))


def write_frame(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def load_core(path: str):
    """lazytriton._core from its file, without importing the lazytriton package (and what it imports)."""
    spec = importlib.util.spec_from_file_location("lazytriton._core", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources(job: dict, staged):
    out = []
    for b in job["buffers"]:
        if b[0] == "ipc":
            out.append(b)
        else:  # ("host", at, nbytes, address): a slice of the staged file
            _, at, nbytes, address = b
            out.append(("host", staged[at:at + nbytes], nbytes, address))
    return out


def run(core, job: dict, out: int) -> dict:
    staged = None
    if job.get("staged"):  # mapped, not read: the copies read it straight from the page cache
        with open(job["staged"], "rb") as f:
            size = os.fstat(f.fileno()).st_size
            staged = memoryview(mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)) if size else memoryview(b"")
    try:
        buffers = core.TrialBuffers(0, _sources(job, staged))
    except Exception as exc:
        return {"status": "unchecked", "reason": f"copying the call's buffers failed: {exc}"}
    finally:
        staged = None  # unmapped
    try:
        kernel = core.Kernel(job["cubin"], job["metadata"])
        kernel.load()
        entry = core.Entry(kernel, job["is_param"], None, tuple(job["grid"]), job["sources"])
    except Exception as exc:
        return {"status": "unchecked", "reason": f"loading it failed: {exc}"}
    write_frame(out, {"status": "launched"})
    try:
        error = core.launch_and_wait(entry, 0, buffers.addresses)
    except Exception as exc:  # before the launch (scratch, a descriptor): the caller meets it too
        return {"status": "unchecked", "reason": str(exc)}
    if error:
        return {"status": "fault", "error": error}
    return {"status": "ok", "device_bytes": buffers.device_bytes}


def main() -> None:
    core_path, device, idle_s, first_job_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    inp, out = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout = sys.stderr  # stray prints must not corrupt the frames
    try:
        core = load_core(core_path)
        core.use_device(device)
    except Exception as exc:
        write_frame(out, {"status": "unavailable", "reason": f"{type(exc).__name__}: {exc}"})
        return
    write_frame(out, {"status": "ready", "pid": os.getpid(), "at": time.monotonic()})
    wait = first_job_s
    while True:
        ready, _, _ = select.select([inp], [], [], wait)
        wait = idle_s
        if not ready:
            return  # idle: the context's memory goes back to the device
        try:
            job = read_frame(inp)
        except EOFError:
            return
        answer = run(core, job, out)
        write_frame(out, answer)
        if answer["status"] == "fault":
            os._exit(0)  # a dead context: nothing of it may be touched again, not even to free it


if __name__ == "__main__":
    main()
