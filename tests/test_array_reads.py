"""How the launch stubs read an array argument's attributes (array_reads.h
read_attr): once per type they look the attribute's getter up and then call
it directly (a C getter, a C slot, a C method taking no arguments), as the
array libraries' own C types are read; anything else (a Python property or
method, an instance attribute) is read through getattr. These tests check that
both stubs read the same values as getattr does, that the attribute is really
read on every call (a value is never kept), and that a plan is dropped when the
type changes (its version tag) or an instance attribute may shadow a method.
Runs on the CPU: the arrays sit at made-up addresses; nothing launches."""
import json
import os
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest

import lazytriton
from lazytriton.runtime import stubgen

from kernels import basic

BASE = 0x7F0000000000
HERE = Path(__file__).resolve().parent


@pytest.fixture(params=["table-driven", "generated"])
def stub_of(request, cache_dir):
    """stub_of(k, args): the stub of `args`' argument shape, of either kind."""
    def make(k, args):
        shape = k._shape(args)
        return stubgen.generic_stub(shape) if request.param == "table-driven" else stubgen.load_stub(shape)
    return make


def pointers(stub, args) -> list[int] | None:
    params = stub.params(args)
    return None if params is None else [struct.unpack("<Q", p)[0] for p in params[:3]]


def call(kind, dtype="float32", n=16):
    arrays = tuple(kind(BASE + i * 0x10000, dtype) for i in range(3))
    return (*arrays, n, 1024)


@pytest.mark.parametrize("kind, reads_per_array", [("GetSetArray", 3), ("MemberArray", 1), ("MethodArray", 2),
                                                   ("CythonArray", 3)])
def test_c_attributes_are_read_on_every_call(native_arrays, stub_of, kind, reads_per_array):
    cls = getattr(native_arrays, kind)
    k = lazytriton.kernel(basic.add_kernel)
    args = call(cls)
    stub = stub_of(k, args)
    pointers(stub, args)  # the first read of each attribute plans it (Python classifies the type too)
    for _ in range(3):  # later reads call the attribute's getter directly
        before = native_arrays.reads()
        assert pointers(stub, args) == [BASE, BASE + 0x10000, BASE + 0x20000]
        # Every C getter and method ran (a C slot counts no read): nothing was kept from an earlier call.
        assert native_arrays.reads() - before == 3 * reads_per_array
    assert stub.key(call(cls, "float16")) is None  # another dtype: another shape
    other = call(cls)
    assert pointers(stub, other) == [BASE, BASE + 0x10000, BASE + 0x20000] and stub.key(other) == stub.key(args)


def test_a_type_with_its_own_lookup_is_read_through_it(native_arrays, stub_of):
    """OverridingArray's C tp_getattro answers float16 for dtype, whatever the getter says: getattr's
    answer, so no fp32 stub takes it."""
    cls = native_arrays.OverridingArray
    assert cls.__getattribute__ is not object.__getattribute__
    assert native_arrays.CythonArray.__getattribute__ is object.__getattribute__  # as for CuPy's classes
    k = lazytriton.kernel(basic.add_kernel)
    args = call(cls)
    assert args[0].dtype == "float16"
    stub = stub_of(k, args)  # the shape of what getattr reads: float16 pointers
    fp32 = stub_of(k, call(native_arrays.GetSetArray))
    for _ in range(3):
        assert pointers(stub, args) == [BASE, BASE + 0x10000, BASE + 0x20000]
        assert fp32.key(args) is None


def test_a_changed_type_is_read_afresh(native_arrays, stub_of):
    class Sub(native_arrays.GetSetArray):
        pass

    k = lazytriton.kernel(basic.add_kernel)
    args = call(Sub)
    stub = stub_of(k, args)
    assert pointers(stub, args) == [BASE, BASE + 0x10000, BASE + 0x20000]
    Sub.dtype = property(lambda self: "float16")  # the type changes: its plans go stale
    assert stub.key(args) is None and stub.params(args) is None
    del Sub.dtype
    assert pointers(stub, args) == [BASE, BASE + 0x10000, BASE + 0x20000]
    Sub.data = property(lambda self: types.SimpleNamespace(ptr=self.__class__.moved))
    Sub.moved = 0x7E0000000000
    assert pointers(stub, args) == [0x7E0000000000] * 3
    Sub.moved = 0x7D0000000000  # a Python property is read every call too
    assert pointers(stub, args) == [0x7D0000000000] * 3
    del Sub.data
    assert pointers(stub, args) == [BASE, BASE + 0x10000, BASE + 0x20000]


def test_an_instance_attribute_shadows_a_c_method(native_arrays, stub_of):
    class Sub(native_arrays.MethodArray):  # instances have a __dict__
        pass

    k = lazytriton.kernel(basic.add_kernel)
    args = call(Sub)
    stub = stub_of(k, args)
    assert pointers(stub, args) == [BASE, BASE + 0x10000, BASE + 0x20000]
    args[1].data_ptr = lambda: 0x7C0000000000  # as getattr would find it
    assert pointers(stub, args) == [BASE, 0x7C0000000000, BASE + 0x20000]


def test_slots_of_a_python_class(stub_of):
    class Slotted:  # __slots__ are C slots (CPython's member getters) of a Python class
        __slots__ = ("dtype", "data", "__cuda_array_interface__")

        def __init__(self, ptr, dtype):
            self.dtype, self.data, self.__cuda_array_interface__ = dtype, types.SimpleNamespace(ptr=ptr), {}

    k = lazytriton.kernel(basic.add_kernel)
    args = call(Slotted)
    stub = stub_of(k, args)
    for _ in range(2):
        assert pointers(stub, args) == [BASE, BASE + 0x10000, BASE + 0x20000]
    args[0].dtype = "float16"
    assert stub.key(args) is None
    del args[0].dtype  # an empty slot: AttributeError, as getattr raises: not this shape
    assert stub.key(args) is None


class InterfaceOnly:
    """An array known by its __cuda_array_interface__ alone, no .dtype (README: such objects are taken)."""

    def __init__(self, ptr, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": (16,), "typestr": typestr, "data": (ptr, False), "version": 3}


class InterfaceProperty:
    """The same, its interface made anew on every read (as Numba's is): new dicts, new strings."""

    def __init__(self, ptr, typestr="<f4"):
        self.ptr, self.typestr = ptr, typestr

    @property
    def __cuda_array_interface__(self):
        return {"shape": (16,), "typestr": "".join(self.typestr), "data": (self.ptr, False), "version": 3}


@pytest.mark.parametrize("cls", [InterfaceOnly, InterfaceProperty])
def test_an_interface_without_dtype_is_read_by_its_typestr(stub_of, cls):
    k = lazytriton.kernel(basic.add_kernel)
    args = (cls(BASE), cls(BASE + 0x10000), cls(BASE + 0x20000), 16, 1024)
    assert k._shape(args) == k._shape(call(lambda p, d: lazytriton.model.arrays.DeviceArray(p, "fp32", 64)))
    stub = stub_of(k, args)
    for _ in range(3):  # the first read finds no .dtype; later ones read the interface at once
        assert pointers(stub, args) == [BASE, BASE + 0x10000, BASE + 0x20000]
    half = (cls(BASE, "<f2"), *args[1:])
    assert stub.key(half) is None and k._shape(half) != k._shape(args)  # another dtype: another shape
    with pytest.raises(TypeError, match=r"kernel add_kernel, argument x: unsupported dtype '>f4'"):
        k._shape((cls(BASE, ">f4"), *args[1:]))  # big-endian: no GPU reads it as fp32


LAUNCH_INTERFACE_ONLY = """
import json, sys
sys.path.insert(0, {tests!r})
import lazytriton
from test_array_reads import InterfaceOnly, InterfaceProperty
from kernels import basic
k = lazytriton.kernel(basic.add_kernel)
for cls in (InterfaceOnly, InterfaceProperty, InterfaceOnly):
    x, y, out = (cls(0x7F0000000000 + i * 0x10000) for i in range(3))
    k[(1,)](x, y, out, 16, BLOCK=16)
print(json.dumps(lazytriton.stats()["resolves"]))
"""


@pytest.mark.parametrize("build", ["off", "sync"])
def test_an_interface_without_dtype_launches(fake_driver, tmp_path, build):
    """Through the recording stand-in driver: the first call (table-driven stub), then the
    stub of the build mode, hand the driver the interfaces' addresses."""
    log = tmp_path / "launches.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYTRITON_")}
    env.update(LD_LIBRARY_PATH=str(fake_driver), TRITON_LIBCUDA_PATH=str(fake_driver), FAKE_CUDA_LOG=str(log),
               LAZYTRITON_CACHE_DIR=str(tmp_path / "cache"),
               TRITON_CACHE_DIR=str(tmp_path / "triton"), LAZYTRITON_STUB_BUILD=build,
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    r = subprocess.run([sys.executable, "-c", LAUNCH_INTERFACE_ONLY.format(tests=str(HERE))], env=env,
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == 1  # one specialization, resolved once
    launches = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(launches) == 3
    for launch in launches:
        ptrs = [int.from_bytes(bytes.fromhex(p), "little") for p in launch["params"][:3]]
        assert ptrs == [BASE, BASE + 0x10000, BASE + 0x20000], launch
