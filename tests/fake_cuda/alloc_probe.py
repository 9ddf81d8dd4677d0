"""Run by tests/test_generic_stub.py in a process whose libcuda.so.1 is
fake_cuda.c and with count_new.cc preloaded: installs a compiled kernel's
entry, warms a stub up, then counts the C++ allocations (operator new) of
many steady-state launches through the table-driven stub and through the
generated one. Prints one JSON object: {"name": {"generic": n,
"generated": n, "control": n}, "launches": n}; control is the count of constructing a
table-driven stub (which does allocate), proof that the counter sees the
stubs' allocations."""
import ctypes
import json
import os
import sys
from pathlib import Path

from triton.backends.compiler import GPUTarget

import lazytriton
from lazytriton import _core, _generic_stub
from lazytriton.compile.compiler import Binder, compile_one
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DeviceArray

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernels import basic, tuple_kernels  # noqa: E402

count = ctypes.CDLL(os.environ["COUNT_NEW_LIB"]).lt_new_count
count.restype = ctypes.c_long
LAUNCHES = 2000
X = DeviceArray(0x7F0000000000, "fp32", 4096)
# A flat call, and one with nested tuple arguments (the path walk) and a float.
CASES = {"add_kernel": (basic.add_kernel, (X, X, X, 4096, 256)),
         "add_pair": (tuple_kernels.add_pair, ((X, (X, 2.5)), X, 4096, 256))}


def entry_for(k, shape, args):
    """The call's entry, compiled for the fake sm_90 and installed by hand (as a C++ embedder does).
    One is_param per slot (a tuple's leaves are parameters); no int here is 1, so only constexprs drop out."""
    target = GPUTarget("cuda", 90, 32)
    binary = compile_one(k.spec, target, Binder(k.spec, target).bind(args, {}))
    return _core.Entry(_core.Kernel(binary.cubin, binary.metadata), [s.kind != "constexpr" for s in shape.slots], {})


def steady_news(stub, handle, args) -> int:
    for _ in range(10):
        assert stub.launch(handle, (4,), 0, args) is True
    before = count()
    for _ in range(LAUNCHES):
        stub.launch(handle, (4,), 0, args)
    return count() - before


out = {"launches": LAUNCHES}
for name, (fn, args) in CASES.items():
    k = lazytriton.kernel(fn)
    shape = k._shape(args)
    generic = stubgen.generic_stub(shape)
    generated = stubgen.load_stub(shape)
    holder = _core.ResolveTable(name)
    key = generic.launch(holder.handle, (4,), 0, args)
    assert isinstance(key, tuple) and key == generated.launch(holder.handle, (4,), 0, args)
    holder.install(list(key), entry_for(k, shape, args))
    out[name] = {"generic": steady_news(generic, holder.handle, args),
                 "generated": steady_news(generated, holder.handle, args)}
    before = count()
    _generic_stub.Stub(shape.names, shape.table(), shape.key_words(), shape.shape_word(),
                       *(() if shape.flat else (shape.args, shape.paths, shape.tuples)))
    out[name]["control"] = count() - before
Path(sys.argv[1]).write_text(json.dumps(out))
