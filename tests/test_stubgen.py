"""Generated C++ launch stubs: built with the runtime's own command (stubgen.load_stub),
loaded, and called without a GPU. A stub's launch(handle, grid, stream, args) returns
the call key while nothing is resolved, and None for arguments of another shape:
the runtime relies on None to pick or build another stub, so a stub that accepted a
wrong argument would launch a kernel with it."""
import math
import os
import struct
import subprocess
import sys
import time

import pytest

from lazytriton import _core
from lazytriton.runtime import native, stubgen
from lazytriton.model.arrays import DTYPE_IDS, DeviceArray, constexpr_index
from lazytriton.model.specialize import Shape, Slot

MASK = 2**64 - 1

# Every slot kind, with and without specialization and key values. Annotated
# ints as the runtime makes them (never keyed on == 1), and one keyed anyway.
ALL_KINDS = Shape(
    names=("x", "y", "n", "big", "huge", "n_nospec", "n_noalign", "n_key", "a_i8", "a_u16", "a_u32", "a_i64_key",
           "a_i32_nospec", "a_u8_eq1", "alpha", "alpha_key", "h", "bh", "f32", "f64_key", "flag", "flag_key",
           "b1", "b1_key", "C"),
    slots=(Slot("ptr", dtype=DTYPE_IDS["bf16"]), Slot("ptr", dtype=DTYPE_IDS["fp8e4nv"], specialize=False),
           Slot("int", int_type="i32"), Slot("int", int_type="i64"), Slot("int", int_type="u64"),
           Slot("int", int_type="i32", specialize=False, divisibility=False),
           Slot("int", int_type="i32", divisibility=False), Slot("int", int_type="i32", in_key=True),
           Slot("int", int_type="i8", annotated=True, specialize=False),
           Slot("int", int_type="u16", annotated=True, specialize=False),
           Slot("int", int_type="u32", annotated=True, specialize=False),
           Slot("int", int_type="i64", annotated=True, specialize=False, in_key=True),
           Slot("int", int_type="i32", annotated=True, specialize=False, divisibility=False),
           Slot("int", int_type="u8", annotated=True),
           Slot("float"), Slot("float", in_key=True),
           Slot("float", float_type="fp16", annotated=True), Slot("float", float_type="bf16", annotated=True),
           Slot("float", float_type="fp32", annotated=True),
           Slot("float", float_type="fp64", annotated=True, in_key=True),
           Slot("bool"), Slot("bool", in_key=True),
           Slot("bool", annotated=True), Slot("bool", annotated=True, in_key=True),
           Slot("constexpr")))
GOOD = dict(x=DeviceArray(0x7F0000000000, "bf16", 256), y=DeviceArray(0x7F0000000008, "fp8e4nv", 256), n=16,
            big=2**40, huge=2**63 + 1, n_nospec=16, n_noalign=16, n_key=1000, a_i8=-7, a_u16=1, a_u32=32,
            a_i64_key=-2**62, a_i32_nospec=16, a_u8_eq1=1, alpha=0.5, alpha_key=-1.25, h=0.1, bh=-3.3, f32=2.5,
            f64_key=1 / 3, flag=True, flag_key=True, b1=True, b1_key=False, C=128)


def args_of(**override) -> tuple:
    return tuple({**GOOD, **override}[n] for n in ALL_KINDS.names)


def constexpr_words(v) -> list[int]:
    if v is None:
        return [1, 0]
    if isinstance(v, bool):
        return [2, int(v)]
    if isinstance(v, int) and -2**63 <= v < 2**63:
        return [3, v & MASK]
    if isinstance(v, float):
        return [4, struct.unpack("<Q", struct.pack("<d", v))[0]]
    return [5, constexpr_index(v)]  # anything else: its value's index in the process's table


def reference_key(shape: Shape, args: tuple) -> tuple:
    """The documented key layout, computed in Python: 2 bits per argument from word 0,
    then one word per keyed value and two per constexpr, in argument order, then
    the shape's word."""
    words = [0] * shape.key_words()
    vw = (2 * len(shape.slots) + 63) // 64
    for i, (s, v) in enumerate(zip(shape.slots, args)):
        w, sh = (2 * i) // 64, (2 * i) % 64
        if s.kind == "ptr" and s.specialize:
            words[w] |= int(v.ptr % 16 == 0) << sh
        if s.kind == "int" and not isinstance(v, bool):  # a bool given to an annotated int: no bits
            words[w] |= (int(s.specialize and v == 1) | int(s.divisibility and v % 16 == 0) << 1) << sh
        if s.in_key:
            words[vw] = (int(v) & MASK if s.kind in ("int", "bool")
                         else struct.unpack("<Q", struct.pack("<d", float(v)))[0])
            vw += 1
        if s.kind == "constexpr":
            words[vw:vw + 2] = constexpr_words(v)
            vw += 2
    words[-1] = shape.shape_word()
    return tuple(words)


@pytest.fixture(scope="module")
def stub_cache(tmp_path_factory):
    """The ALL_KINDS stub, built once into this module's own cache."""
    d = tmp_path_factory.mktemp("ltcache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAZYTRITON_CACHE_DIR", str(d))
        # Another test module may have loaded this shape's stub from its own cache.
        mp.delitem(native._loaded, f"lt_stub_{ALL_KINDS.digest()}", raising=False)
        module = stubgen.load_stub(ALL_KINDS)
    return d, module


@pytest.fixture
def stub(stub_cache):
    module = stub_cache[1]
    handle = _core.ResolveTable("all_kinds")
    return lambda *args, grid=(1,): module.launch(handle.handle, grid, 0, args)


def test_built_with_the_runtime_command_and_cached(stub_cache):
    cache_dir, module = stub_cache
    name = f"lt_stub_{ALL_KINDS.digest()}"
    built = list(cache_dir.glob(f"stubs/*/{name}*.so"))
    assert len(built) == 1, built
    assert (built[0].parent / f"{name}.cc").read_text() == stubgen.generate(ALL_KINDS, name)
    assert not list(cache_dir.glob("stubs/*/*.tmp")), "no temporary left behind"
    assert module.key_words == ALL_KINDS.key_words() == 1 + 6 + 2 + 1


@pytest.mark.parametrize("override", [
    {}, dict(x=DeviceArray(0x7F0000000004, "bf16", 2)), dict(n=1), dict(n=-2**31), dict(n=2**31 - 1),
    dict(big=-2**63), dict(big=2**31), dict(huge=2**64 - 1), dict(huge=2**63), dict(n_nospec=1),
    dict(n_key=-5), dict(a_i8=-128), dict(a_i8=127), dict(a_u16=65535), dict(a_u32=2**32 - 1),
    dict(a_i64_key=2**63 - 1), dict(alpha_key=math.inf), dict(alpha_key=-0.0), dict(flag=False, flag_key=False),
    dict(C=None), dict(C=False), dict(C=-3), dict(C=2.5), dict(C="relu"), dict(C=("a", 1)),
    dict(n_noalign=1), dict(n_noalign=32), dict(a_i8=16), dict(a_i8=True), dict(a_u16=False), dict(a_u16=0),
    dict(a_i64_key=True), dict(a_i32_nospec=1), dict(a_i32_nospec=True), dict(a_u8_eq1=16), dict(a_u8_eq1=True),
    dict(h=2), dict(h=True), dict(h=math.inf), dict(bh=7), dict(f32=-1), dict(f64_key=3), dict(f64_key=False),
    dict(b1=1), dict(b1=0), dict(b1=-5), dict(b1_key=7), dict(b1_key=True),
], ids=repr)
def test_key_follows_the_documented_layout(stub, override):
    args = args_of(**override)
    assert stub(*args) == reference_key(ALL_KINDS, args)


@pytest.mark.parametrize("override", [
    dict(x=DeviceArray(0x7F0000000000, "fp16", 256)),   # wrong dtype
    dict(y=DeviceArray(0x7F0000000000, "fp8e5", 256)),  # wrong fp8 flavour
    dict(x=0x7F0000000000),                              # an int where an array is expected
    dict(n=2**31), dict(n=-2**31 - 1),                   # out of the i32 class
    dict(n=True), dict(n=16.0), dict(n="16"),            # not an int
    dict(big=5), dict(big=2**63),                        # i64 class: not i32, not u64
    dict(huge=5), dict(huge=-1), dict(huge=2**64),       # u64 class: 2**63 <= v < 2**64
    dict(a_i8=128), dict(a_i8=-129), dict(a_u16=-1), dict(a_u16=65536), dict(a_u32=2**32), dict(a_i64_key=2**63),
    dict(a_i8=1.0), dict(a_u16="1"), dict(a_i64_key=None),   # annotated ints: ints (or bools) only
    dict(alpha=1), dict(alpha=True), dict(alpha_key="0.5"),  # unannotated floats must be floats
    dict(h="0.5"), dict(h=None), dict(h=1e6), dict(h=10**400), dict(f64_key=10**400),  # not a number or no fit
    dict(flag=1), dict(flag_key=None),                   # unannotated bools must be bools
    dict(b1=1.0), dict(b1=None), dict(b1_key=2**63),      # tl.int1: a bool or an int in 64 bits
], ids=repr)
def test_rejects_arguments_of_another_shape(stub, override):
    assert stub(*args_of(**override)) is None


def test_params_have_the_size_of_their_parameter_type(stub_cache):
    # What the stub passes to cuLaunchKernelEx: one C value per kernel parameter,
    # of the size of Slot.param_type() (what LazyKernel.resolve reports).
    packed = stub_cache[1].params(args_of())
    sizes = {"u1": 1, "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}
    for name, s, b in zip(ALL_KINDS.names, ALL_KINDS.slots, packed):
        t = s.param_type()
        if t == "constexpr":
            assert b is None
        else:
            assert len(b) == (8 if t.startswith("*") else sizes.get(t) or int(t[1:]) // 8), (name, t)
    assert packed[0] == (0x7F0000000000).to_bytes(8, "little")
    assert stub_cache[1].params(args_of(n="16")) is None


def test_rejects_wrong_argument_count_and_container(stub, stub_cache):
    args = args_of()
    assert stub(*args[:-1]) is None
    assert stub(*args, 0) is None
    handle = _core.ResolveTable("all_kinds")
    launch = stub_cache[1].launch
    assert launch(handle.handle, (1,), 0, list(args)) is None  # the runtime always passes a tuple
    with pytest.raises(TypeError, match="launch"):
        launch(handle.handle, (1,), args)


# A second process builds the same stub while the first one is building it.
CHILD = r"""
import logging, sys, time
from pathlib import Path
from lazytriton.model.specialize import Shape, Slot
from lazytriton.runtime.stubgen import load_stub
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
shape = eval(sys.argv[1], {"Shape": Shape, "Slot": Slot})
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.005)
print("key_words", load_stub(shape).key_words)
"""


def test_two_processes_build_the_same_stub(cache_dir, tmp_path):
    shape = Shape(("x", "n", "BLOCK"), (Slot("ptr", dtype=DTYPE_IDS["fp32"]), Slot("int", int_type="i64"),
                                        Slot("constexpr")))
    go = tmp_path / "go"
    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(cache_dir)}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, repr(shape), str(tmp_path / f"ready{i}"), str(go)],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()  # both start building at once
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert f"key_words {shape.key_words()}" in out
    # The flock: one process compiled, the other waited and loaded its result.
    assert sum("building launch stub" in out for out, _ in outs) == 1, outs
    assert len(list(cache_dir.glob("stubs/*/lt_stub_*.so"))) == 1
    assert not list(cache_dir.glob("stubs/*/*.tmp"))
    # And this process loads it without building.
    module = stubgen.load_stub(shape)
    handle = _core.ResolveTable("k")
    # x aligned (bit 0), n % 16 == 0 (bit 3), then the constexpr's (int tag, value), then the shape's word.
    assert module.launch(handle.handle, (1,), 0, (DeviceArray(0x1000, "fp32", 4), 2**40, 64)) == \
        (0b1001, 3, 64, shape.shape_word())


def test_background_builds_run_their_compiler_niced(cache_dir, tmp_path, monkeypatch):
    """A stub built while the table-driven one serves the calls (stub_now) must
    not take CPU from the candidates' compile that a first call waits for: its
    compiler runs niced. A build the caller waits for (load_stub) does not."""
    log = tmp_path / "nice.log"
    cxx = tmp_path / "cxx"
    cxx.write_text(f'#!/bin/sh\nnice >> "{log}"\nexec c++ "$@"\n')
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    background = Shape(("x", "n"), (Slot("ptr", dtype=DTYPE_IDS["fp32"]), Slot("int", int_type="i32")))
    waited = Shape(("y", "m"), (Slot("ptr", dtype=DTYPE_IDS["fp16"]), Slot("int", int_type="i64")))
    for shape in (background, waited):
        monkeypatch.delitem(native._loaded, f"lt_stub_{shape.digest()}", raising=False)
    assert stubgen.stub_now(background) is not None  # the table-driven stub, at once
    stubgen.wait_for_builds(120)
    stubgen.load_stub(waited)
    base = os.nice(0)
    assert [int(v) for v in log.read_text().split()] == [min(base + 10, 19), base]
