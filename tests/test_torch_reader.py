"""The torch tensor reader (csrc/python/torch_reader.cc, lazytriton.runtime.torch_reader):
built at run time against the installed torch's own headers, it answers what
torch's Python getters answer (dtype, is_cuda, data_ptr()) for exact tensors and
parameters, and declines what the getters might answer differently (a tensor
subclass, an active torch function mode), so that the stubs fall back to them.
On the CPU with a CPU build of torch: every tensor here is a host tensor, which a
stub must refuse; tests/test_gpu_array_reads.py reads CUDA tensors."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import lazytriton  # noqa: E402
from lazytriton import _core  # noqa: E402
from lazytriton.runtime import native, stubgen, torch_reader  # noqa: E402
from lazytriton.model.arrays import DeviceArray  # noqa: E402

from kernels import basic  # noqa: E402


@pytest.fixture(scope="module")
def reader():
    try:
        module = torch_reader.load()
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"the torch reader did not build: {exc}")
    if module is None:
        pytest.skip("the torch reader could not be built here (see the warning logged)")
    return module


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool, torch.uint8]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_answers_what_the_getters_answer(reader, dtype):
    t = torch.zeros(8, dtype=dtype)
    for x in (t, t[2:], t[::2], torch.nn.Parameter(t.float(), requires_grad=False), t.requires_grad_(False)):
        assert reader.read(x) == (x.dtype, x.is_cuda, None, None)  # a host tensor: no pointer, no device
        assert reader.read(x)[0] is x.dtype  # torch's own dtype object (the stubs key dtypes by identity)


def test_declines_what_the_getters_might_answer_differently(reader):
    class Sub(torch.Tensor):
        pass

    t = torch.zeros(4)
    assert reader.read(t.as_subclass(Sub)) is None  # a subclass may override the getters

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Mode():
        assert reader.read(t) is None  # the mode sees the getters
    assert reader.read(t) == (t.dtype, False, None, None)
    for other in (None, 3, 2.5, object(), DeviceArray(0x1000, "fp32", 4), [t]):
        assert reader.read(other) is None


def test_installed_for_the_stubs(reader, cache_dir):
    assert _core.torch_reader_installed()
    k = lazytriton.kernel(basic.add_kernel)
    x = DeviceArray(0x7F0000000000, "fp32", 4096)
    shape = k._shape((x, x, x, 16, 1024))
    host = torch.zeros(1024)
    for stub in (stubgen.generic_stub(shape), stubgen.load_stub(shape)):
        assert stub.key((x, host, x, 16, 1024)) is None  # host memory: not this signature (Python names it)
    with pytest.raises(TypeError, match="kernel add_kernel, argument y: the tensor is on cpu, not on a CUDA device"):
        k[(1,)](x, host, x, 16, BLOCK=1024)


def test_one_build_per_torch_and_toolchain(reader, tmp_path):
    """The reader is cached like a stub (native.py): a later process loads it, compiling nothing.
    Checked in the cache this process's reader was built in, which need not be the one set now:
    an earlier test of this process may have loaded it under its own cache directory (a GPU test's
    first call on CUDA tensors requests it), and a process loads it once."""
    name = torch_reader.module_name()
    so = Path(reader.__file__)  # <cache>/stubs/<toolchain tag>/<name><EXT_SUFFIX>
    assert native.loaded(name) is reader and so.name.startswith(name + ".")
    code = ("import lazytriton.runtime.torch_reader as r, lazytriton.runtime.native as n, lazytriton._core as c; "
            "assert n.built_and_intact(r.module_name()); r.load(); assert c.torch_reader_installed(); "
            "print(r.module_name())")
    # cwd outside the checkout: the process imports the installed package.
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=str(so.parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == name
