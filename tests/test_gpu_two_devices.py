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
    # cwd: not the clone's root, whose source tree (first on a `-c` child's sys.path) would shadow the
    # installed package
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=str(HERE))], env=env, capture_output=True,
                       text=True, timeout=900, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-6000:]


# One process driving both devices with one autotuned kernel object (issue 36): calls that alternate
# between the devices, first calls from two threads on two devices at once, torch and CuPy arrays;
# then JAX: a jit placed on device 1, and shard_map over both devices with command buffers on. Fresh
# random data each call, outputs poisoned first, compared with a reference.
ONE_PROCESS = r"""
import sys, threading
sys.path.insert(0, {tests!r})
import numpy as np
import torch
import triton
import lazytriton
from kernels import basic, jaxk

gen = torch.Generator().manual_seed(5)
k = lazytriton.kernel(basic.matmul_kernel)


def matmul_on(device, m, n=128, kk=64, arrays="torch"):
    a = torch.randn(m, kk, generator=gen, dtype=torch.float16)
    b = torch.randn(kk, n, generator=gen, dtype=torch.float16)
    ref = a.float() @ b.float()
    with torch.cuda.device(device):
        a, b = a.to(f"cuda:{{device}}"), b.to(f"cuda:{{device}}")
        c = torch.full((m, n), float("nan"), device=f"cuda:{{device}}", dtype=torch.float16)
        if arrays == "cupy":
            import cupy
            with cupy.cuda.Device(device):
                a, b, c = cupy.asarray(a), cupy.asarray(b), cupy.asarray(c)
        grid = lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"]))
        k[grid](a, b, c, m, n, kk, kk, 1, n, 1, n, 1)
        out = torch.as_tensor(c, device=f"cuda:{{device}}").float().cpu()
    err = (out - ref).abs().max().item()
    assert err < 5e-2 * max(1.0, ref.abs().max().item()), (device, m, arrays, err)


for device in (0, 1, 0, 1):
    matmul_on(device, 256)
try:
    import cupy
except ImportError:
    cupy = None
if cupy is not None:
    for device in (1, 0, 1):
        matmul_on(device, 256, arrays="cupy")

# First calls of a new key from two threads, one per device, at once.
errors = []
def first(device):
    try:
        torch.cuda.set_device(device)
        matmul_on(device, 384)
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=first, args=(d,)) for d in (0, 1)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
torch.cuda.set_device(0)
for device in (1, 0):
    matmul_on(device, 384)

import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import lazytriton.jax as ltj

def mm(a, b):
    m, kk = a.shape
    n = b.shape[1]
    return ltj.triton_call(a, b, m, n, kk, kk, 1, n, 1, n, 1, kernel=jaxk.matmul_kernel,  # output last
                           out_type=jax.ShapeDtypeStruct((m, n), jnp.float16),
                           grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])))

def check(out, a, b):
    ref = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
    err = np.abs(np.asarray(out, np.float32) - ref).max()
    assert err < 5e-2 * max(1.0, np.abs(ref).max()), err

dev1 = jax.devices()[1]
f = jax.jit(mm)
for step in range(3):
    key = jax.random.key(step)
    a = jax.device_put(jax.random.normal(key, (256, 64), jnp.float16), dev1)
    b = jax.device_put(jax.random.normal(jax.random.fold_in(key, 1), (64, 128), jnp.float16), dev1)
    out = f(a, b)
    assert out.devices() == {{dev1}}
    check(out, a, b)

mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
g = jax.jit(jax.shard_map(mm, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d")))
for step in range(4):
    key = jax.random.key(100 + step)
    a = jax.device_put(jax.random.normal(key, (512, 64), jnp.float16), NamedSharding(mesh, P("d")))
    b = jax.device_put(jax.random.normal(jax.random.fold_in(key, 1), (64, 128), jnp.float16), NamedSharding(mesh, P()))
    check(g(a, b), a, b)
print("ok")
"""


def test_one_process_drives_both_gpus(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=str(tmp_path / "lazytriton"), XLA_PYTHON_CLIENT_PREALLOCATE="false",
               XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1")
    r = subprocess.run([sys.executable, "-c", ONE_PROCESS.format(tests=str(HERE))], env=env, capture_output=True,
                       text=True, timeout=900, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-6000:]


def test_a_cpp_bundle_launches_on_device_1(tmp_path_factory, tmp_path, cache_dir):
    """The ahead-of-time C++ program (examples/cpp, no Python in its process) on device 1
    (LAZYTRITON_DEVICE=1: the device of a thread with no current context), launching the
    winners tuned from Python on device 0 (the same GPU model): correct results there."""
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from test_embed import CMAKE, EXAMPLE, cmake_build, run
    from test_gpu_embed import N, tune_into

    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    build = tmp_path_factory.mktemp("example-build")
    cmake_build(EXAMPLE, build)
    tune_into(tmp_path / "bundle")
    on1 = run(build / "vector_add_aot", tmp_path / "bundle", N, env={"LAZYTRITON_DEVICE": "1"})
    assert on1.returncode == 0 and f"n={N}: ok (0 wrong)" in on1.stdout, on1.stdout + on1.stderr[-3000:]
    # The setting is what chose the device: one that does not exist is refused by name.
    none = run(build / "vector_add_aot", tmp_path / "bundle", N, env={"LAZYTRITON_DEVICE": "7"})
    assert none.returncode != 0 and "LAZYTRITON_DEVICE" in none.stdout + none.stderr, none.stdout + none.stderr
