"""The stubs' reads of torch tensors and CuPy arrays on the GPU, end to end: the
torch reader built against the installed torch (csrc/python/torch_reader.cc),
torch's own getters when it is not installed or declines (a tensor subclass),
and CuPy's C getters called through their descriptors (array_reads.h
read_attr). One kernel object per stub kind takes a seeded sequence of views
at offsets, dtypes, parameters and subclasses in one process; every launch is
checked against the framework's own result on fresh random data with the
output poisoned first, and every pointer the stub passes against data_ptr() /
.data.ptr. test_gpu_memcheck.py runs this file again under memcheck.
(test_torch_reader.py checks the reader's answers on the CPU.)"""
import random
import struct

import pytest

import lazytriton
from lazytriton import _core
from lazytriton.runtime import stubgen, torch_reader

from kernels import basic

pytestmark = pytest.mark.gpu
BLOCK = 256


def passed_pointers(k, args):
    """The three pointers the stub of these arguments passes (read as it reads them)."""
    stub = next(s for s in k._stubs if s.key(args) is not None)
    return [struct.unpack("<Q", p)[0] for p in stub.params(args)[:3]]


def grid(m):
    return ((m["n"] + m["BLOCK"] - 1) // m["BLOCK"],)


@pytest.mark.heavy
@pytest.mark.parametrize("stubs", ["off", "sync"], ids=["table-driven", "generated"])
def test_torch_tensors_in_one_process(cache_dir, monkeypatch, stubs):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("LAZYTRITON_STUB_BUILD", stubs)

    class Sub(torch.Tensor):  # the reader declines subclasses: torch's getters serve them
        pass

    k = lazytriton.kernel(basic.add_kernel)
    order = random.Random(24)
    warm = torch.randn(64, device="cuda")
    k[grid](warm, warm, torch.empty_like(warm), 64, BLOCK=BLOCK)  # requests the reader (a background build)
    if stubs == "sync":
        assert torch_reader.wait(600), "the torch reader did not build"
    readers = ["reader", "getters"] if _core.torch_reader_installed() else ["getters"]
    installed = torch_reader.load() if "reader" in readers else None
    try:
        for i in range(40):
            use = order.choice(readers)
            _core.set_torch_reader(installed.reader if use == "reader" else None)
            dtype = order.choice([torch.float32, torch.float16])
            n = order.choice([1000, 4096, 2048 + 7])
            off = order.choice([0, 0, 1, 3, 16])
            base = torch.randn(n + off, device="cuda", dtype=dtype)
            x = base[off:]  # a view: its data pointer is the storage's plus the offset
            y = torch.randn(2 * n, device="cuda", dtype=dtype)[::2].contiguous()
            y = order.choice([y, torch.nn.Parameter(y, requires_grad=False), y.as_subclass(Sub)])
            out = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
            k[grid](x, y, out, n, BLOCK=BLOCK)
            torch.cuda.synchronize()
            want = x + y  # torch's own add: correctly rounded, as the kernel's
            assert torch.equal(out, want), f"call {i} ({use}, {dtype}, n={n}, offset {off}, {type(y).__name__})"
            args = (x, y, out, n, BLOCK)
            assert passed_pointers(k, args) == [x.data_ptr(), y.data_ptr(), out.data_ptr()], f"call {i}"
    finally:
        if installed is not None:
            _core.set_torch_reader(installed.reader)
    host = torch.zeros(16)
    with pytest.raises(TypeError, match="argument y: the tensor is on cpu"):
        k[grid](x, host, out, 16, BLOCK=BLOCK)


@pytest.mark.parametrize("stubs", ["off", "sync"], ids=["table-driven", "generated"])
def test_cupy_arrays_in_one_process(cache_dir, monkeypatch, stubs):
    cp = pytest.importorskip("cupy")
    monkeypatch.setenv("LAZYTRITON_STUB_BUILD", stubs)
    k = lazytriton.kernel(basic.add_kernel)
    order = random.Random(25)
    for i in range(40):
        dtype = order.choice([cp.float32, cp.float16])
        n = order.choice([1000, 4096, 2048 + 7])
        off = order.choice([0, 0, 1, 5, 32])
        x = cp.random.standard_normal(n + off, dtype=cp.float32).astype(dtype)[off:]
        y = cp.random.standard_normal(n, dtype=cp.float32).astype(dtype)
        out = cp.full(n, cp.nan, dtype)
        k[grid](x, y, out, n, BLOCK=BLOCK)
        cp.cuda.get_current_stream().synchronize()
        want = x + y
        assert bool(cp.array_equal(out, want)), f"call {i} ({dtype}, n={n}, offset {off})"
        assert passed_pointers(k, (x, y, out, n, BLOCK)) == [x.data.ptr, y.data.ptr, out.data.ptr], f"call {i}"
    stubgen.wait_for_builds(300)
