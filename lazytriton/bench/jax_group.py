"""The JAX processes of the harness. XLA reads XLA_FLAGS once per process, so
the runner starts one process with command buffers on (every custom call
captured into a CUDA graph) and one with them off, per repetition.

- chain: per-kernel time of a jitted chain of 32 tiny kernels: lazytriton.jax
  (command buffers on, on with a donated input, off), jax-triton when
  importable, XLA's own add kept unfused, and the floors: a bare XLA FFI
  handler (ffi_floor.cc: no launch, or one plain cuLaunchKernel of the same
  cubin), CUDA-graph replay of the same cubin and a raw cuLaunchKernel loop.
- jax_throughput (command buffers on): the tuned workloads through
  lazytriton.jax beside XLA's own op and jax-triton.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

from .common import guarded, why
from .timing import interleaved
from .workloads import throughput_workloads

CB_ON = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
CB_OFF = "--xla_gpu_enable_command_buffer="
N, CHAIN = 1024, 32
CHAIN_TITLE = "Per-kernel time in a jitted chain of 32 tiny kernels (JAX)"
THROUGHPUT_TITLE = "Kernel time of tuned workloads from JAX"


def chain_rows(command_buffers: bool) -> list[tuple[str, str, str]]:
    """(row, kind, what) of the chain section in a process with command
    buffers on or off; `what` picks the implementation in _chain_fn."""
    cb = "command buffers on" if command_buffers else "command buffers off"
    rows = [(f"lazytriton.jax, {cb}", "lazytriton", "lazytriton")]
    if command_buffers:
        rows.append((f"lazytriton.jax, {cb}, donated input", "lazytriton", "lazytriton-donated"))
    rows += [(f"jax-triton, {cb}", "other", "jax-triton"),
             (f"XLA's own add (unfused), {cb}", "other", "xla")]
    if command_buffers:
        rows += [(f"XLA's own add (unfused), {cb}, donated input", "other", "xla-donated"),
                 (f"floor: bare XLA FFI handler + cuLaunchKernel, {cb}", "floor", "ffi-raw"),
                 (f"floor: bare XLA FFI handler + cuLaunchKernel, {cb}, donated input", "floor", "ffi-raw-donated"),
                 ("floor: CUDA graph replay of the same cubin", "floor", "graph"),
                 ("floor: raw cuLaunchKernel loop, same cubin", "floor", "raw")]
    else:
        rows += [(f"floor: bare XLA FFI handler, no launch, {cb}", "floor", "ffi-noop"),
                 (f"floor: bare XLA FFI handler + cuLaunchKernel, {cb}", "floor", "ffi-raw")]
    return rows


def throughput_rows(suite: str) -> list[str]:
    return [f"{w.name}: {s}" for w in throughput_workloads(suite) if w.jax is not None
            for s in ("lazytriton.jax triton_call", "XLA's op", *(["jax-triton triton_call"] if w.jax_triton else []))]


# -- pieces --------------------------------------------------------------------------------


def _add_one_on_cupy():
    """The add-one kernel compiled and loaded by lazytriton on a CuPy array: (its winner as a
    fixed-layout launch and that launch's buffers (runtime.fixed), the array, a stream), or
    None without CuPy."""
    try:
        import cupy
    except ImportError:
        return None
    import lazytriton
    from lazytriton.runtime import fixed

    from .kernels import add_one

    x = cupy.zeros(N, cupy.float32)
    k = lazytriton.kernel(add_one)
    s = cupy.cuda.Stream(non_blocking=True)
    k[(1,)](x, N, x, BLOCK=1024, stream=s.ptr)
    s.synchronize()
    assert float(x[0]) == 1.0, "add_one gave a wrong result"
    entry, buffers = fixed.entry_on(k.resolve(x, N, x, grid=(1,), stream=s.ptr, BLOCK=1024), (x, N, x))
    return entry, buffers, x, s


def _ffi_floor_module(kern):
    """ffi_floor.cc built against jaxlib's headers (cached per source), its raw
    handler set to launch `kern` (None: only the no-launch handler works)."""
    import jax

    from lazytriton.runtime import native

    src = Path(__file__).with_name("ffi_floor.cc").read_text()
    tag = "-bench" + hashlib.sha256(src.encode()).hexdigest()[:8]
    mod = native.load_module("lt_bench_ffi", lambda: src, "the FFI floor handlers",
                              extra_flags=(f"-I{jax.ffi.include_dir()}",), tag=tag)
    if kern is not None:
        mod.set_cubin(kern.cubin, kern.name, 32 * kern.metadata["num_warps"], N)
    for kind, capsule in mod.handlers().items():
        jax.ffi.register_ffi_target(f"lt_bench_{kind}", capsule, platform="CUDA")
    return mod


def _chain_fn(what: str):
    """The jitted 32-kernel chain for `what`, and a counter of handler runs (or None)."""
    import jax
    import jax.numpy as jnp
    import triton

    from .kernels import add_one

    donate = (0,) if what.endswith("donated") else ()
    base = what.removesuffix("-donated")
    runs = None
    if base in ("lazytriton", "jax-triton"):
        if base == "jax-triton":
            import jax_triton

            call = jax_triton.triton_call
        else:
            from lazytriton.jax import handler_stats

            from .workloads import lazy_triton_call as call

            runs = lambda: handler_stats()["executes"]  # noqa: E731

        def one(x):
            return call(x, N, kernel=add_one, out_shape=x, grid=lambda m: (triton.cdiv(N, m["BLOCK"]),), BLOCK=1024)
    elif base == "xla":
        def one(x):  # kept apart: what JAX and the graph cost per op
            return jax.lax.optimization_barrier(x + 1.0)
    else:  # ffi-raw, ffi-noop
        target = "lt_bench_" + base.split("-")[1]

        def one(x):
            return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    def chain(x):
        for _ in range(CHAIN):
            x = one(x)
        return x

    return jax.jit(chain, donate_argnums=donate), runs, jnp


# -- sections ------------------------------------------------------------------------------


def run(progress, suite: str, command_buffers: bool) -> dict:
    import os

    cb = "on" if command_buffers else "off"
    flags = os.environ.get("XLA_FLAGS", "")
    want = CB_ON if command_buffers else CB_OFF
    if not set(want.split()) <= set(flags.split()):  # CB_OFF's flag is a prefix of CB_ON's: compare whole flags
        raise RuntimeError(f"the JAX command-buffers-{cb} process needs XLA_FLAGS={want!r} (got {flags!r})")
    sections = {"chain": guarded("chain", CHAIN_TITLE, lambda: _chain_section(progress, suite, command_buffers))}
    if command_buffers:
        sections["jax_throughput"] = guarded("jax_throughput", THROUGHPUT_TITLE,
                                             lambda: _throughput_section(progress, suite))
    return {"sections": sections}


def _chain_section(progress, suite: str, command_buffers: bool) -> dict:
    full = suite == "full"
    notes, paths, meta, checks = [], {}, {}, {}
    floor_kernel, floors = None, {}
    try:
        floor_kernel = _add_one_on_cupy()
        if floor_kernel is None:
            notes.append("CuPy not importable: no graph-replay, raw-loop or FFI + cuLaunchKernel floor rows")
    except Exception as exc:  # noqa: BLE001
        notes.append(f"the add-one cubin for the floors not built ({why(exc)}): no graph-replay, raw-loop or "
                     "FFI + cuLaunchKernel floor rows")
    for what in ("graph", "raw") if floor_kernel else ():
        try:  # the graph is captured before JAX runs anything: no other thread touches CUDA meanwhile
            floors[what] = _cubin_floor(what, *floor_kernel)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"floor {what}: not measured ({why(exc)})")
    ffi = None
    try:
        ffi = _ffi_floor_module(floor_kernel[0].kernel if floor_kernel else None)
    except Exception as exc:  # noqa: BLE001  (no compiler, headers): the rows are absent, said why
        notes.append(f"FFI floor handlers not built ({why(exc)}): no FFI floor rows")
    import numpy as np

    x0 = np.random.default_rng(0).integers(1, 1000, N).astype(np.float32)
    for name, kind, what in chain_rows(command_buffers):
        if (what in ("graph", "raw") and what not in floors) or (
                what.startswith("ffi") and (ffi is None or (what.startswith("ffi-raw") and floor_kernel is None))):
            notes.append(f"{name}: not measured (see above)")
            continue
        if what in ("graph", "raw"):
            paths[name] = floors[what]
            meta[name] = {"kind": kind}
            continue
        try:
            f, runs, jnp = _chain_fn(what)
            if what.startswith("ffi"):
                runs = ffi.runs
            # Random integers: x + 32 * calls stays exact in float32, every element is checked.
            st = {"x": jnp.asarray(x0), "calls": 0}
            for _ in range(5):  # compile, tune (lazytriton: first execution), record graphs
                st["x"] = f(st["x"])
            st["x"].block_until_ready()
            st["calls"] = 5
        except Exception as exc:  # noqa: BLE001  (jax-triton absent or too old for this jax/Triton)
            notes.append(f"{name}: not measured ({why(exc)})")
            continue
        paths[name] = _chain_path(f, st)
        meta[name] = {"kind": kind}
        checks[name] = (st, what, runs, f)
    progress(f"chain (command buffers {'on' if command_buffers else 'off'}): {len(paths)} rows, interleaved")
    samples = interleaved(paths, lambda: None, rounds=12 if full else 8, batch=100)
    rows = []
    for name, s in samples.items():
        row = {"system": name, "kind": meta[name]["kind"], "samples": s}
        if name in checks:
            st, what, runs, f = checks[name]
            if what != "ffi-noop":  # the no-launch handler leaves its output unwritten
                got, want = np.asarray(st["x"]), x0 + CHAIN * st["calls"]
                row["correct"] = bool(np.array_equal(got, want))
                if not row["correct"]:
                    bad = int(np.argmax(got != want))
                    notes.append(f"{name}: WRONG result {got[bad]} at {bad} (expected {want[bad]})")
            if runs is not None:  # how often XLA ran the handler (launch or capture) per kernel call
                e0, x = runs(), st["x"]
                for _ in range(50):
                    x = f(x)
                x.block_until_ready()
                st["x"] = x
                row["handler_runs_per_kernel"] = (runs() - e0) / (50 * CHAIN)
        rows.append(row)
    notes.append(f"a jitted chain of {CHAIN} tiny kernels ({N} floats each), host time per kernel over batches of "
                 f"100 runs, rows interleaved; XLA_FLAGS {CB_ON if command_buffers else CB_OFF!r}")
    return {"title": CHAIN_TITLE, "unit": "us/kernel",
            "better": "lower", "ratio_to": "floor: CUDA graph replay of the same cubin", "rows": rows, "notes": notes}


def _chain_path(f, st):
    def batch(b):
        x = st["x"]
        t0 = time.perf_counter()
        for _ in range(b):
            x = f(x)
        x.block_until_ready()
        dt = time.perf_counter() - t0
        st["x"], st["calls"] = x, st["calls"] + b
        return dt / CHAIN  # interleaved() divides by b: us per kernel
    return batch


def _cubin_floor(what: str, entry, buffers, array, s):
    """A floor's batch function: `entry` launched on `buffers` (addresses into `array`, which
    the caller keeps alive) from a raw C++ loop ("raw") or replayed as a CUDA graph."""
    from lazytriton import _core

    if what == "raw":
        def raw(b):
            s.synchronize()
            t = _core.raw_launch_loop(entry, s.ptr, buffers, 200)  # below the launch queue's depth
            s.synchronize()
            return t / 200 * b
        return raw
    with s:
        s.begin_capture()  # CuPy's default: relaxed mode
        for _ in range(CHAIN):
            _core.launch_fixed(entry, s.ptr, buffers)
        graph = s.end_capture()
    graph.launch(s)
    s.synchronize()

    def replay(b):
        t0 = time.perf_counter()
        for _ in range(b):
            graph.launch(s)
        s.synchronize()
        return (time.perf_counter() - t0) / CHAIN
    return replay


def _throughput_section(progress, suite: str) -> dict:
    """Kernel time per call of the tuned workloads from JAX (host clock over
    batches of calls, which queue back to back: the kernels are long)."""
    rows, notes = [], []
    for w in throughput_workloads(suite):
        if w.jax is None:
            continue
        progress(f"jax throughput: {w.name}")
        try:
            p = w.jax()
        except Exception as exc:  # noqa: BLE001
            notes.append(f"{w.name}: setup failed ({why(exc)})")
            continue
        notes += [f"{w.name}: {n}" for n in p["notes"]]
        donated = "first" in p  # the in-place workload: each call updates (donates) its input
        paths, kinds, outs, correct = {}, {}, {}, None
        for system, (fn, kind) in p["fns"].items():
            args = list(p["args"])
            if donated:  # each path updates its own buffer
                args[0] = args[0].copy()
            try:
                if kind == "lazytriton" and "first" in p:
                    first, check_first = p["first"]
                    out = first(*args)  # compiles and tunes: must leave exactly one update
                    correct = bool(check_first(out))
                    args[0] = out
                out = fn(*args)
                out.block_until_ready()
                if kind == "lazytriton" and "first" not in p:
                    correct = bool(p["check"](out))
            except Exception as exc:  # noqa: BLE001  (jax-triton failing on this workload: a note, no row)
                notes.append(f"{w.name}: {system}: not measured ({why(exc)})")
                continue
            if donated:
                args[0] = out
            outs[system] = args
            paths[system] = _jax_call_path(fn, args, donated)
            kinds[system] = kind
        samples = interleaved(paths, lambda: None, rounds=10, batch=20)
        for system, s in samples.items():
            if kinds[system] == "lazytriton" and "first" in p:
                correct = correct and bool(p["check"](outs[system][0]))
            rate = [(w.flops / t / 1e6) if w.bound == "compute" else (w.bytes / t / 1e3) for t in s]
            label = "XLA's op" if system.startswith("XLA: ") else system
            extra = {"op": system[5:]} if label != system else {}
            if kinds[system] == "lazytriton":
                extra["correct"] = correct
            rows.append({"system": f"{w.name}: {label}", "kind": kinds[system], "samples": s, "workload": w.name,
                         "rate": rate, "rate_unit": "TFLOP/s" if w.bound == "compute" else "GB/s", "bound": w.bound,
                         "bytes": w.bytes, "flops": w.flops, **extra})
    notes.append("host time per call over batches of 20 back-to-back calls (the kernels queue; XLA's op and "
                 "lazytriton alike), rows interleaved; command buffers on")
    return {"title": THROUGHPUT_TITLE, "unit": "us", "better": "lower", "rows": rows,
            "notes": notes}


def _jax_call_path(fn, args: list, donated: bool):
    def batch(b):
        t0 = time.perf_counter()
        out = None
        for _ in range(b):
            out = fn(*args)
            if donated:
                args[0] = out
        out.block_until_ready()
        return time.perf_counter() - t0
    return batch
