"""Arrays on another GPU than the current one, on two real GPUs. A launch goes to
the current device; Triton refuses arrays that device cannot read ("Pointer
argument (at 0) cannot be accessed from Triton (cpu tensor?)"), and so must
lazytriton, naming the kernel, the argument and both devices, before anything
launches: a kernel that reads another device's memory faults, and the whole
process's CUDA context is lost (every later CUDA call fails, torch's and JAX's
too). With the arrays' device current, the same kernel objects compute
correctly. Each case runs in a process of its own: no earlier test may have
enabled peer access between the two devices (torch does for a copy between
them), which makes such arrays readable, and Triton's check then passes them.
(test_devices.py checks the rule on the CPU, with the stand-in driver's two
devices.)"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.gpu

SCRIPT = r"""
import re, sys
sys.path.insert(0, {tests!r})
import torch
import lazytriton
from kernels import basic

BLOCK = 256
n = 4096 + 7
grid = lambda m: ((m["n"] + m["BLOCK"] - 1) // m["BLOCK"],)
gen = torch.Generator().manual_seed(11)


def fresh(device):  # random inputs made on the host and copied to `device` (no copy between the GPUs)
    return [torch.randn(n, generator=gen).to(f"cuda:{{device}}") for _ in range(2)]


def poisoned(device):
    return torch.full((n,), float("nan"), device=f"cuda:{{device}}")


def refused(k, args, arg, on, current):
    want = (f"kernel add_kernel, argument {{arg}}: the array is on cuda:{{on}}, but the current device is "
            f"cuda:{{current}}")
    try:
        k[grid](*args, n, BLOCK=BLOCK)
    except ValueError as exc:
        assert str(exc).startswith(want), str(exc)
        return
    raise AssertionError(f"launched: {{want}}")


def context_works():  # every device still computes (a faulted launch leaves each later call failing)
    for d in (0, 1):
        a = torch.randn(1000, generator=gen).to(f"cuda:{{d}}")
        assert torch.equal((a * 2).cpu(), a.cpu() * 2)
        torch.cuda.synchronize(d)


torch.cuda.set_device(0)
k = lazytriton.kernel(basic.add_kernel)
x0, y0 = fresh(0)
out0 = poisoned(0)
k[grid](x0, y0, out0, n, BLOCK=BLOCK)
torch.testing.assert_close(out0, x0 + y0)

# Device 1's tensors while device 0 is current: refused whichever argument holds one, on the stub's
# path too (the second call of each), and nothing launched.
x1, y1 = fresh(1)
out1 = poisoned(1)
for _ in range(2):
    refused(k, (x1, y0, out0), "x", 1, 0)
    refused(k, (x0, y1, out0), "y", 1, 0)
    refused(k, (x0, y0, out1), "out", 1, 0)
torch.cuda.synchronize(1)
assert torch.isnan(out1).all(), "a refused call wrote device 1's output"
context_works()

# A new kernel object's first call: refused before anything compiles.
compiles = lazytriton.stats()["compiles"]
refused(lazytriton.kernel(basic.add_kernel), (x1, y1, out1), "x", 1, 0)
assert lazytriton.stats()["compiles"] == compiles

# CuPy arrays on device 1 (they say their device: .data.device_id).
try:
    import cupy
except ImportError:
    cupy = None
if cupy is not None:
    with cupy.cuda.Device(1):
        cx, cy = (cupy.asarray(t.cpu().numpy()) for t in fresh(1))
        cout = cupy.full(n, cupy.nan, dtype=cupy.float32)
    for _ in range(2):
        refused(k, (cx, y0, out0), "x", 1, 0)
        refused(k, (x0, y0, cout), "out", 1, 0)
    with cupy.cuda.Device(1):  # (CuPy's own kernels run on the current device only)
        assert bool(cupy.isnan(cout).all()), "a refused call wrote a CuPy array"
    context_works()

# Device 1 current: the same kernel object computes right there, on fresh data; device 0's are refused.
with torch.cuda.device(1):
    x1, y1 = fresh(1)
    out1 = poisoned(1)
    k[grid](x1, y1, out1, n, BLOCK=BLOCK)
    torch.testing.assert_close(out1, x1 + y1)
    refused(k, (x0, y0, out0), "x", 0, 1)
    if cupy is not None:
        with cupy.cuda.Device(1):
            cx, cy = (cupy.asarray(t.cpu().numpy()) for t in fresh(1))
            cout = cupy.full(n, cupy.nan, dtype=cupy.float32)
            k[grid](cx, cy, cout, n, BLOCK=BLOCK)
            assert cupy.allclose(cout, cx + cy)

# And back on device 0, with fresh data.
x0, y0 = fresh(0)
out0 = poisoned(0)
k[grid](x0, y0, out0, n, BLOCK=BLOCK)
torch.testing.assert_close(out0, x0 + y0)
context_works()
print("ok")
"""


@pytest.mark.parametrize("stubs", ["off", "sync"], ids=["table-driven", "generated"])
def test_arrays_on_the_other_gpu_are_refused_and_the_context_survives(tmp_path, stubs):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=str(tmp_path / "lazytriton"), LAZYTRITON_STUB_BUILD=stubs)
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=str(HERE))], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-6000:]
