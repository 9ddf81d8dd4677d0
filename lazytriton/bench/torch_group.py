"""The launch-bound process of the harness (torch arrays):

- launch: host cost per launch of a tiny vector add through each of
  lazytriton's Python paths, Triton's own launcher, and the floors (a raw
  cuLaunchKernel loop and CUDA-graph replay of the same cubin), then the C++
  rows (cpp.py: bundle launch, typed stub, and their own raw loop);
- small: time per call, back to back, of the workloads at launch-bound sizes
  (lazytriton, Triton's launcher and autotuner, torch's op).
"""
from __future__ import annotations

import os
from pathlib import Path

from . import cpp
from .common import guarded, row, why
from .timing import interleaved
from .workloads import small_workloads

QUICK_FULL, FULL = ("quick", "full"), ("full",)
# The same call served by the table-driven stub (csrc/python/generic_stub.cc) for good, as under
# LAZYTRITON_STUB_BUILD=off, beside the generated stub that serves the rows above it.
TABLE_DRIVEN = "lazytriton k[grid](...), table-driven stub (LAZYTRITON_STUB_BUILD=off)"
# (row, kind, suites): the launch section's Python rows, in the order they are measured.
LAUNCH_PATHS = [
    ("raw cuLaunchKernel loop (C++)", "floor", QUICK_FULL),
    ("lazytriton C++ core loop", "lazytriton", QUICK_FULL),
    ("lazytriton k[grid](...), torch", "lazytriton", QUICK_FULL),
    ("lazytriton k[grid](...), CuPy", "lazytriton", QUICK_FULL),
    (TABLE_DRIVEN + ", torch", "lazytriton", QUICK_FULL),
    (TABLE_DRIVEN + ", CuPy", "lazytriton", QUICK_FULL),
    ("lazytriton k[grid](x, y, out, n) (BLOCK from its config), torch", "lazytriton", FULL),
    ("lazytriton k[grid](...) without stream=, torch", "lazytriton", FULL),
    ("lazytriton k.run(..., grid=), torch", "lazytriton", FULL),
    ("Triton's launcher kernel[grid](...)", "other", QUICK_FULL),
]
GRAPH_ROW = "CUDA graph replay, per kernel"
LAUNCH_TITLE = "Host cost per launch (vector add, 1024 elements)"
SMALL_TITLE = "Launch-bound sizes: time per call, back to back"
BATCH = 200


def launch_rows(suite: str) -> list[str]:
    return ([name for name, _, suites in LAUNCH_PATHS if suite in suites] + [GRAPH_ROW]
            + [cpp.PREFIX + name for name, _ in cpp.PATHS])


SMALL_PATHS = (("lazytriton k[grid](...)", "lazytriton", "run"), ("Triton's launcher (autotuner)", "other", "triton"),
               ("Triton's launcher, same config", "other", "same"), ("torch", "other", "ref"))


def _small_paths(w) -> list[tuple]:
    return [p for p in SMALL_PATHS if p[2] != "same" or w.same_config]


def small_rows(suite: str) -> list[str]:
    return [f"{w.name}: {name}" for w in small_workloads(suite) for name, _, _ in _small_paths(w)]


def run(progress, suite: str) -> dict:
    sections = {"launch": guarded("launch", LAUNCH_TITLE, lambda: _launch(progress, suite))}
    if small_workloads(suite):
        sections["small"] = guarded("small", SMALL_TITLE, lambda: _small(progress, suite))
    return {"sections": sections}


def _launch(progress, suite: str) -> dict:
    import torch

    import lazytriton
    from lazytriton import _core
    from lazytriton.runtime import fixed, stubgen, torch_reader

    from .kernels import add, add_tuned

    full = suite == "full"
    n, block, grid = 1024, 1024, (1,)
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    sync = torch.cuda.synchronize
    k, kt = lazytriton.kernel(add), lazytriton.kernel(add_tuned)
    k[grid](x, y, out, n, BLOCK=block, stream=stream)
    kg = _table_driven(lazytriton.kernel(add), lambda f: f[grid](x, y, out, n, BLOCK=block, stream=stream))
    kt[grid](x, y, out, n, stream=stream)
    add[grid](x, y, out, n, BLOCK=block)
    sync()
    # The winner as the C++ loops launch it: parameters packed once from the call's slot table.
    entry, buffers = fixed.entry_on(k.resolve(x, y, out, n, grid=grid, stream=stream, BLOCK=block), (x, y, out, n))

    def loop(call):
        def batch(b):
            for _ in range(b):
                call()
        return batch

    impl = {
        "raw cuLaunchKernel loop (C++)": lambda b: _core.raw_launch_loop(entry, stream, buffers, b),
        "lazytriton C++ core loop": lambda b: _core.core_launch_loop(entry, stream, buffers, b),
        "lazytriton k[grid](...), torch": loop(lambda: k[grid](x, y, out, n, BLOCK=block, stream=stream)),
        "lazytriton k[grid](x, y, out, n) (BLOCK from its config), torch":
            loop(lambda: kt[grid](x, y, out, n, stream=stream)),
        "lazytriton k[grid](...) without stream=, torch": loop(lambda: k[grid](x, y, out, n, BLOCK=block)),
        "lazytriton k.run(..., grid=), torch": loop(lambda: k.run(x, y, out, n, grid=grid, stream=stream,
                                                                  BLOCK=block)),
        "Triton's launcher kernel[grid](...)": loop(lambda: add[grid](x, y, out, n, BLOCK=block)),
        TABLE_DRIVEN + ", torch": loop(lambda: kg[grid](x, y, out, n, BLOCK=block, stream=stream)),
    }
    notes = []
    try:
        import cupy

        xc, yc, oc = (cupy.asarray(t) for t in (x, y, out))  # the same memory, read as CuPy arrays
        impl["lazytriton k[grid](...), CuPy"] = loop(lambda: k[grid](xc, yc, oc, n, BLOCK=block, stream=stream))
        _table_driven(kg, lambda f: f[grid](xc, yc, oc, n, BLOCK=block, stream=stream))
        impl[TABLE_DRIVEN + ", CuPy"] = loop(lambda: kg[grid](xc, yc, oc, n, BLOCK=block, stream=stream))
    except ImportError:
        notes.append("CuPy not importable: no CuPy row")
    kinds = {name: kind for name, kind, _ in LAUNCH_PATHS}
    paths = {name: impl[name] for name, _, suites in LAUNCH_PATHS if suite in suites and name in impl}
    # Every path once on a poisoned output (its result checked), then the launch stubs that build in
    # the background (g++) are waited for, so that every round measures the steady state and no
    # compiler competes for the CPU.
    right = {}
    for name, fn in paths.items():
        out.fill_(float("nan"))
        sync()
        fn(2)
        sync()
        right[name] = bool(torch.equal(out, x + y))
    stubgen.wait_for_builds(120)
    if not torch_reader.wait(300):  # built in the background by the first call on CUDA tensors
        notes.append("the torch tensor reader is not installed (not built here): torch rows read tensors "
                     "through torch's Python getters")
    for fn in paths.values():
        fn(2)  # the built stubs serve these calls now
    sync()
    progress(f"launch: {len(paths)} Python paths, interleaved")
    samples = interleaved(paths, sync, rounds=60 if full else 30, batch=BATCH)
    rows = [row(name, kinds[name], s, **({"correct": right[name]} if kinds[name] == "lazytriton" else {}))
            for name, s in samples.items()]
    # Floor: the same kernel recorded BATCH times into a CUDA graph, replayed (device time per kernel).
    try:
        from triton.testing import do_bench

        g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(side):
            with torch.cuda.graph(g, stream=side):
                for _ in range(BATCH):
                    k[grid](x, y, out, n, BLOCK=block, stream=side.cuda_stream)
        out.fill_(float("nan"))
        replay = do_bench(g.replay, warmup=5, rep=100, return_mode="all")  # ms per replay
        sync()
        right[GRAPH_ROW] = bool(torch.equal(out, x + y))
        rows.append(row(GRAPH_ROW, "floor", [t * 1e3 / BATCH for t in replay], correct=right[GRAPH_ROW]))
    except Exception as exc:  # noqa: BLE001
        notes.append(f"{GRAPH_ROW}: not measured ({why(exc)})")
    notes += [f"{name}: the vector add gave a WRONG result" for name, ok in right.items() if not ok]
    progress("launch: the C++ program (bundle, typed stub, raw loop)")
    try:
        rows += cpp.rows(_cpp_measure(full))
    except Exception as exc:  # noqa: BLE001  (no compiler): the C++ rows are absent, said why
        notes.append(f"C++ rows not measured ({why(exc, 400)})")
    notes.append(f"Python rows: host time of {BATCH}-launch batches / {BATCH}, rounds interleaved; graph replay: "
                 f"device time per kernel of a {BATCH}-kernel graph; C++ rows: the same scheme in a C++ program "
                 f"(its own raw loop is its floor)")
    return {"title": LAUNCH_TITLE, "unit": "us/launch", "better": "lower",
            "ratio_to": "raw cuLaunchKernel loop (C++)", "rows": rows, "notes": notes}


def _table_driven(k, first_call):
    """`k` with its first call made under LAZYTRITON_STUB_BUILD=off (read per call): the table-driven
    stub then serves that shape for good (no generated stub is built to replace it)."""
    previous = os.environ.get("LAZYTRITON_STUB_BUILD")
    os.environ["LAZYTRITON_STUB_BUILD"] = "off"
    try:
        first_call(k)
    finally:
        if previous is None:
            os.environ.pop("LAZYTRITON_STUB_BUILD")
        else:
            os.environ["LAZYTRITON_STUB_BUILD"] = previous
    return k


def _cpp_measure(full: bool) -> dict:
    work = Path(os.environ.get("LAZYTRITON_BENCH_WORK") or Path.home() / ".cache" / "lazytriton-bench")
    prog = cpp.build(work)
    bundle_dir = cpp.make_bundle(work / "bundle")
    return cpp.measure(prog, bundle_dir, rounds=60 if full else 30, batch=BATCH)


def _small(progress, suite: str) -> dict:
    import torch

    from lazytriton.runtime import stubgen

    rows, notes = [], []
    for w in small_workloads(suite):
        progress(f"small: {w.name}")
        try:
            s = w.torch()
            (s.get("first") or s["run"])()
            torch.cuda.synchronize()
            s["run"]()
            torch.cuda.synchronize()
            correct = bool(s["check"]())
            calls = {**s, "same": s["same"]()} if w.same_config else s  # the chosen config, now that it is tuned
            for _, _, key in _small_paths(w)[1:]:
                calls[key]()  # Triton's autotuner benchmarks its configs; Triton compiles; torch warms up
            torch.cuda.synchronize()
            stubgen.wait_for_builds(120)  # the generated launch stub (built in the background) serves the rounds
        except Exception as exc:  # noqa: BLE001
            notes.append(f"{w.name}: not measured ({why(exc)})")
            continue
        paths = {f"{w.name}: {name}": _calls(calls[key], torch.cuda.synchronize) for name, _, key in _small_paths(w)}
        samples = interleaved(paths, torch.cuda.synchronize, rounds=20, batch=50)
        for (name, smp), (_, kind, key) in zip(samples.items(), _small_paths(w)):
            rows.append(row(name, kind, smp, workload=w.name,
                            **({"correct": correct} if kind == "lazytriton" else {"op": s["ref_name"]}
                               if key == "ref" else {})))
        if not correct:
            notes.append(f"{w.name}: lazytriton gave a WRONG result")
    notes.append("wall time per call over batches of 50 back-to-back calls, the GPU drained at the end of each "
                 "batch (so a kernel slower than its launch counts), rows "
                 "interleaved: the launch path's cost where the kernel is short")
    return {"title": SMALL_TITLE, "unit": "us/call", "better": "lower",
            "rows": rows, "notes": notes}


def _calls(fn, drain):
    def batch(b):
        for _ in range(b):
            fn()
        drain()  # inside the timed span: back to back, a call costs the slower of its launch and its kernel
    return batch
