"""The table-driven stub (lazytriton._generic_stub) serves a shape's first calls
while its generated stub builds: it must give the same call key, the same
parameter bytes and the same refusals as the generated stub, for every slot kind.
Checked against the real generated stub (built with g++), no GPU needed."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lazytriton import _core
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DTYPE_IDS, DeviceArray
from lazytriton.model.specialize import Shape, Slot

from test_stubgen import ALL_KINDS, args_of

HERE = Path(__file__).resolve().parent

CASES = [
    {}, dict(x=DeviceArray(0x7F0000000004, "bf16", 2)), dict(n=1), dict(n=-2**31), dict(big=-2**63),
    dict(huge=2**64 - 1), dict(n_nospec=1), dict(n_key=-5), dict(a_i8=-128), dict(a_u16=65535),
    dict(a_u32=2**32 - 1), dict(a_i64_key=2**63 - 1), dict(alpha_key=-0.0), dict(flag=False, flag_key=False),
    dict(C=None), dict(C=2.5), dict(C="relu"), dict(a_i8=True), dict(a_u8_eq1=True), dict(h=2), dict(h=True),
    dict(bh=7), dict(f32=-1), dict(f64_key=3), dict(b1=-5), dict(b1_key=7),
    # refused by both (another shape): None from key, params and launch
    dict(n=2**31), dict(big=5), dict(a_i8=128), dict(a_u16=-1), dict(h=1e6), dict(x=DeviceArray(1 << 20, "fp16", 2)),
    dict(flag=1), dict(alpha=1), dict(b1=1.5), dict(huge=-1),
]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path_factory.mktemp("ltcache")))
        return stubgen.load_stub(ALL_KINDS), stubgen.generic_stub(ALL_KINDS)


@pytest.mark.parametrize("override", CASES, ids=repr)
def test_same_key_params_and_refusals_as_the_generated_stub(both, override):
    built, generic = both
    args = args_of(**override)
    assert generic.key(args) == built.key(args)
    assert generic.params(args) == built.params(args)
    handle = _core.ResolveTable("all_kinds")
    assert generic.launch(handle.handle, (1,), 0, args) == built.launch(handle.handle, (1,), 0, args)


def test_wrong_count_and_container(both):
    built, generic = both
    args = args_of()
    for bad in (args[:-1], args + (1,), list(args), ()):
        assert generic.key(bad) is None and built.key(bad) is None
    assert generic.key_words == built.key_words == ALL_KINDS.key_words()


def test_stub_now_serves_the_table_driven_stub_then_the_built_one(tmp_path, monkeypatch):
    """No compiler on the caller's path: the first call gets the table-driven stub at
    once, the generated one is built in the background and handed over."""
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path))
    shape = Shape(("p", "n"), (Slot("ptr", dtype=DTYPE_IDS["fp32"]), Slot("int", int_type="i32", in_key=True)))
    args = (DeviceArray(0x7F0000000000, "fp32", 64), 4096)
    got = []
    first = stubgen.stub_now(shape, got.append)
    assert type(first).__name__ == "Stub"
    stubgen.wait_for_builds(120)
    assert len(got) == 1 and got[0].key(args) == first.key(args) and got[0].params(args) == first.params(args)
    assert stubgen.stub_now(shape) is got[0]


def test_stub_refuses_a_table_beyond_its_stack_storage():
    """A launch keeps a call's values on the stack, in arrays of fixed size: a
    table that would not fit them is refused when the stub is made, never overrun."""
    from lazytriton import _generic_stub

    n = 513
    shape = Shape(tuple(f"a{i}" for i in range(n)), (Slot("int", int_type="i32"),) * n)
    with pytest.raises(ValueError, match="513 slots .* at most 512"):
        _generic_stub.Stub(shape.names, shape.table(), shape.key_words(), shape.shape_word())
    wide = Shape(tuple(f"a{i}" for i in range(512)), (Slot("int", int_type="i32"),) * 512)
    assert stubgen.generic_stub(wide).key_words == wide.key_words()
    with pytest.raises(ValueError, match="key_words does not match"):
        _generic_stub.Stub(wide.names, wide.table(), wide.key_words() + 1, wide.shape_word())


def test_steady_state_launch_allocates_nothing(fake_driver, tmp_path):
    """A resolved call through the table-driven stub makes no C++ allocation
    (issue 24): fake_cuda/alloc_probe.py launches 2,000 times through each stub
    with fake_cuda/count_new.cc preloaded, which counts every operator new
    (a std::vector per call would count 2,000 or more). Constructing a stub,
    which does allocate, shows that the counter sees the stub's allocations."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    shim = tmp_path / "count_new.so"
    subprocess.run([cxx, "-shared", "-fPIC", "-O1", "-std=c++17", "-o", str(shim),
                    str(HERE / "fake_cuda" / "count_new.cc")], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver), TRITON_LIBCUDA_PATH=str(fake_driver),
               FAKE_CUDA_LOG=str(tmp_path / "launches.jsonl"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               LAZYTRITON_CACHE_DIR=str(tmp_path / "lazytriton"), LD_PRELOAD=str(shim), COUNT_NEW_LIB=str(shim),
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    out = tmp_path / "allocs.json"
    r = subprocess.run([sys.executable, str(HERE / "fake_cuda" / "alloc_probe.py"), str(out)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    got = json.loads(out.read_text())
    assert got["launches"] == 2000
    for case in ("add_kernel", "add_pair"):
        assert got[case]["control"] > 0, got  # the counter sees the stub's own allocations
        assert got[case]["generic"] == 0, got
        assert got[case]["generated"] == 0, got
