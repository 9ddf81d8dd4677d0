"""Arrays on another device than the current one, checked without a GPU: the
stand-in libcuda.so.1 (fake_cuda/fake_cuda.c) with FAKE_CUDA_DEVICES=2 has two
devices, each thread's current context, and memory of device 1 at
0x7a0000000000.. that device 0 cannot read (cuPointerGetAttribute refuses it, as
the driver does without peer access). A launch goes to the current device;
Triton refuses arrays it cannot read ("Pointer argument (at 0) cannot be
accessed from Triton"), and so must lazytriton, before anything launches: a
kernel that reads another device's memory faults and leaves the process's CUDA
context unusable. The GPU test is test_gpu_two_devices.py."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler (the stand-in libcuda.so.1)")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake-cuda")
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(d / "libcuda.so.1"),
                    str(HERE / "fake_cuda" / "fake_cuda.c")], check=True)
    return d


SCRIPT = r"""
import ctypes, json, os, sys
sys.path.insert(0, {tests!r})
import lazytriton
from lazytriton.model.arrays import DeviceArray
from kernels import basic

LOG = os.environ["FAKE_CUDA_LOG"]


def launches():
    if not os.path.exists(LOG):
        return []
    with open(LOG) as f:
        out = [json.loads(line) for line in f]
    os.remove(LOG)
    return out


def make_current(device):  # what torch.cuda.set_device does: that device's primary context current
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0


class PtrLike:
    # An object that does not say its device (data_ptr() alone): each pointer is put to the driver's
    # check. (lazytriton's own DeviceArray is not: it records buffers its maker vouches for.)
    def __init__(self, ptr, dtype, nbytes):
        self.ptr, self.dtype, self.nbytes = ptr, dtype, nbytes

    def data_ptr(self):
        return self.ptr


class CupyLike:
    # What lazytriton reads of a CuPy array: data.ptr, data.device_id (its MemoryPointer), dtype.
    class Mem:
        def __init__(self, ptr, device_id):
            self.ptr, self.device_id = ptr, device_id

    def __init__(self, ptr, device_id, n):
        self.data, self.dtype, self.nbytes = CupyLike.Mem(ptr, device_id), "float32", 4 * n

    @property
    def __cuda_array_interface__(self):
        return {{"shape": (self.nbytes // 4,), "typestr": "<f4", "data": (self.data.ptr, False), "version": 3}}


class DLPackLike:
    # A CUDA DLPack tensor (kDLCUDA, its device id): what lazytriton reads of a __dlpack__ object.
    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                    ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]

    NAME = b"dltensor"
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    def __init__(self, ptr, device_id, n):
        self.dtype, self.nbytes = "float32", 4 * n
        self.shape_ = (ctypes.c_int64 * 1)(n)
        self.t = DLPackLike.DLTensor(ptr, 2, device_id, 1, 2, 32, 1, self.shape_, None, 0)

    def __dlpack__(self, stream=None):
        return DLPackLike.new_capsule(ctypes.addressof(self.t), DLPackLike.NAME, None)


n = 4096
grid = (n // 1024,)
on0 = [PtrLike(0x7F0000000000 + i * (1 << 24), "float32", 4 * n) for i in range(3)]
on1 = [PtrLike(0x7A0000000000 + i * (1 << 24), "float32", 4 * n) for i in range(3)]
k = lazytriton.kernel(basic.add_kernel)
out = {{}}
k[grid](*on0, n, BLOCK=1024, stream=0)
out["first"] = [r["device"] for r in launches()]
calls = {{"x": (on1[0], on0[1], on0[2]), "y": (on0[0], on1[1], on0[2]), "out": (on0[0], on0[1], on1[2]),
          "cupy x": (CupyLike(on1[0].ptr, 1, n), on0[1], on0[2]),
          "cupy out": (on0[0], on0[1], CupyLike(on1[2].ptr, 1, n)),
          "dlpack y": (on0[0], DLPackLike(on1[1].ptr, 1, n), on0[2])}}
out["refused"] = {{}}
for name, args in calls.items():
    for _ in range(2):  # the stub of this shape exists from the second call on: refused in C, named by Python
        try:
            k[grid](*args, n, BLOCK=1024, stream=0)
            out["refused"][name] = None
        except ValueError as exc:
            out["refused"][name] = str(exc)
out["launched_while_refusing"] = len(launches())
# lazytriton's DeviceArray records a buffer its maker vouches for (the JAX handler's XLA buffers, stand-ins
# for compiling ahead): never put to the check, wherever its address points.
k[grid](*[DeviceArray(a.ptr, "fp32", a.nbytes) for a in on1], n, BLOCK=1024, stream=0)
out["recorded"] = [r["device"] for r in launches()]
k[grid](*on0, n, BLOCK=1024, stream=0)  # the right arrays again: launched as before
out["after"] = [r["device"] for r in launches()]
# A new argument shape on device 1 (fp16): refused before its specialization compiles.
compiles = lazytriton.stats()["compiles"]
try:
    k[grid](*[PtrLike(a.ptr, "float16", 2 * n) for a in on1], n, BLOCK=1024, stream=0)
    out["new_shape"] = None
except ValueError as exc:
    out["new_shape"] = str(exc)
out["compiled_for_it"] = lazytriton.stats()["compiles"] - compiles
out["launched_for_it"] = len(launches())
# Device 1 current: its arrays launch there, device 0's are refused.
make_current(1)
k[grid](*on1, n, BLOCK=1024, stream=0)
k[grid](CupyLike(on1[0].ptr, 1, n), *on1[1:], n, BLOCK=1024, stream=0)
k[grid](on1[0], DLPackLike(on1[1].ptr, 1, n), on1[2], n, BLOCK=1024, stream=0)
out["on1"] = [r["device"] for r in launches()]
try:
    k[grid](*on0, n, BLOCK=1024, stream=0)
except ValueError as exc:
    out["on1_refused"] = str(exc)
out["on1_launched_while_refusing"] = len(launches())
# Peer access enabled: device 0's memory is readable from device 1, and Triton's check passes it.
os.environ["FAKE_CUDA_PEER_ACCESS"] = "1"
k[grid](on0[0], *on1[1:], n, BLOCK=1024, stream=0)
out["peer"] = [r["device"] for r in launches()]
print(json.dumps(out))
"""


@pytest.mark.parametrize("stubs", ["off", "sync"], ids=["table_driven_stub", "generated_stub"])
def test_arrays_on_another_device_are_refused_before_any_launch(fake_driver, tmp_path, stubs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYTRITON_")}
    env.update(LD_LIBRARY_PATH=str(fake_driver), TRITON_LIBCUDA_PATH=str(fake_driver), FAKE_CUDA_DEVICES="2",
               FAKE_CUDA_LOG=str(tmp_path / "launches.jsonl"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               LAZYTRITON_CACHE_DIR=str(tmp_path / "lazytriton"), LAZYTRITON_STUB_BUILD=stubs,
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=str(HERE))], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["first"] == [0] and out["after"] == [0]
    for name, msg in out["refused"].items():
        arg = name.split()[-1]
        assert msg is not None, f"{name}: launched"
        assert msg.startswith(f"kernel add_kernel, argument {arg}: the array is on cuda:1, but the current device "
                              "is cuda:0"), msg
    assert out["launched_while_refusing"] == 0
    assert out["recorded"] == [0]
    assert out["new_shape"] is not None and "argument x: the array is on cuda:1" in out["new_shape"]
    assert out["compiled_for_it"] == 0 and out["launched_for_it"] == 0
    assert out["on1"] == [1, 1, 1]
    assert out["on1_refused"].startswith("kernel add_kernel, argument x: the array is on cuda:0, but the current "
                                         "device is cuda:1"), out["on1_refused"]
    assert out["on1_launched_while_refusing"] == 0
    assert out["peer"] == [1]


@pytest.mark.parametrize("setting,want", [("1", "1"), ("7", "LAZYTRITON_DEVICE='7' names a device the driver cannot open"),
                                          ("x", "LAZYTRITON_DEVICE='x' is not a valid setting")])
def test_lazytriton_device_chooses_the_device_of_a_thread_with_none(fake_driver, tmp_path, setting, want):
    """LAZYTRITON_DEVICE (a C++ program's device, and any thread's with no current context):
    device 1 of two; a device the machine lacks, or no ordinal, is an error naming the setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYTRITON_")}
    env.update(LD_LIBRARY_PATH=str(fake_driver), FAKE_CUDA_DEVICES="2", LAZYTRITON_DEVICE=setting)
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-c", "from lazytriton import _core; print(_core.current_device())"],
                       env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    if setting == "1":
        assert r.returncode == 0 and r.stdout.strip() == "1", out
    else:
        assert r.returncode != 0 and want in out, out
