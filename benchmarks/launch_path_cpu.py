"""Host cost of lazytriton's Python launch path with no GPU: the driver is the
recording stand-in of the tests (tests/fake_cuda/fake_cuda.c) in its `discard`
mode, so cuLaunchKernelEx costs next to nothing and what is timed is everything
lazytriton does around it. For finding where a launch's host time goes, change
by change, without a GPU; the figures that count are the harness's launch table
on a GPU (benchmarks/launch_overhead.py), where the driver's own cost is added.

    python benchmarks/launch_path_cpu.py [--calls N] [--rounds R]

Rows (ns per call, median of R rounds of N calls, the same vector add as the
harness's launch table: three arrays, an int and BLOCK=):
  - a Python loop calling a C function with the same arguments (the floor any
    Python launcher pays);
  - k[grid](x, y, out, n, BLOCK=, stream=) on arrays of a C type read as CuPy's
    are (dtype, .data.ptr and .data.device_id through C getters), and on Python
    objects (the same attributes; and a data_ptr() method, which says no device:
    its pointers get Triton's driver check on each launch, as in Triton's
    launcher), through the generated stub and through the table-driven one
    (LAZYTRITON_STUB_BUILD=off).
Torch's rows need a GPU (a CPU tensor is not launchable).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(calls: int, rounds: int) -> None:
    sys.path.insert(0, os.environ["LT_NATIVE_DIR"])
    from lt_native import Array, noop

    import lazytriton
    from lazytriton.bench.kernels import add
    from lazytriton.runtime import stubgen

    class Mem:
        def __init__(self, ptr):
            self.ptr, self.device_id = ptr, 0

    class CupyLike:  # read as CuPy is: dtype, then .data.ptr
        __cuda_array_interface__ = {}

        def __init__(self, ptr):
            self.dtype = "float32"
            self.data = Mem(ptr)

    class DataPtrLike:  # read through a data_ptr() method
        def __init__(self, ptr):
            self.dtype = "float32"
            self._p = ptr

        def data_ptr(self):
            return self._p

    base = 0x7F0000000000
    n, block, grid, stream = 1024, 1024, (1,), 0
    rows = {}

    def time_it(call) -> float:
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                call()
            samples.append((time.perf_counter_ns() - t0) / calls)
        return statistics.median(samples)

    arrays = {"C arrays read as CuPy's": [Array(base + i * 4096, "float32") for i in range(3)],
              "Python objects (.data.ptr)": [CupyLike(base + i * 4096) for i in range(3)],
              "Python objects (data_ptr())": [DataPtrLike(base + i * 4096) for i in range(3)]}
    x, y, out = arrays["C arrays read as CuPy's"]
    # The floor: the same call spelled against a C function that takes keywords and does nothing.
    rows["Python loop calling a C no-op (floor)"] = time_it(lambda: noop(x, y, out, n, BLOCK=block, stream=stream))
    for label, (x, y, out) in arrays.items():
        k = lazytriton.kernel(add)
        k[grid](x, y, out, n, BLOCK=block, stream=stream)
        stubgen.wait_for_builds(300)
        k[grid](x, y, out, n, BLOCK=block, stream=stream)
        rows[f"k[grid](...), {label}, generated stub"] = time_it(
            lambda: k[grid](x, y, out, n, BLOCK=block, stream=stream))
        os.environ["LAZYTRITON_STUB_BUILD"] = "off"
        kg = lazytriton.kernel(add)
        kg[grid](x, y, out, n, BLOCK=block, stream=stream)
        os.environ.pop("LAZYTRITON_STUB_BUILD")
        rows[f"k[grid](...), {label}, table-driven stub"] = time_it(
            lambda: kg[grid](x, y, out, n, BLOCK=block, stream=stream))
    width = max(map(len, rows))
    for name, ns in rows.items():
        print(f"{name:{width}s}  {ns:8.1f} ns")


NATIVE_C = r"""
#include <Python.h>
// noop(*args, **kwargs): the floor, a C function taking the launch's call.
static PyObject* noop(PyObject* self, PyObject* const* args, Py_ssize_t n, PyObject* kw) { Py_RETURN_NONE; }

// Array(ptr, dtype): an array read as CuPy's is (dtype, then .data.ptr and .data.device_id), through C
// getters as CuPy's Cython attributes are; Array.data is a Mem whose getters `ptr` and `device_id`
// (a MemoryPointer's device, as CuPy's) make a new int each read. Both
// look attributes up as Cython's classes do (their own copy of the generic lookup, installed after
// the type is ready).
typedef struct { PyObject_HEAD unsigned long long ptr; } Mem;
typedef struct { PyObject_HEAD PyObject* dtype; PyObject* data; } Array;
static PyObject* mem_ptr(PyObject* o, void* c) { return PyLong_FromUnsignedLongLong(((Mem*)o)->ptr); }
static PyObject* mem_device_id(PyObject* o, void* c) { return PyLong_FromLong(0); }
static PyGetSetDef mem_getset[] = {{"ptr", mem_ptr, NULL, NULL, NULL}, {"device_id", mem_device_id, NULL, NULL, NULL},
                                   {NULL}};
static PyTypeObject MemType = {PyVarObject_HEAD_INIT(NULL, 0) "lt_native.Mem", sizeof(Mem)};
static PyObject* array_dtype(PyObject* o, void* c) { return Py_NewRef(((Array*)o)->dtype); }
static PyObject* array_data(PyObject* o, void* c) { return Py_NewRef(((Array*)o)->data); }
static PyObject* array_cai(PyObject* o, void* c) { return PyDict_New(); }
static PyGetSetDef array_getset[] = {{"dtype", array_dtype, NULL, NULL, NULL}, {"data", array_data, NULL, NULL, NULL},
                                     {"__cuda_array_interface__", array_cai, NULL, NULL, NULL}, {NULL}};
static PyObject* array_new(PyTypeObject* t, PyObject* args, PyObject* kw) {
  unsigned long long ptr; PyObject* dtype;
  if (!PyArg_ParseTuple(args, "KO", &ptr, &dtype)) return NULL;
  Array* a = (Array*)t->tp_alloc(t, 0);
  Mem* m = (Mem*)MemType.tp_alloc(&MemType, 0);
  if (!a || !m) return NULL;
  m->ptr = ptr; a->dtype = Py_NewRef(dtype); a->data = (PyObject*)m;
  return (PyObject*)a;
}
static void array_dealloc(PyObject* o) { Py_XDECREF(((Array*)o)->dtype); Py_XDECREF(((Array*)o)->data); Py_TYPE(o)->tp_free(o); }
static PyTypeObject ArrayType = {PyVarObject_HEAD_INIT(NULL, 0) "lt_native.Array", sizeof(Array)};
static PyObject* cython_getattro(PyObject* o, PyObject* name) { return PyObject_GenericGetAttr(o, name); }

static PyMethodDef methods[] = {{"noop", (PyCFunction)(void (*)(void))noop, METH_FASTCALL | METH_KEYWORDS, ""},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "lt_native", NULL, -1, methods};
PyMODINIT_FUNC PyInit_lt_native(void) {
  MemType.tp_flags = Py_TPFLAGS_DEFAULT; MemType.tp_getset = mem_getset; MemType.tp_new = NULL;
  ArrayType.tp_flags = Py_TPFLAGS_DEFAULT; ArrayType.tp_getset = array_getset; ArrayType.tp_new = array_new;
  ArrayType.tp_dealloc = array_dealloc;
  if (PyType_Ready(&MemType) < 0 || PyType_Ready(&ArrayType) < 0) return NULL;
  MemType.tp_getattro = ArrayType.tp_getattro = cython_getattro;
  PyObject* m = PyModule_Create(&def);
  if (m) PyModule_AddObjectRef(m, "Array", (PyObject*)&ArrayType);
  return m;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.calls, a.rounds)
        return 0
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("needs a C compiler (to build the stand-in driver)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", f"{d}/libcuda.so.1",
                        str(ROOT / "tests" / "fake_cuda" / "fake_cuda.c")], check=True)
        import sysconfig

        Path(d, "native.c").write_text(NATIVE_C)
        subprocess.run([cc, "-shared", "-fPIC", "-O2", f"-I{sysconfig.get_paths()['include']}", "-o",
                        f"{d}/lt_native{sysconfig.get_config_var('EXT_SUFFIX')}", f"{d}/native.c"], check=True)
        env = dict(os.environ, LD_LIBRARY_PATH=d, LT_NATIVE_DIR=d, TRITON_LIBCUDA_PATH=d, FAKE_CUDA_LOG="discard",
                   LAZYTRITON_CACHE_DIR=f"{d}/cache", TRITON_CACHE_DIR=f"{d}/triton",
                   TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
        return subprocess.run([sys.executable, __file__, "--child", "--calls", str(a.calls), "--rounds",
                               str(a.rounds)], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
