"""Host cost per launch of a tiny kernel, side by side in one run:

  raw       plain cuLaunchKernel in a C++ loop on the same cubin (the floor)
  core      lazytriton's C++ launch path (cuLaunchKernelEx) in a C++ loop
  stub      lazytriton from Python: k[grid](x, y, out, n) (k[grid] and its call are C:
            csrc/python/launcher.cc) through the generated stub, on torch tensors (each
            pays an is_cuda read: a host tensor is refused) and on CuPy arrays; with BLOCK= as a keyword
            (a cached binding plan), without stream= (CuPy's current stream, as CuPy is
            imported here: a Python call per launch), and through k.run (the same C path); "python path" replays in Python
            what k[grid](..., BLOCK=) did before launcher.cc (__getitem__, _Launch, _run)
  triton    Triton's own launcher: add_kernel[grid](x, y, out, n, BLOCK=...)

Each figure is the median over batches of the host time of BATCH launches
(fewer than the launch queue holds, so the GPU never throttles the host),
divided by BATCH. Ratios are against `raw`. Run on a GPU machine:
    python benchmarks/launch_overhead.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import lazytriton  # noqa: E402
from lazytriton import _core  # noqa: E402
from lazytriton.bench.timing import interleaved  # noqa: E402

BATCH, ROUNDS = 200, 60


def measure(paths: dict, sync) -> dict:
    """Median us/launch of each path (the harness's interleaved loop)."""
    samples = interleaved(paths, sync, rounds=ROUNDS, batch=BATCH)
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    import torch
    import triton

    from kernels.basic import add_kernel, add_tuned_kernel

    ok, why = lazytriton.gpu_available()
    if not ok:
        sys.exit(f"no GPU: {why}")
    n, block = 1024, 1024
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    sync = torch.cuda.synchronize
    stream = torch.cuda.current_stream().cuda_stream
    grid = (1,)

    k = lazytriton.kernel(add_kernel)
    k[grid](x, y, out, n, BLOCK=block, stream=stream)  # compile + stub
    sync()
    kern = next(iter(k._kernels.values()))
    types = ["*fp32", "*fp32", "*fp32", "i32"]
    vals = [x.data_ptr(), y.data_ptr(), out.data_ptr(), n]
    add_kernel[grid](x, y, out, n, BLOCK=block)  # Triton's own compile
    sync()

    kt = lazytriton.kernel(add_tuned_kernel)  # BLOCK from its (single) config: a positional call
    kt[grid](x, y, out, n, stream=stream)
    sync()

    def stub_positional(b):
        for _ in range(b):
            kt[grid](x, y, out, n, stream=stream)

    import cupy

    xc, yc, outc = (cupy.asarray(t) for t in (x, y, out))  # the same memory, read as CuPy arrays

    def stub_cupy(b):
        for _ in range(b):
            kt[grid](xc, yc, outc, n, stream=stream)

    def stub_default_stream(b):
        for _ in range(b):
            kt[grid](x, y, out, n)

    def stub(b):
        for _ in range(b):
            k[grid](x, y, out, n, BLOCK=block, stream=stream)

    class PyLaunch:  # the Python call path k[grid](...) took before csrc/python/launcher.cc
        __slots__ = ("kernel", "grid")

        def __init__(self, kernel, grid):
            self.kernel, self.grid = kernel, grid

        def __call__(self, *args, stream=None, **kwargs):
            return self.kernel._run(self.grid, stream, args, kwargs)

    def getitem(kernel, grid):  # was LazyKernel.__getitem__
        return PyLaunch(kernel, grid)

    def stub_python(b):
        for _ in range(b):
            getitem(k, grid)(x, y, out, n, BLOCK=block, stream=stream)

    def stub_run(b):
        run = k.run
        for _ in range(b):
            run(x, y, out, n, grid=grid, stream=stream, BLOCK=block)

    def trit(b):
        for _ in range(b):
            add_kernel[grid](x, y, out, n, BLOCK=block)

    rows = measure({
        "raw cuLaunchKernel (C++ loop)": lambda b: _core.raw_launch_loop(kern, grid, stream, types, vals, b),
        "lazytriton core (C++ loop)": lambda b: _core.core_launch_loop(kern, grid, stream, types, vals, b),
        "lazytriton stub: k[grid](x, y, out, n)": stub_positional,
        "lazytriton stub: ... CuPy arrays": stub_cupy,
        "lazytriton stub: ... without stream=": stub_default_stream,
        "lazytriton stub: k[grid](..., BLOCK=)": stub,
        "python path (before launcher.cc), BLOCK=": stub_python,
        "lazytriton stub: k.run(..., BLOCK=)": stub_run,
        "triton launcher: kernel[grid](...)": trit,
    }, sync)
    # Correctness of the timed path, after all that.
    sync()
    assert torch.equal(out, x + y)
    raw = rows["raw cuLaunchKernel (C++ loop)"]
    st = lazytriton.stats()
    print(f"resolves {st['resolves']}, compiles {st['compiles']} (both kernels resolved once each)")
    print(f"device: {torch.cuda.get_device_name()}  triton {triton.__version__}  lazytriton {lazytriton.__version__}")
    print(f"{'path':40s} {'us/launch':>10s} {'vs raw':>8s}")
    for name, us in rows.items():
        print(f"{name:40s} {us:10.2f} {us / raw:7.2f}x")
    worst = max(rows["lazytriton stub: k[grid](x, y, out, n)"], rows["lazytriton stub: k[grid](..., BLOCK=)"]) / raw
    cupy_ratio = rows["lazytriton stub: ... CuPy arrays"] / raw
    print(f"k[grid](...) paths: at most {worst:.3f}x raw on torch tensors, {cupy_ratio:.3f}x on CuPy arrays "
          f"(goal 1.30x): {'met' if max(worst, cupy_ratio) <= 1.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
